"""The portable transport: one `all_to_all_single` per tensor (NCCL on GPUs, gloo on CPU).

Eagerly it runs with a per-operation timeout, so a peer that never joins raises `UlyssesTimeoutError`; under
`torch.compile` or graph capture it uses functional collectives. The buffer is destination-major (no relayout at B=1).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .layout import Direction, UlyssesLayout
from .primitives import UlyssesTimeoutError


class UlyssesGroupOutOfStepError(UlyssesTimeoutError):
    """A collective of the process group was abandoned after its timeout: the group's collective order is broken."""


def _pack(x: torch.Tensor, plan: UlyssesLayout) -> torch.Tensor:
    """Destination-major send buffer: chunk p is what peer p receives."""
    s, hl, w = plan.local_seq, plan.heads_per_rank, plan.world_size
    if plan.direction is Direction.ALL_GATHER:  # every peer gets every row (small: a model's output rows)
        return x.unsqueeze(0).expand(w, *x.shape).contiguous()
    if plan.direction is Direction.SCATTER:
        # [B, S, W*Hl, D] -> [W, B, S, Hl, D]; one copy, also for strided q/k/v views.
        return x.unflatten(2, (w, hl)).permute(2, 0, 1, 3, 4).contiguous()
    # [B, W*S, Hl, D] -> [W, B, S, Hl, D]; free when B == 1 and x is contiguous.
    return x.unflatten(1, (w, s)).transpose(0, 1).contiguous()


def _unpack(recv: torch.Tensor, plan: UlyssesLayout) -> torch.Tensor:
    """Received buffer [W(source), B, S, Hl, D] -> the final contiguous output."""
    w, b, s, hl, d = plan.world_size, plan.batch, plan.local_seq, plan.heads_per_rank, plan.head_dim
    recv = recv.view(w, b, s, hl, d)
    if plan.direction is not Direction.GATHER:
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

    def __init__(self, pending, plan: UlyssesLayout, device: torch.device, work=None, what: str = "", timeout_s=None):
        self._pending = pending
        self._work = work
        self._plan = plan
        self._device = device
        self._what = what
        self._timeout_s = timeout_s
        self._output: torch.Tensor | None = None

    def result(self) -> torch.Tensor:
        if self._output is None:
            if self._work is not None:
                try:
                    self._work.wait()
                except RuntimeError as exc:
                    raise UlyssesGroupOutOfStepError(
                        f"the portable all_to_all of {self._what} did not complete (timeout {self._timeout_s:g}s): a "
                        f"peer died, raised, or runs a different call sequence; the process group is out of step now "
                        f"({str(exc).splitlines()[0][:200]})"
                    ) from exc
                recv = self._pending
            else:
                recv = funcol.wait_tensor(self._pending)
            self._output = _unpack(recv, self._plan).to(self._device, non_blocking=True)
            self._pending = self._work = None
        return self._output


class PortableBackend:
    """all_to_all_single over the Ulysses group. Stateless apart from the group; nothing to release."""

    name = "portable"

    def __init__(self, group: dist.ProcessGroup, timeout_s: float = 600.0):
        self.group = group
        self.timeout_s = timeout_s

    def can_capture(self, device: torch.device) -> bool:
        """Whether a CUDA graph capture can record this exchange (it needs the group's backend on the device)."""
        return _group_handles_device(self.group, device)

    def start(self, x: torch.Tensor, plan: UlyssesLayout, tag: str | None = None) -> PortableTransfer:
        send = _pack(x, plan)
        if not _group_handles_device(self.group, send.device):
            # A gloo-only group with device tensors (several processes sharing one GPU in tests): stage on the host.
            send = send.cpu()
        traced = torch.compiler.is_compiling() or (send.is_cuda and torch.cuda.is_current_stream_capturing())
        if traced:
            recv = funcol.all_to_all_single(send.flatten(), None, None, self.group)
            return PortableTransfer(recv, plan, x.device)
        flat = send.flatten()
        recv = torch.empty_like(flat)
        opts = dist.AllToAllOptions()
        opts.timeout = timedelta(seconds=self.timeout_s)
        work = self.group.alltoall_base(recv, flat, [], [], opts)
        what = f"{plan.direction.value}_heads(tag={tag!r})"
        return PortableTransfer(recv, plan, x.device, work=work, what=what, timeout_s=self.timeout_s)

    def complete_group(self) -> None:
        """Each all_to_all completes on its own; a group needs no extra handshake here."""

    def close(self, agreed: bool = False) -> None:
        """Nothing is cached."""
