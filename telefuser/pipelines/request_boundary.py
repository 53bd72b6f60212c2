"""What a pipeline does on every rank where one request ends and the next begins."""

from __future__ import annotations


def reset_parallel(dit) -> bool:
    """Reset the DiT's Ulysses transport (`UlyssesOwner.reset_parallel`, collective), so that a request after one that
    failed on the copy engine runs on it again. A DiT without one (a stand-in, a dense run) has nothing to reset."""
    reset = getattr(dit, "reset_parallel", None)
    return bool(reset()) if callable(reset) else False
