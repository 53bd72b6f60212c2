"""`ChunkGraphs` on the CPU, with each CUDA graph emulated: what a capture freezes stays frozen, data flows as in a
replay.

A real capture records the program's kernels with the Python values of that moment (the program's arguments, every
int its code read) and replays them on whatever its static inputs and buffers then hold. The emulation keeps exactly
that: it binds the program and its static inputs at capture, and a replay runs that program again on them (its
Python sees the capture's values, its tensors today's data) and copies the result into the captured output. So a
forward that hid changing data in Python (a ring slot as an int) replays stale on the CPU as it would on a GPU, and
the pool, the static copies and the capture/replay bookkeeping run unchanged.
"""

from __future__ import annotations

import torch

from telefuser.models.lingbot_world_v2.graphs import ChunkGraphs, _Captured


class _EmulatedGraph:
    def __init__(self, program, data):
        self.program, self.data = program, data
        self.output: torch.Tensor | None = None

    def replay(self) -> None:
        out = self.program(self.data)
        if out is not None:
            self.output.copy_(out)


class EmulatedGraphs(ChunkGraphs):
    def takes(self, device: torch.device) -> bool:
        return True

    def _capture(self, data, program) -> _Captured:
        graph = _EmulatedGraph(program, data)
        out = program(data)  # a real capture runs nothing; this run rewrites the eager call's rows with the same data
        graph.output = None if out is None else out.clone()
        self.captures += 1
        return _Captured(graph, graph.output)
