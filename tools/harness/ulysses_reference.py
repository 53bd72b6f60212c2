"""Rank-wise constructed inputs and expected outputs for Ulysses data-movement tests and the fault matrix.

Every rank's input is reproducible from (seed, rank), so each rank can build the exact output it must receive from
all of its peers' inputs without any communication, and tests compare with `torch.equal`.
"""

from __future__ import annotations

import torch


def rank_input(seed: int, rank: int, shape, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return (torch.randn(*shape, generator=g) * 3 + rank).to(dtype)  # never zeros; differs per rank


def expected_scatter(inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """inputs[p] is rank p's [B, S, H, D]; rank `rank` receives every row of head slice `rank`."""
    w = len(inputs)
    hl = inputs[0].shape[2] // w
    return torch.cat([x[:, :, rank * hl : (rank + 1) * hl] for x in inputs], dim=1)


def expected_gather(inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """inputs[p] is rank p's [B, W*S, Hl, D]; rank `rank` receives rows slice `rank` of every peer's heads."""
    w = len(inputs)
    s = inputs[0].shape[1] // w
    return torch.cat([y[:, rank * s : (rank + 1) * s] for y in inputs], dim=2)


def run_pitched_copy(src: torch.Tensor, dst: torch.Tensor, pc) -> None:
    """Execute one batched 2-D copy (cudaMemcpy2DAsync semantics) on CPU byte views."""
    esize = src.element_size()
    src_bytes = torch.as_strided(src, (src.untyped_storage().nbytes() // esize,), (1,), 0).view(torch.uint8)
    base = src.storage_offset() * esize
    dst_bytes = dst.view(-1).view(torch.uint8)
    for b in range(pc.batch):
        s0 = base + pc.src_offset + b * pc.src_batch_stride
        d0 = pc.dst_offset + b * pc.dst_batch_stride
        rows_src = torch.as_strided(src_bytes, (pc.height, pc.width), (pc.src_pitch, 1), s0)
        rows_dst = torch.as_strided(dst_bytes, (pc.height, pc.width), (pc.dst_pitch, 1), d0)
        rows_dst.copy_(rows_src)


def recording_communicator(group):
    """A UlyssesCommunicator that records the order of its submissions, to check the V-first schedule."""
    from telefuser.distributed.ulysses import UlyssesCommunicator

    class RecordingCommunicator(UlyssesCommunicator):
        def __init__(self, group):
            super().__init__(group)
            self.calls: list[tuple[str, str | None, bool]] = []

        def scatter_heads(self, x, *, tag=None, barrier=True):
            self.calls.append(("scatter", tag, barrier))
            return super().scatter_heads(x, tag=tag, barrier=barrier)

        def gather_heads(self, y):
            self.calls.append(("gather", None, True))
            return super().gather_heads(y)

    return RecordingCommunicator(group)


def misrouting_communicator(group, transport: str | None = None):
    """A UlyssesCommunicator (over `transport`, default its own choice) whose head gather hands each rank its heads
    rolled by one: a wrong exchange, the negative control of the parity tests."""
    from telefuser.distributed.ulysses import UlyssesCommunicator

    class Rolled:
        def __init__(self, handle):
            self.handle = handle

        def wait(self):
            return self.handle.wait().roll(1, dims=2)

    class Misrouting(UlyssesCommunicator):
        def gather_heads(self, y):
            return Rolled(super().gather_heads(y))

    return Misrouting(group, transport=transport)
