"""The copy-engine exchange: pitched copies straight into peers' cached final-layout buffers, two handshake phases
per group (open: every rank reached the group; close: every copy landed), with constant flag values so that a CUDA
graph replays a captured group exactly and eager and replayed groups mix freely.

The protocol, the output lifetime rule, capture, eviction and the setup probe are in this folder's README.
"""

from __future__ import annotations

import collections
import math
import os
from dataclasses import dataclass, field, fields

import torch

from .layout import Direction, UlyssesLayout, copies_to_all_peers, packed_source, plan_scatter
from .peer_mapping import CopyEngineSetupError, PeerBuffers, PeerMapping, agreed_step, flag_dtype

DEFAULT_TIMEOUT_S = 600.0  # NCCL's default; a GPU backlog or a compile on one rank must not count as a dead peer
OPEN_BANK, CLOSE_BANK = 0, 1
GATHER_CHOICES = (
    "auto",
    "copy-engine",
    "portable",
)  # a group's phases use alternate flag banks, so a rank's consecutive phases alternate


class UlyssesCaptureError(RuntimeError):
    """A call under CUDA graph capture that the copy engine cannot record (raised the same way on every rank, since
    every rank holds the same targets after the same call sequence); the communicator stays usable."""


def _default_timeout() -> float:
    text = os.environ.get("TELEFUSER_ULYSSES_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"TELEFUSER_ULYSSES_TIMEOUT_S must be a number of seconds, got {text!r}") from None


@dataclass
class CopyEngineOptions:
    """Knobs for the transport; the non-default values exist for the A/B bench's ablations and for tests.

    `timeout_s` bounds every wait of the communicator: a control exchange, a portable collective, a handshake (on a
    GPU, the watchdog's clock, which starts when the copy stream reaches the handshake). Default 600 s or
    TELEFUSER_ULYSSES_TIMEOUT_S. Every field but the local ones (`LOCAL_FIELDS`) must be the same on every rank: the
    ranks agree on them before anything moves."""

    max_targets: int = 12
    max_target_bytes: int = 16 << 30  # this rank's cached target buffers (two per key)
    flag_bits: int = 64
    high_priority_stream: bool = True
    cache_targets: bool = True  # False: allocate (collectively) on every call -- what the cache saves
    handshake_per_tensor: bool = False  # True: open and close each call on its own instead of once per group
    pitched: bool = True  # False: pack destination-major on the caller's stream, then flat copies
    handshake: str = "memops"  # "symm_barrier": SymmetricMemory.barrier() (an SM kernel) instead of stream memops
    timeout_s: float = field(default_factory=_default_timeout)
    # Where gather_heads / gather_rows run: "auto" on the copy engine only where the portable path cannot run on
    # the device (a gloo group with CUDA tensors, so also under capture there), else portable; or forced.
    gather: str = "auto"

    LOCAL_FIELDS = ("high_priority_stream", "pitched")  # change nothing a peer can observe

    def __post_init__(self) -> None:
        if self.max_targets < 1:
            raise ValueError(f"max_targets must be >= 1, got {self.max_targets}")
        if self.max_target_bytes < 1:
            raise ValueError(f"max_target_bytes must be >= 1, got {self.max_target_bytes}")
        if self.flag_bits not in (32, 64):
            raise ValueError(f"flag_bits must be 32 or 64, got {self.flag_bits}")
        if self.handshake not in ("memops", "symm_barrier"):
            raise ValueError(f"handshake must be 'memops' or 'symm_barrier', got {self.handshake!r}")
        if self.gather not in GATHER_CHOICES:
            raise ValueError(f"gather must be one of {GATHER_CHOICES}, got {self.gather!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")

    def protocol(self) -> dict:
        """The fields every rank must share."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in self.LOCAL_FIELDS}


@dataclass
class _Target:
    slots: list[PeerBuffers]
    nbytes: int
    uses: int = 0
    copies: dict = field(default_factory=dict)  # (slot, plan, packed) -> the primitives' argument list

    def next_slot(self) -> int:
        slot = self.uses % len(self.slots)
        self.uses += 1
        return slot


@dataclass
class _Completion:
    """Shared by every transfer of one group; the completing call fills it in."""

    event: object = None


@dataclass
class CopyEngineTransfer:
    prims: object
    output: torch.Tensor
    completion: _Completion = field(repr=False)

    def result(self) -> torch.Tensor:
        self.prims.caller_wait(self.completion.event)
        return self.output


def _probe_input(rank: int, world: int, device: torch.device) -> torch.Tensor:
    """[1, 2, W, 4] fp32 values that name their source rank, row and head: never zeros, different on every rank."""
    values = torch.arange(2 * world * 4, dtype=torch.float32).reshape(1, 2, world, 4)
    return (values + 1000.0 * (rank + 1)).to(device)


class CopyEngineBackend:
    def __init__(self, name: str, channel, mapping: PeerMapping, prims, options: CopyEngineOptions, watchdog=None):
        self.channel = channel
        self.rank = channel.rank
        self.world_size = channel.world_size
        self.mapping = mapping
        self.prims = prims
        self.options = options
        self.name = name  # the transport name: "ce-symm", "ce-ipc" or "host-shm"
        self._watchdog = watchdog
        self._targets: collections.OrderedDict[tuple, _Target] = collections.OrderedDict()
        self._target_bytes = 0
        self._group_keys: set[tuple] = set()  # keys used by the pending group: never evicted under it
        self._uncached: list[PeerBuffers] = []  # cache_targets=False: released at the next group's start
        self._captured_keys: set[tuple] = set()  # targets a CUDA graph may replay into: never evicted
        self._pending: _Completion | None = None
        self._phases = 0  # phases issued (eager or captured): each one's token for the watchdog
        self.allocations = 0
        self.evictions = 0
        self.stream = None
        self.marker = prims.new_marker(flag_dtype(options.flag_bits))  # (reached, passed) of the latest phase
        self.flags = mapping.allocate_flags(options.flag_bits)  # collective and agreed: 2 banks x world slots
        if watchdog is not None:
            watchdog.attach(self.marker)
        try:
            if options.handshake == "symm_barrier" and self.flags.handle is None:  # the same answer on every rank
                raise CopyEngineSetupError(f"the symm_barrier handshake needs Symmetric Memory, not {mapping.name}")
            self.stream = agreed_step(
                channel, f"{name}: copy stream", lambda: prims.new_stream(options.high_priority_stream)
            )
            self._probe()
        except BaseException:
            self.close()
            raise

    # -- the backend contract used by UlyssesCommunicator ---------------------------------------------------------
    def capturing(self, x: torch.Tensor) -> bool:
        """Whether this call is being recorded into a graph (a CUDA graph, or a host capture in tests)."""
        return self.prims.capturing()

    def check_capturable(self, plan: UlyssesLayout, tag: str | None, device) -> None:
        """Raise UlyssesCaptureError unless a captured call of this plan can run on what exists: its target was
        allocated by an eager call (allocating and evicting are collective host steps with device synchronisation,
        impossible inside a capture)."""
        if not self.options.cache_targets:
            raise UlyssesCaptureError("the copy engine cannot be captured with cache_targets=False")
        key = self._key(plan, tag, device)
        if key not in self._targets:
            raise UlyssesCaptureError(
                f"{plan.direction.value}(tag={tag!r}, shape={plan.in_shape}, dtype={plan.dtype}) under CUDA graph "
                "capture needs a copy-engine target that no eager call has allocated; run the same calls once "
                "eagerly (a warm-up) before capturing"
            )

    def start(self, x: torch.Tensor, plan: UlyssesLayout, tag: str | None) -> CopyEngineTransfer:
        if self._watchdog is not None and self._watchdog.error is not None:
            raise RuntimeError(f"the handshake watchdog stopped: {self._watchdog.error}")
        captured = self.prims.capturing()
        if captured:
            self.check_capturable(plan, tag, x.device)
        packed = not self.options.pitched and plan.direction is Direction.SCATTER
        buffers, copies = self._target_for(plan, tag, x.device, packed, captured)
        if packed:
            x = packed_source(x, plan)
        opening = self._pending is None or self.options.handshake_per_tensor
        if opening:  # after the caller's stream reached this call: every rank consumed what it received before
            self._phase(OPEN_BANK, ready=True)
        self.prims.submit(x, copies, self.stream, ready=not opening)
        self.prims.protect_input(x, self.stream)
        if self._pending is None:
            self._pending = _Completion()
        transfer = CopyEngineTransfer(self.prims, buffers.local, self._pending)
        if self.options.handshake_per_tensor:
            self._close()
        return transfer

    def complete_group(self) -> None:
        if not self.options.handshake_per_tensor:  # otherwise the group's last call already closed itself
            self._close()
        self._pending = None
        self._group_keys.clear()

    def abandon_group(self) -> None:
        """Forget a group whose capture was refused: nothing of it ever runs (a refused capture is discarded), and
        every rank refuses at the same call."""
        self._pending = None
        self._group_keys.clear()

    def quiesce_local(self) -> None:
        """This rank's copies into its peers are finished, and its own readers of old outputs too."""
        if self.stream is not None:
            self.prims.synchronize(self.stream)
        device = getattr(self.prims, "device", None)
        if device is not None:
            torch.cuda.synchronize(device)

    def close(self, agreed: bool = False) -> None:
        """Release targets and flags; no collective. `agreed`: every rank quiesced and met since (a reset or an
        agreed fallback), so exported memory can be handed back at once; otherwise the mapping keeps what peers
        may still write into (CUDA IPC parks it until exit)."""
        try:
            if self.stream is not None:
                self.prims.synchronize(self.stream)
        finally:
            self._targets.clear()
            self._uncached.clear()
            self._target_bytes = 0
            self.mapping.close(agreed=agreed)
            self.prims.close()
            if self._watchdog is not None:
                self._watchdog.close()

    # -- steps -------------------------------------------------------------------------------------------------------
    @staticmethod
    def _key(plan: UlyssesLayout, tag, device) -> tuple:
        return (tag, plan.direction.value, plan.out_shape, plan.dtype, str(device))

    def _target_for(self, plan: UlyssesLayout, tag, device, packed: bool, captured: bool) -> tuple[PeerBuffers, list]:
        geometries = copies_to_all_peers(plan, self.rank, packed)
        if not self.options.cache_targets:
            if self._pending is None:
                self._release_uncached()
            buffers = self.mapping.allocate(plan.out_shape, plan.dtype)
            self.allocations += 1
            self._uncached.append(buffers)
            return buffers, self.prims.copy_list(buffers.peers, buffers.capacity_bytes, geometries)
        key = self._key(plan, tag, device)
        target = self._targets.get(key)
        if target is None:
            target = self._new_target(key, plan)
        else:
            self._targets.move_to_end(key)
        if captured:
            self._captured_keys.add(key)
        self._group_keys.add(key)
        slot = target.next_slot()
        buffers = target.slots[slot]
        copies = target.copies.get((slot, plan, packed))
        if copies is None:
            copies = target.copies[(slot, plan, packed)] = self.prims.copy_list(
                buffers.peers, buffers.capacity_bytes, geometries
            )
        return buffers, copies

    def _new_target(self, key: tuple, plan: UlyssesLayout) -> _Target:
        nbytes = 2 * math.prod(plan.out_shape) * plan.dtype.itemsize
        if nbytes > self.options.max_target_bytes:  # the same sizes on every rank: the same answer everywhere
            raise CopyEngineSetupError(
                f"one target of {plan.out_shape} needs {nbytes} bytes (two buffers), more than "
                f"max_target_bytes={self.options.max_target_bytes}"
            )
        while self._targets and (
            len(self._targets) >= self.options.max_targets
            or self._target_bytes + nbytes > self.options.max_target_bytes
        ):
            self._evict_one()
        slots = [self.mapping.allocate(plan.out_shape, plan.dtype)]
        try:
            slots.append(self.mapping.allocate(plan.out_shape, plan.dtype))
        except CopyEngineSetupError:
            slots[0].release()  # agreed: every rank failed the second allocation together, nobody wrote the first
            raise
        self.allocations += 2
        target = self._targets[key] = _Target(slots, nbytes)
        self._target_bytes += nbytes
        return target

    def _phase(self, bank: int, ready: bool) -> None:
        """One handshake phase on the copy stream. Its flag values are constants (publish 1, wait for 1, reset to 0);
        what makes a reused bank safe is that a rank's phases alternate banks (open, close, open, ...)."""
        self._phases += 1
        if self.options.handshake == "symm_barrier":  # ablation: the seed's first, slower design (an SM kernel)
            if ready:
                self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                self.flags.handle.barrier(channel=bank)
            return
        self.prims.phase(
            self.flags, self.rank, bank, self.marker, self._phases, self.stream, self.options.flag_bits, ready
        )

    def _close(self) -> None:
        self._phase(CLOSE_BANK, ready=False)  # the group's calls already waited for the caller's stream
        completion = self._pending if self._pending is not None else _Completion()
        completion.event = self.prims.record_completion(self.stream)

    def _probe(self) -> None:
        """One real scatter of known values through this backend, checked on every rank before it is used."""
        device = getattr(self.prims, "device", torch.device("cpu"))
        x = _probe_input(self.rank, self.world_size, device)
        plan = plan_scatter(x, self.world_size)
        buffers = self.mapping.allocate(plan.out_shape, plan.dtype)
        expected = torch.cat(
            [_probe_input(p, self.world_size, "cpu")[:, :, self.rank : self.rank + 1] for p in range(self.world_size)],
            dim=1,
        )

        def transfer_and_check() -> None:
            copies = self.prims.copy_list(buffers.peers, buffers.capacity_bytes, copies_to_all_peers(plan, self.rank))
            self._phase(OPEN_BANK, ready=True)
            self.prims.submit(x, copies, self.stream, ready=False)
            self._pending = _Completion()
            self._close()
            completion, self._pending = self._pending, None
            self.prims.caller_wait(completion.event)
            got = buffers.local.cpu()
            if not torch.equal(got, expected):
                rows = [slice(2 * p, 2 * p + 2) for p in range(self.world_size)]
                wrong = [p for p, r in enumerate(rows) if not torch.equal(got[:, r], expected[:, r])]
                raise RuntimeError(f"the probe transfer delivered wrong data from ranks {wrong}")

        try:
            agreed_step(self.channel, f"{self.name}: probe transfer", transfer_and_check)
        except CopyEngineSetupError:
            buffers.release()  # every rank synchronized and met in the step above
            raise
        buffers.release()

    def _quiesce(self, what: str) -> None:
        """Every rank's copies and this rank's readers are done: buffers may be released."""
        agreed_step(self.channel, f"quiesce before {what}", self.quiesce_local)

    def _evict_one(self) -> None:
        victim = next((k for k in self._targets if k not in self._group_keys and k not in self._captured_keys), None)
        if victim is None and self._captured_keys:
            raise UlyssesCaptureError(
                f"the copy-engine target cache (max_targets={self.options.max_targets}, max_target_bytes="
                f"{self.options.max_target_bytes}) is full of targets that CUDA graphs captured and may replay into; "
                "raise the bounds, or reset() the communicator and capture again"
            )
        if victim is None:
            raise CopyEngineSetupError(
                f"one Ulysses group uses more than max_targets={self.options.max_targets} distinct targets or "
                f"max_target_bytes={self.options.max_target_bytes} bytes"
            )
        self._quiesce("an eviction")
        target = self._targets.pop(victim)
        for slot in target.slots:
            slot.release()
        self._target_bytes -= target.nbytes
        self.evictions += 1

    def _release_uncached(self) -> None:
        if self._uncached:
            self._quiesce("releasing uncached targets")
            for buffers in self._uncached:
                buffers.release()
            self._uncached.clear()

    # -- introspection for tests and benches ----------------------------------------------------------------------
    @property
    def cached_keys(self) -> list[tuple]:
        return list(self._targets)

    @property
    def cached_bytes(self) -> int:
        return self._target_bytes

    @property
    def groups(self) -> int:
        """Groups handshaken so far, the setup probe's included."""
        return self._phases // 2

    @property
    def phases(self) -> int:
        """Handshake phases issued so far (two per group: open and close)."""
        return self._phases

    @property
    def captured_keys(self) -> list[tuple]:
        return [k for k in self._targets if k in self._captured_keys]

    # The A/B bench times the copies and the handshake on their own.
    def prepare(self, plan: UlyssesLayout, tag: str | None, device: torch.device) -> PeerBuffers:
        return self._target_for(plan, tag, device, packed=False, captured=False)[0]
