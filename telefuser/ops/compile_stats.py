"""How much compiled code a piece of work runs: compiled-function calls and torch.compile graph compilations.

Every call into compiled code made through `ops.fusion.cuda_fused` or `ops.regions.compiled_region` is counted here
(each costs the host a dynamo guard check and an AOT wrapper, whatever it computes), and dynamo's own counter says
how many graphs were compiled. Benches and tests read both around a forward or a session:

    with count_compiled() as stats:
        model.forward_chunk(...)
    stats.calls, stats.compiles       # compiled-function calls; graphs compiled (first compiles and recompiles)

Counting is process-wide and cheap (one integer per call); nested counters each see everything inside them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

_lock = threading.Lock()
_calls = [0]


def note_compiled_call() -> None:
    """Called by the wrappers each time they enter compiled code (never while tracing)."""
    with _lock:
        _calls[0] += 1


def compiled_calls() -> int:
    """Compiled-function calls made through the wrappers since the process started."""
    return _calls[0]


def graphs_compiled() -> int:
    """Graphs torch.compile has compiled in this process (dynamo's ``unique_graphs``: each first compilation of a
    function and each recompilation adds one; a graph break would add more)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass
class CompileStats:
    """What ran inside a `count_compiled` block; filled in when the block exits."""

    calls: int = 0
    compiles: int = 0


@contextlib.contextmanager
def count_compiled() -> Iterator[CompileStats]:
    stats = CompileStats()
    calls, compiles = compiled_calls(), graphs_compiled()
    try:
        yield stats
    finally:
        stats.calls = compiled_calls() - calls
        stats.compiles = graphs_compiled() - compiles
