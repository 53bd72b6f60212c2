"""`UlyssesCommunicator`: the one object a model's attention blocks talk to.

A block says *what* to move (scatter these heads, tag "v", defer completion); the communicator decides *how*.
The model owns one communicator and shares it between all of its blocks; `close()` releases everything locally.

Transports. scatter_heads runs on the portable `all_to_all_single` path or, when every rank is eligible, on a
copy-engine transport (pitched copies into peers' cached final-layout buffers, one GPU-side handshake per tagged
group). The choice is made lazily at the first eligible scatter, agreed by all ranks, and is final. A copy-engine setup
failure that every rank sees before a group has started falls back to the portable path on every rank; a failure after
a group started raises, because switching protocols mid-group would break the ranks' collective order. gather_heads
always uses the portable path (it was faster in the seed's measurements).

Agreement. Every call is validated locally, then -- the first time a call signature (operation, tag, barrier, input
shape, dtype) is seen, or on every call with ``verify="always"`` -- all ranks exchange their signature and verdict in
one small collective before any data moves. So a bad input raises the same error on every rank. Repeated signatures
skip the exchange, which keeps a steady-state call at a dictionary lookup; the price is that a program which feeds
ranks *different sequences* of signatures (one rank repeats a shape while another changes it) is caught by the
process group's timeout rather than at once. Set ``TELEFUSER_ULYSSES_VERIFY=always`` to check every call.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from ..agreement import describe_disagreement, first_error, gather_from_ranks
from .copy_engine import CopyEngineOptions
from .factory import create_copy_engine
from .handles import TaggedGroup, UlyssesHandle, UlyssesProtocolError
from .layout import UlyssesInputError, UlyssesPlan, plan_gather, plan_scatter
from .peer_mapping import CopyEngineSetupError
from .portable import PortableBackend
from .primitives import UlyssesTimeoutError
from .selection import TRANSPORTS, agreed_candidates

log = logging.getLogger(__name__)

VERIFY_MODES = ("new", "always")
_MAX_AGREED_SIGNATURES = 4096


class UlyssesTransportError(RuntimeError):
    """The transport failed after a grouped transfer started; the communicator cannot be used any more."""


class _Ready:
    """A finished transfer (world size 1: the exchange is the identity)."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor

    def result(self) -> torch.Tensor:
        return self._tensor


