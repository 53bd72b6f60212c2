"""Running out of device memory during one request: what the services say, and freeing the cache after.

An OOM fails the request that ran into it, not the process: the service tells the client what ran out and what to
change, frees the allocator's cache, and serves the next request (serving/README.md).
"""

from __future__ import annotations

FIRST_LINE_CHARS = 400  # torch's line goes on about the allocator's reserve; the server log has all of it

# What an operator can change, per service (the client's own choices come first in each message).
VIDEO_ADVICE = (
    "ask for a smaller size or fewer seconds (fewer frames); the server can leave more room with --offload block or "
    "a larger --gpu-memory-gb, use --quantization fp8, or run on more GPUs (torchrun with --ulysses-degree)"
)
STREAM_ADVICE = (
    "ask for a smaller resolution; the server can leave more room with fewer --max-sessions, --offload block or a "
    "larger --gpu-memory-gb, use --quantization fp8, or run on more GPUs (torchrun with --ulysses-degree)"
)


def is_out_of_memory(exc: BaseException) -> bool:
    import torch  # torch>=2.5 names it here for every device (torch.cuda.OutOfMemoryError is the same class)

    return isinstance(exc, torch.OutOfMemoryError)


def what_ran_out(exc: BaseException) -> str:
    """The exception's first line: torch names the device and how much was asked for there."""
    lines = str(exc).strip().splitlines()
    first = lines[0].strip() if lines else type(exc).__name__
    return first if len(first) <= FIRST_LINE_CHARS else first[:FIRST_LINE_CHARS].rstrip() + "..."


def out_of_memory_message(exc: BaseException, advice: str, *, where: str = "") -> str:
    """The client's message: out of memory<where>: <what ran out>. To fit, <advice>."""
    first = what_ran_out(exc)
    return f"out of memory{where}: {first}{'' if first.endswith('.') else '.'} To fit, {advice}."


def free_cached_memory() -> None:
    """Hand the allocator's cached blocks back to the device, once the failed request's tensors are gone (call it
    after leaving the `except` block: the exception's traceback holds their frames)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
