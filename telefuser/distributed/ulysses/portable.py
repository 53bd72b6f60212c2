"""The portable Ulysses transport: one `all_to_all_single` per tensor (NCCL on GPUs, gloo on CPU).

It uses torch's functional collectives, so the same code runs eagerly and inside `torch.compile`. The exchange
buffer is laid out destination-major, ``[W, B, S, Hl, D]`` for scatter, so that chunk p of the flat send buffer is
exactly what peer p needs; the received buffer is ``[W(source), B, S, Hl, D]``, which for B == 1 already *is* the
final ``[B, W*S, Hl, D]`` output and needs no relayout.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .layout import Direction, UlyssesPlan


def _pack(x: torch.Tensor, plan: UlyssesPlan) -> torch.Tensor:
    """Destination-major send buffer: chunk p is what peer p receives."""
    b, s, hl, d, w = plan.batch, plan.local_seq, plan.heads_per_rank, plan.head_dim, plan.world_size
    if plan.direction is Direction.SCATTER:
        # [B, S, W*Hl, D] -> [W, B, S, Hl, D]; one copy, also for strided q/k/v views.
        return x.unflatten(2, (w, hl)).permute(2, 0, 1, 3, 4).contiguous()
    # [B, W*S, Hl, D] -> [W, B, S, Hl, D]; free when B == 1 and x is contiguous.
    return x.unflatten(1, (w, s)).transpose(0, 1).contiguous()


def _unpack(recv: torch.Tensor, plan: UlyssesPlan) -> torch.Tensor:
    """Received buffer [W(source), B, S, Hl, D] -> the final contiguous output."""
    w, b, s, hl, d = plan.world_size, plan.batch, plan.local_seq, plan.heads_per_rank, plan.head_dim
    recv = recv.view(w, b, s, hl, d)
    if plan.direction is Direction.SCATTER:
        return recv.transpose(0, 1).reshape(plan.out_shape)  # a view when B == 1
    return recv.permute(1, 2, 0, 3, 4).reshape(plan.out_shape)  # heads of source p land at slice p


def _group_handles_device(group: dist.ProcessGroup, device: torch.device) -> bool:
    """Whether the group's backend can run a collective on tensors of this device type."""
    backend = str(dist.get_backend(group)).lower()
    if device.type == "cpu":
        return "gloo" in backend or backend.startswith("cpu:") or "mpi" in backend
    return "nccl" in backend or f"{device.type}:" in backend


class PortableTransfer:
    """An `all_to_all_single` in flight; `result()` waits for it and returns the final layout."""

    def __init__(self, pending: torch.Tensor, plan: UlyssesPlan, device: torch.device):
        self._pending = pending
        self._plan = plan
        self._device = device
        self._output: torch.Tensor | None = None

    def result(self) -> torch.Tensor:
        if self._output is None:
            recv = funcol.wait_tensor(self._pending)
            self._output = _unpack(recv, self._plan).to(self._device, non_blocking=True)
            self._pending = None
        return self._output


class PortableBackend:
    """all_to_all_single over the Ulysses group. Stateless apart from the group; nothing to release."""

    name = "portable"

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def start(self, x: torch.Tensor, plan: UlyssesPlan, tag: str | None = None) -> PortableTransfer:
        send = _pack(x, plan)
        if not _group_handles_device(self.group, send.device):
            # A gloo-only group with device tensors (several processes sharing one GPU in tests): stage on the host.
            send = send.cpu()
        recv = funcol.all_to_all_single(send.flatten(), None, None, self.group)
        return PortableTransfer(recv, plan, x.device)

    def complete_group(self) -> None:
        """Each all_to_all completes on its own; a group needs no extra handshake here."""

    def close(self) -> None:
        """Nothing is cached."""