class UlyssesCommunicator:
    """Ulysses head/sequence exchange for one process group.

    scatter_heads: ``[B, S_local, H, D]`` -> ``[B, S_global, H/W, D]``; gather_heads is the inverse. Both return a
    `UlyssesHandle` at once; `handle.wait()` returns the tensor. Calls with ``barrier=False`` (and a tag) join a pending
    group that the next ``barrier=True`` call completes; their handles can only be waited after that.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        control_group: dist.ProcessGroup | None = None,
        verify: str | None = None,
        transport: str | None = None,
        options: CopyEngineOptions | None = None,
        mapping_factory=None,
    ):
        """`transport`: "auto" (default; copy engine on eligible CUDA groups), "portable", "ce-symm", "ce-ipc", or
        "host-shm" (the copy-engine protocol over CPU shared memory). Also read from TELEFUSER_ULYSSES_TRANSPORT."""
        if not dist.is_initialized():
            raise RuntimeError("UlyssesCommunicator needs torch.distributed to be initialized (see telefuser.distributed.mesh)")
        self.group = group if group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self._control_group = control_group if control_group is not None else self.group
        verify = verify or os.environ.get("TELEFUSER_ULYSSES_VERIFY", "new")
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        self.verify = verify
        transport = transport or os.environ.get("TELEFUSER_ULYSSES_TRANSPORT", "auto")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.transport = transport
        self.options = options or CopyEngineOptions()
        self._mapping_factory = mapping_factory
        self._portable = PortableBackend(self.group)
        self._scatter_backend = None  # chosen at the first eligible scatter; final
        self.fallback_reasons: dict[str, str] = {}
        self._failure: str | None = None
        self._pending: TaggedGroup | None = None
        self._group_backend = None  # the backend the pending group runs on
        self._epoch = 0
        self._agreed: set[tuple] = set()
        self._closed = False

    # -- public surface ------------------------------------------------------------------------------------------
    @property
    def backend_name(self) -> str:
        """The transport used for scatter_heads ("portable" until a copy-engine transport has been set up)."""
        return (self._scatter_backend or self._portable).name

    @property
    def scatter_backend(self):
        """The selected scatter backend object, or None before the first scatter (for tests and benches)."""
        return self._scatter_backend

    @property
    def has_pending_group(self) -> bool:
        return self._pending is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def scatter_heads(self, x: torch.Tensor, *, tag: str | None = None, barrier: bool = True) -> UlyssesHandle:
        """Start moving ``[B, S_local, H, D]`` to ``[B, S_global, H/W, D]``."""
        plan = self._validated(plan_scatter, x, tag=tag, barrier=barrier, op="scatter_heads")
        return self._submit(x, plan, tag, barrier)

    def gather_heads(self, y: torch.Tensor) -> UlyssesHandle:
        """Start moving ``[B, S_global, H_local, D]`` back to ``[B, S_local, H_local*W, D]`` (a group of one)."""
        plan = self._validated(plan_gather, y, tag=None, barrier=True, op="gather_heads")
        return self._submit(y, plan, None, True)

    def close(self) -> None:
        """Release backends and drop any pending group. Local only: no collective. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._pending = None
        backend, self._scatter_backend = self._scatter_backend, None
        if backend is not None and backend is not self._portable:
            backend.close()
        self._portable.close()

    def __enter__(self) -> "UlyssesCommunicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # the model owns the communicator; dropping it releases local resources
        try:
            self.close()
        except Exception:
            pass

    # -- validation and agreement ----------------------------------------------------------------------------------
    def _sequence_error(self, op: str, tag, barrier) -> str | None:
        if not isinstance(barrier, bool):
            return f"{op}: barrier must be a bool, got {type(barrier).__name__}"
        if tag is not None and not isinstance(tag, str):
            return f"{op}: tag must be a str or None, got {type(tag).__name__}"
        if not barrier and tag is None:
            return f"{op}: a deferred call (barrier=False) needs a tag, e.g. tag='v'"
        if self._pending is not None:
            if op == "gather_heads":
                return f"gather_heads: complete the pending group {self._pending.tags} (a barrier=True call) first"
            if tag in self._pending.tags:
                return f"{op}: tag {tag!r} is already pending in this group {self._pending.tags}"
        return None

    def _validated(self, planner, x, *, tag, barrier, op) -> UlyssesPlan:
        if self._closed:
            raise RuntimeError(f"{op}: this UlyssesCommunicator is closed")
        if self._failure is not None:
            raise UlyssesTransportError(f"{op}: this UlyssesCommunicator failed earlier and cannot be used: {self._failure}")
        plan, error = None, self._sequence_error(op, tag, barrier)
        if error is None:
            try:
                plan = planner(x, self.world_size)
            except UlyssesInputError as exc:
                error = str(exc)
        if self.world_size > 1 and not torch.compiler.is_compiling():
            device = x.device.type if isinstance(x, torch.Tensor) else None
            error = self._agree(op, tag, barrier, plan, device, error)
        if error is not None:
            raise UlyssesInputError(error)
        return plan

    def _agree(self, op, tag, barrier, plan, device, error) -> str | None:
        signature = (op, tag, barrier, plan.signature() if plan is not None else None, device)
        if error is None and self.verify == "new" and signature in self._agreed:
            return None
        views = gather_from_ranks((signature, error), self._control_group)
        agreed_error = first_error([e for _, e in views])
        if agreed_error is None:
            agreed_error = describe_disagreement(f"the {op} call", [s for s, _ in views])
        if agreed_error is None:
            if len(self._agreed) >= _MAX_AGREED_SIGNATURES:
                self._agreed.clear()
            self._agreed.add(signature)
        return agreed_error

    # -- submission ------------------------------------------------------------------------------------------------
    def _backend_for(self, x: torch.Tensor):
        """The scatter backend for this call. The first eligible call selects it, collectively and agreed."""
        if self.world_size == 1 or torch.compiler.is_compiling():
            return self._portable
        if self._scatter_backend is None:
            self._scatter_backend = self._select(x.device)
        backend = self._scatter_backend
        if backend is not self._portable and x.device.type != ("cpu" if backend.name == "host-shm" else "cuda"):
            return self._portable  # an ineligible call; the transport stays selected for eligible ones
        return backend

    def _select(self, device: torch.device):
        candidates, excluded = agreed_candidates(self.transport, device, self._control_group)
        self.fallback_reasons.update(excluded)
        for name in candidates:
            try:
                return create_copy_engine(name, self.group, device, self.options, self._mapping_factory)
            except CopyEngineSetupError as exc:  # raised on every rank together
                self.fallback_reasons[name] = str(exc)
                log.warning("Ulysses transport %s unavailable, trying the next one: %s", name, exc)
        if self.transport not in ("auto", "portable"):
            log.warning("Ulysses transport %s was asked for but is unavailable: %s", self.transport, self.fallback_reasons)
        return self._portable

    def _fall_back(self, backend, reason: str) -> None:
        self.fallback_reasons[backend.name] = reason
        log.warning("Ulysses %s failed before any group started; every rank falls back to portable: %s", backend.name, reason)
        backend.close()
        self._scatter_backend = self._portable

    def _submit(self, x: torch.Tensor, plan: UlyssesPlan, tag: str | None, barrier: bool) -> UlyssesHandle:
        group = self._pending
        if group is None:
            self._epoch += 1
            group = TaggedGroup(epoch=self._epoch)
        group_started = self._pending is not None
        backend = self._portable if plan.direction.value == "gather" else self._backend_for(x)
        if group_started and backend is not self._group_backend:
            raise UlyssesProtocolError(
                f"scatter_heads(tag={tag!r}) would run on {backend.name} but its group started on "
                f"{self._group_backend.name}; keep every call of a group on the same kind of device and context"
            )
        if self.world_size == 1:
            transfer = _Ready(x.contiguous())
        else:
            transfer, backend = self._start(backend, x, plan, tag, group_started)
        group.tags.append(tag)
        if barrier:
            self._complete(backend, tag)
            group.completed = True
            self._pending = None
        else:
            self._pending = group
            self._group_backend = backend
        return UlyssesHandle(transfer, group, tag, lambda: not self._closed)

    def _start(self, backend, x, plan, tag, group_started):
        """Submit on `backend`; returns (transfer, the backend that actually ran it)."""
        try:
            return backend.start(x, plan, tag), backend
        except CopyEngineSetupError as exc:  # agreed: every rank raised it at the same call
            if group_started:
                self._failure = f"{backend.name} setup failed after a grouped transfer started: {exc}"
                raise UlyssesTransportError(self._failure + "; the request cannot safely fall back") from exc
            self._fall_back(backend, str(exc))
            return self._portable.start(x, plan, tag), self._portable
        except Exception as exc:
            if backend is self._portable:
                raise
            self._failure = f"{backend.name} failed while submitting tag {tag!r}: {exc}"
            raise UlyssesTransportError(
                self._failure + "; peers waiting on this rank's part of the group will time out"
            ) from exc

    def _complete(self, backend, tag) -> None:
        try:
            backend.complete_group()
        except UlyssesTimeoutError as exc:
            self._failure = str(exc)
            raise
        except Exception as exc:
            if backend is self._portable:
                raise
            self._failure = f"{backend.name} failed to complete the group at tag {tag!r}: {exc}"
            raise UlyssesTransportError(self._failure) from exc


__all__ = ["UlyssesCommunicator", "UlyssesInputError", "UlyssesProtocolError", "UlyssesTransportError"]
