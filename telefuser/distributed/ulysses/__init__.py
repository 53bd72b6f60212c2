"""Ulysses sequence parallelism: the communicator, its layout rules and its transports."""

from .communicator import UlyssesCommunicator
from .handles import UlyssesHandle, UlyssesProtocolError
from .layout import UlyssesInputError, UlyssesPlan, plan_gather, plan_scatter

__all__ = [
    "UlyssesCommunicator",
    "UlyssesHandle",
    "UlyssesInputError",
    "UlyssesPlan",
    "UlyssesProtocolError",
    "plan_gather",
    "plan_scatter",
]
