"""`UlyssesCommunicator`: the one object a model's attention blocks talk to; they say what to move, it decides how.

It validates each call, agrees new call signatures and the configuration across ranks, picks the transport once
(copy engine when every rank is eligible, else portable), and keeps the failure state that `reset()` clears. The
rule: a difference confined to one rank never leaves a peer waiting (the README's "The communicator" says how).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from ..agreement import describe_disagreement, first_error
from .control import ControlChannel
from .copy_engine import CopyEngineOptions, UlyssesCaptureError
from .factory import create_copy_engine
from .handles import TaggedGroup, UlyssesHandle, UlyssesProtocolError
from .layout import (
    Direction,
    UlyssesInputError,
    UlyssesLayout,
    check_all_gather,
    check_gather,
    check_scatter,
    plan_all_gather,
    plan_gather,
    plan_scatter,
    readable_layout,
)
from .peer_mapping import CopyEngineSetupError, short_error
from .portable import PortableBackend, UlyssesGroupOutOfStepError
from .primitives import UlyssesTimeoutError
from .selection import TRANSPORTS, agreed_candidates

log = logging.getLogger(__name__)

VERIFY_MODES = ("new", "always")
_MAX_AGREED_SIGNATURES = 4096
_MAX_PLANS = 1024
_PLANNERS = {
    Direction.SCATTER: (check_scatter, plan_scatter),
    Direction.GATHER: (check_gather, plan_gather),
    Direction.ALL_GATHER: (check_all_gather, plan_all_gather),
}
_SETTING_SOURCES = {
    "transport": "transport= or TELEFUSER_ULYSSES_TRANSPORT",
    "verify": "verify= or TELEFUSER_ULYSSES_VERIFY",
    "timeout_s": "CopyEngineOptions.timeout_s or TELEFUSER_ULYSSES_TIMEOUT_S",
}


class UlyssesTransportError(RuntimeError):
    """The transport failed; the communicator refuses calls until `reset()`."""


class UlyssesConfigError(RuntimeError):
    """Ranks disagree on a setting of the communicator; raised identically on every rank."""


def config_disagreement(configs: list[dict]) -> str | None:
    """None when every rank has the same configuration, else each differing setting with each rank's value."""
    problems = []
    for key in sorted({k for c in configs for k in c}):
        values = [c.get(key) for c in configs]
        if any(v != values[0] for v in values):
            source = _SETTING_SOURCES.get(key, f"CopyEngineOptions.{key}")
            problems.append(f"{key} ({source}): " + ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values)))
    return "ranks disagree on the Ulysses configuration: " + "; ".join(problems) if problems else None


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
        verify: str | None = None,
        transport: str | None = None,
        options: CopyEngineOptions | None = None,
        mapping_factory=None,
    ):
        """`transport`: "auto" (default; copy engine on eligible CUDA groups), "portable", "ce-symm", "ce-ipc", or
        "host-shm" (the copy-engine protocol over CPU shared memory). Also read from TELEFUSER_ULYSSES_TRANSPORT.
        Control exchanges go through the default process group's store (bounded by `options.timeout_s`), so they
        never need a CPU group of their own."""
        if not dist.is_initialized():
            raise RuntimeError(
                "UlyssesCommunicator needs torch.distributed to be initialized (see telefuser.distributed.mesh)"
            )
        self.group = group if group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        verify = verify or os.environ.get("TELEFUSER_ULYSSES_VERIFY", "new")
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        self.verify = verify
        transport = transport or os.environ.get("TELEFUSER_ULYSSES_TRANSPORT", "auto")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.requested_transport = transport
        self.options = options or CopyEngineOptions()
        self._config = {"transport": transport, "verify": verify, **self.options.protocol()}
        self._channel = ControlChannel(self.group, self.options.timeout_s)
        self._mapping_factory = mapping_factory
        self._portable = PortableBackend(self.group, self.options.timeout_s)
        self._scatter_backend = None  # chosen at the first eligible scatter; holds until reset()
        self.fallback_reasons: dict[str, str] = {}
        self._failure: str | None = None
        self._fell_back = False  # an agreed setup failure moved scatters to portable: reset() retries the copy engine
        self._out_of_step = False  # a portable collective timed out: the process group's order is broken
        self._pending: TaggedGroup | None = None
        self._group_backend = None  # the backend the pending group runs on
        self._epoch = 0
        self._agreed: set[tuple] = set()
        self._plans: dict[tuple, tuple[UlyssesLayout, bool]] = {}
        self._closed = False
        self._generation = 0  # bumped whenever a copy-engine transport is released: graphs captured before are stale

    # -- public surface ------------------------------------------------------------------------------------------
    @property
    def transport(self) -> str:
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

    @property
    def generation(self) -> int:
        """Changes whenever the copy-engine transport (its buffers and flags) is released, by `reset()`, a fallback
        or `close()`. A CUDA graph captured around this communicator replays into that transport's buffers: discard
        it and capture again when the generation it was captured at is gone."""
        return self._generation

    @property
    def failure(self) -> str | None:
        """Why this rank's communicator refuses calls until `reset()`, or None."""
        return self._failure

    def scatter_heads(self, x: torch.Tensor, *, tag: str | None = None, barrier: bool = True) -> UlyssesHandle:
        """Start moving ``[B, S_local, H, D]`` to ``[B, S_global, H/W, D]``."""
        x, plan = self._validated(Direction.SCATTER, x, tag=tag, barrier=barrier, op="scatter_heads")
        return self._submit(x, plan, tag, barrier)

    def gather_heads(self, y: torch.Tensor) -> UlyssesHandle:
        """Start moving ``[B, S_global, H_local, D]`` back to ``[B, S_local, H_local*W, D]`` (a group of one)."""
        y, plan = self._validated(Direction.GATHER, y, tag=None, barrier=True, op="gather_heads")
        return self._submit(y, plan, None, True)

    def gather_rows(self, x: torch.Tensor) -> UlyssesHandle:
        """Start gathering every rank's rows ``[B, S_local, C]`` into ``[B, W*S_local, C]``, in rank order, on every
        rank (a group of one): the sequence gather after a model's last block."""
        x, plan = self._validated(Direction.ALL_GATHER, x, tag=None, barrier=True, op="gather_rows")
        return self._submit(x.unsqueeze(2), plan, None, True, finish=lambda out: out.squeeze(2))

    def reset(self) -> bool:
        """Collective, at a request boundary (every rank calls it at the same point, with no group pending on
        purpose): after a failure on any rank, drop the pending group, release the copy-engine transport once every
        rank has quiesced, and select again at the next scatter. Returns whether anything was reset; when every rank
        is healthy it is one small exchange and changes nothing. Raises `UlyssesTimeoutError` when a peer does not
        reach it within the timeout, and `UlyssesTransportError` on every rank when a timed-out portable collective
        left the process group out of step (then only restarting the processes helps)."""
        if self._closed:
            raise RuntimeError("reset: this UlyssesCommunicator is closed")
        backend = self._scatter_backend if self._scatter_backend is not self._portable else None
        local_error = None
        if backend is not None:
            try:
                backend.quiesce_local()  # this rank's copies into its peers are finished before anyone releases
            except Exception as exc:
                local_error = short_error(exc)
        state = {
            "config": self._config,
            "failure": self._failure,
            "pending": self._pending is not None,
            "fell_back": self._fell_back,
            "out_of_step": self._out_of_step,
            "quiesce_error": local_error,
        }
        try:
            states = self._channel.resync(state, "reset")
        except UlyssesTimeoutError as exc:
            self._fail(str(exc))
            raise
        disagreement = config_disagreement([s["config"] for s in states])
        if disagreement:
            raise UlyssesConfigError(disagreement)
        broken = [r for r, s in enumerate(states) if s["out_of_step"]]
        if broken:
            message = (
                f"reset: ranks {broken} abandoned a collective of the process group after its timeout; the group's "
                "collective order is out of step and cannot be repaired in place: restart the processes"
            )
            self._failure = message
            raise UlyssesTransportError(message)
        if not any(s["failure"] or s["pending"] or s["fell_back"] or s["quiesce_error"] for s in states):
            return False
        if backend is not None:  # every rank synchronized its own copies before the exchange above
            backend.close(agreed=not any(s["quiesce_error"] for s in states))
            self._generation += 1
        self._scatter_backend = self._group_backend = self._pending = None
        self._failure = None
        self._fell_back = False
        self._agreed.clear()
        self.fallback_reasons.clear()
        self._channel.clear_failure()
        reasons = "; ".join(f"rank {r}: {s['failure']}" for r, s in enumerate(states) if s["failure"]) or "a fallback"
        log.warning("Ulysses communicator reset on every rank after: %s", reasons)
        return True

    def close(self) -> None:
        """Release backends and drop any pending group. Local only: no collective. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._pending = None
        backend, self._scatter_backend = self._scatter_backend, None
        if backend is not None and backend is not self._portable:
            backend.close()
            self._generation += 1
        self._portable.close()

    def __enter__(self) -> UlyssesCommunicator:
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

    def _plan_for(self, x, direction: Direction) -> tuple[torch.Tensor, UlyssesLayout]:
        """The input as the copies will read it (packed once when its layout needs it) and its plan; raises
        UlyssesInputError for a value the exchange cannot move. Cached per (shape, strides, dtype)."""
        check, planner = _PLANNERS[direction]
        if not isinstance(x, torch.Tensor) or torch.compiler.is_compiling():
            check(x, self.world_size)
            x, _ = readable_layout(x, self.world_size, direction)
            return x, planner(x, self.world_size)
        key = (direction, x.shape, x.stride(), x.dtype)
        cached = self._plans.get(key)
        if cached is None:
            check(x, self.world_size)
            readable, problem = readable_layout(x, self.world_size, direction)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            cached = self._plans[key] = (planner(readable, self.world_size), problem is not None)
        plan, pack = cached
        return (x.contiguous() if pack else x), plan

    def _validated(self, direction, x, *, tag, barrier, op) -> tuple[torch.Tensor, UlyssesLayout]:
        if self._closed:
            raise RuntimeError(f"{op}: this UlyssesCommunicator is closed")
        if self._failure is not None:
            raise UlyssesTransportError(
                f"{op}: this UlyssesCommunicator failed earlier (reset() reopens it): {self._failure}"
            )
        plan, error = None, self._sequence_error(op, tag, barrier)
        if error is None:
            try:
                x, plan = self._plan_for(x, direction)
            except UlyssesInputError as exc:
                error = str(exc)
        if self.world_size > 1 and not torch.compiler.is_compiling():
            device = x.device.type if isinstance(x, torch.Tensor) else None
            captured = isinstance(x, torch.Tensor) and self._capturing(x)  # every rank must capture, or none
            error = self._agree(op, tag, barrier, plan, (device, captured), error)
        if error is not None:
            raise UlyssesInputError(error)
        return x, plan

    def _agree(self, op, tag, barrier, plan, device, error) -> str | None:
        signature = (op, tag, barrier, plan.signature() if plan is not None else None, device)
        if error is None and self.verify == "new" and signature in self._agreed:
            return None
        try:
            views = self._channel.gather((self._config, signature, error), f"the agreement of a {op} call")
        except UlyssesTimeoutError as exc:
            self._fail(str(exc))
            raise
        disagreement = config_disagreement([c for c, _, _ in views])
        if disagreement:
            raise UlyssesConfigError(disagreement)
        agreed_error = first_error([e for _, _, e in views])
        if agreed_error is None:
            agreed_error = describe_disagreement(f"the {op} call", [s for _, s, _ in views])
        if agreed_error is None:
            if len(self._agreed) >= _MAX_AGREED_SIGNATURES:
                self._agreed.clear()
            self._agreed.add(signature)
        return agreed_error

    # -- submission ------------------------------------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        """This rank refuses calls until reset(); the peers it may leave waiting can read why."""
        self._failure = message
        self._channel.post_failure(message)

    def _transfer_failed(self, exc: Exception) -> None:
        if isinstance(exc, UlyssesGroupOutOfStepError):
            self._out_of_step = True
        if isinstance(exc, UlyssesTimeoutError):
            self._fail(str(exc))

    def _capturing(self, x: torch.Tensor) -> bool:
        """Whether this call is recorded into a graph: a CUDA graph capture, or a host capture of the host-shm
        transport (tests)."""
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return True
        backend = self._scatter_backend
        return backend is not None and backend is not self._portable and backend.capturing(x)

    def _backend_for(self, x: torch.Tensor, direction: Direction):
        """The backend for this call. The first eligible call selects the transport, collectively and agreed;
        gathers run on it only where the portable path cannot run on the device (or `options.gather` says so)."""
        if self.world_size == 1 or torch.compiler.is_compiling():
            return self._portable
        cuda_capture = x.is_cuda and torch.cuda.is_current_stream_capturing()
        if self._scatter_backend is None:
            if cuda_capture:
                raise UlyssesCaptureError(
                    "the Ulysses transport is chosen, collectively and with device synchronisation, at the first "
                    "eager call; run the same calls once eagerly (a warm-up) before capturing them"
                )
            self._scatter_backend = self._select(x.device)
        backend = self._scatter_backend
        eligible = backend is not self._portable and x.device.type == ("cpu" if backend.name == "host-shm" else "cuda")
        if eligible and direction is not Direction.SCATTER:
            gather = self.options.gather
            eligible = gather == "copy-engine" or (gather == "auto" and not self._portable.can_capture(x.device))
        if eligible:
            return backend
        if cuda_capture and not self._portable.can_capture(x.device):
            raise UlyssesCaptureError(
                f"{direction.value} under CUDA graph capture on a {dist.get_backend(self.group)} group with "
                f"transport {backend.name}: the portable path stages device tensors through the host there, which a "
                "graph cannot record; capture needs the copy engine (tf-kernel, same-host peers) or an NCCL group"
            )
        return self._portable  # an ineligible call; the transport stays selected for eligible ones

    def _select(self, device: torch.device):
        candidates, excluded = agreed_candidates(
            self.requested_transport, device, self._channel, self.options.flag_bits
        )
        self.fallback_reasons.update(excluded)
        for name in candidates:
            try:
                return create_copy_engine(name, self._channel, self.group, device, self.options, self._mapping_factory)
            except CopyEngineSetupError as exc:  # raised on every rank together
                self.fallback_reasons[name] = str(exc)
                log.warning("Ulysses transport %s unavailable, trying the next one: %s", name, exc)
        if self.requested_transport not in ("auto", "portable"):
            log.warning(
                "Ulysses transport %s was asked for but is unavailable: %s",
                self.requested_transport,
                self.fallback_reasons,
            )
        return self._portable

    def _release_agreed(self, backend) -> None:
        """Close a copy-engine backend at an agreed point: every rank quiesces, then all meet, then all release."""
        error = None
        try:
            backend.quiesce_local()
        except Exception as exc:
            error = short_error(exc)
        try:
            agreed = self._channel.agree(error, "release of the copy-engine buffers") is None
        except UlyssesTimeoutError:
            backend.close(agreed=False)
            raise
        backend.close(agreed=agreed)

    def _fall_back(self, backend, reason: str) -> None:
        self.fallback_reasons[backend.name] = reason
        log.warning(
            "Ulysses %s failed before any group started; every rank falls back to portable: %s", backend.name, reason
        )
        self._fell_back = True
        self._scatter_backend = self._portable
        self._generation += 1
        try:
            self._release_agreed(backend)
        except UlyssesTimeoutError as exc:
            self._fail(str(exc))
            raise

    def _submit(
        self, x: torch.Tensor, plan: UlyssesLayout, tag: str | None, barrier: bool, finish=None
    ) -> UlyssesHandle:
        captured = self._capturing(x)
        group = self._pending
        if group is None:
            self._epoch += 1
            group = TaggedGroup(epoch=self._epoch, captured=captured)
        group_started = self._pending is not None
        if group_started and group.captured != captured:
            raise UlyssesProtocolError(
                f"{plan.direction.value}(tag={tag!r}): its group {group.tags} started "
                f"{'inside' if group.captured else 'outside'} a graph capture and this call is "
                f"{'inside' if captured else 'outside'} one; a group cannot span the start or end of a capture"
            )
        try:
            backend = self._backend_for(x, plan.direction)
        except UlyssesTimeoutError as exc:
            self._fail(str(exc))
            raise
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
        return UlyssesHandle(transfer, group, tag, lambda: not self._closed, self._transfer_failed, finish)

    def _start(self, backend, x, plan, tag, group_started):
        """Submit on `backend`; returns (transfer, the backend that actually ran it)."""
        try:
            return backend.start(x, plan, tag), backend
        except UlyssesCaptureError:  # the same on every rank; the refused capture is discarded, so is its group
            backend.abandon_group()
            self._pending = None
            raise
        except CopyEngineSetupError as exc:  # agreed: every rank raised it at the same call
            if group_started:
                self._fail(f"{backend.name} setup failed after a grouped transfer started: {exc}")
                raise UlyssesTransportError(self._failure + "; the request cannot safely fall back") from exc
            self._fall_back(backend, str(exc))
            return self._portable.start(x, plan, tag), self._portable
        except UlyssesTimeoutError as exc:
            self._fail(str(exc))
            raise
        except Exception as exc:
            if backend is self._portable:
                raise
            self._fail(f"rank {self.rank}: {backend.name} failed while submitting tag {tag!r}: {short_error(exc)}")
            raise UlyssesTransportError(
                self._failure + "; peers waiting on this rank's part of the group get a timeout error (on a GPU the "
                "watchdog ends them) within timeout_s"
            ) from exc

    def _complete(self, backend, tag) -> None:
        try:
            backend.complete_group()
        except UlyssesTimeoutError as exc:
            self._fail(str(exc))
            raise
        except Exception as exc:
            if backend is self._portable:
                raise
            self._fail(
                f"rank {self.rank}: {backend.name} failed to complete the group at tag {tag!r}: {short_error(exc)}"
            )
            raise UlyssesTransportError(self._failure) from exc


__all__ = [
    "UlyssesCaptureError",
    "UlyssesCommunicator",
    "UlyssesConfigError",
    "UlyssesInputError",
    "UlyssesProtocolError",
    "UlyssesTransportError",
]
