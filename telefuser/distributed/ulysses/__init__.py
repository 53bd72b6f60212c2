"""Ulysses sequence parallelism: the communicator, the V-first schedule, the row split, the transports (README.md)."""

from .communicator import UlyssesCommunicator, UlyssesConfigError, UlyssesTransportError
from .copy_engine import UlyssesCaptureError
from .handles import UlyssesHandle, UlyssesProtocolError
from .layout import UlyssesInputError, UlyssesLayout, plan_gather, plan_scatter
from .primitives import UlyssesTimeoutError

__all__ = [
    "UlyssesCaptureError",
    "UlyssesCommunicator",
    "UlyssesConfigError",
    "UlyssesHandle",
    "UlyssesInputError",
    "UlyssesLayout",
    "UlyssesProtocolError",
    "UlyssesTimeoutError",
    "UlyssesTransportError",
    "plan_gather",
    "plan_scatter",
]
