"""Ulysses sequence parallelism: the communicator, its layout rules and its transports."""

from .communicator import UlyssesCommunicator, UlyssesConfigError, UlyssesTransportError
from .handles import UlyssesHandle, UlyssesProtocolError
from .layout import UlyssesInputError, UlyssesPlan, plan_gather, plan_scatter
from .primitives import UlyssesTimeoutError

__all__ = [
    "UlyssesCommunicator",
    "UlyssesConfigError",
    "UlyssesHandle",
    "UlyssesInputError",
    "UlyssesPlan",
    "UlyssesProtocolError",
    "UlyssesTimeoutError",
    "UlyssesTransportError",
    "plan_gather",
    "plan_scatter",
]
