"""The copy-engine Ulysses scatter: pitched copies straight into peers' final-layout buffers.

Per call: the copy stream waits for the caller's stream (the projection is ready), then issues one pitched copy per
peer -- self included -- from the input view into that peer's cached ``[B, S_global, H/W, D]`` target, at rows
``[rank*S, (rank+1)*S)``. Calls with ``barrier=False`` stop there. The group's completing call adds one handshake
on the copy stream -- publish the group's epoch into every peer's flag slot, wait until every peer published it here
-- and records one completion event. A handle's `wait()` only makes the caller's stream wait on that event.

Targets are cached per (tag, direction, shape, dtype, device), at most `max_targets` keys, least recently used
evicted. Each key holds two buffers used alternately. Output lifetime contract: a scatter output stays valid until
this rank *completes* the next group that uses the same tag and shape (its barrier=True call). Consume it -- or, on a
GPU, enqueue its consumers -- before then, or clone it. Why two buffers make that safe: a peer that has passed this
group's handshake may already be copying the next group into this rank while this rank still reads the current
outputs, so the next group lands in the other buffer. Reaching the group after that needs this rank's next epoch,
which this rank publishes only after its caller's stream reached the completing call, i.e. after its reads.

Eviction needs every rank to be done with the buffers: it synchronizes locally, then runs a barrier on the group,
then releases the mapping. Cache misses are collective (peer mapping setup) and happen in the same order on every
rank because the call sequence is agreed.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .layout import Direction, UlyssesPlan, copies_to_all_peers, packed_source
from .peer_mapping import CopyEngineSetupError, PeerBuffers, PeerMapping


@dataclass
class CopyEngineOptions:
    """Knobs for the transport; the non-default values exist for the A/B bench's ablations."""

    max_targets: int = 12
    flag_bits: int = 64
    high_priority_stream: bool = True
    cache_targets: bool = True  # False: allocate (collectively) on every call -- what the cache saves
    handshake_per_tensor: bool = False  # True: one handshake per call instead of one per group
    pitched: bool = True  # False: pack destination-major on the caller's stream, then flat copies
    handshake: str = "memops"  # "symm_barrier": SymmetricMemory.barrier() (an SM kernel) instead of stream memops
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_targets < 1:
            raise ValueError(f"max_targets must be >= 1, got {self.max_targets}")
        if self.flag_bits not in (32, 64):
            raise ValueError(f"flag_bits must be 32 or 64, got {self.flag_bits}")
        if self.handshake not in ("memops", "symm_barrier"):
            raise ValueError(f"handshake must be 'memops' or 'symm_barrier', got {self.handshake!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


@dataclass
class _Target:
    slots: list[PeerBuffers]
    uses: int = 0

    def next_slot(self) -> PeerBuffers:
        slot = self.slots[self.uses % len(self.slots)]
        self.uses += 1
        return slot


@dataclass
class _Completion:
    """Shared by every transfer of one group; the completing call fills it in."""

    epoch: int = 0
    event: object = None


@dataclass
class CopyEngineTransfer:
    prims: object
    output: torch.Tensor
    completion: _Completion = field(repr=False)

    def result(self) -> torch.Tensor:
        self.prims.caller_wait(self.completion.event)
        return self.output


class CopyEngineBackend:
    def __init__(
        self, name: str, group: dist.ProcessGroup, mapping: PeerMapping, prims, options: CopyEngineOptions, watchdog=None
    ):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.mapping = mapping
        self.prims = prims
        self.options = options
        self.name = name  # the transport name: "ce-symm", "ce-ipc" or "host-shm"
        self._watchdog = watchdog
        self._targets: collections.OrderedDict[tuple, _Target] = collections.OrderedDict()
        self._group_keys: set[tuple] = set()  # keys used by the pending group: never evicted under it
        self._uncached: list[PeerBuffers] = []  # cache_targets=False: released at the next group's start
        self._pending: _Completion | None = None
        self._epoch = 0
        self.allocations = 0
        self.evictions = 0
        self.flags = mapping.allocate_flags(options.flag_bits)  # collective and agreed
        if options.handshake == "symm_barrier" and self.flags.handle is None:
            self.flags.release()
            raise CopyEngineSetupError(f"the symm_barrier handshake needs Symmetric Memory, not {mapping.name}")
        self.stream = prims.new_stream(options.high_priority_stream)

    # -- the backend contract used by UlyssesCommunicator ---------------------------------------------------------
    def start(self, x: torch.Tensor, plan: UlyssesPlan, tag: str | None) -> CopyEngineTransfer:
        buffers = self.prepare(plan, tag, x.device)
        return self.submit(x, plan, buffers)

    def complete_group(self) -> None:
        if not self.options.handshake_per_tensor:  # otherwise the group's last call already ran its handshake
            self._handshake()
        self._pending = None
        self._group_keys.clear()

    def close(self) -> None:
        """Local release: wait for this rank's own copies, drop targets and flags. No collective."""
        try:
            self.prims.synchronize(self.stream)
        finally:
            for target in self._targets.values():
                for slot in target.slots:
                    slot.release()
            self._targets.clear()
            for buffers in self._uncached:
                buffers.release()
            self._uncached.clear()
            self.flags.release()
            self.mapping.close()
            if self._watchdog is not None:
                self._watchdog.close()

    # -- steps -------------------------------------------------------------------------------------------------------
    def prepare(self, plan: UlyssesPlan, tag: str | None, device: torch.device) -> PeerBuffers:
        """The call's target buffers; a miss sets up new peer buffers collectively (raises CopyEngineSetupError)."""
        if not self.options.cache_targets:
            if self._pending is None:
                self._release_uncached()
            buffers = self.mapping.allocate(plan.out_shape, plan.dtype)
            self.allocations += 1
            self._uncached.append(buffers)
            return buffers
        key = (tag, plan.direction.value, plan.out_shape, plan.dtype, str(device))
        target = self._targets.get(key)
        if target is None:
            if len(self._targets) >= self.options.max_targets:
                self._evict_one()
            target = _Target([self.mapping.allocate(plan.out_shape, plan.dtype) for _ in range(2)])
            self.allocations += 2
            self._targets[key] = target
        self._targets.move_to_end(key)
        self._group_keys.add(key)
        return target.next_slot()

    def submit(self, x: torch.Tensor, plan: UlyssesPlan, buffers: PeerBuffers) -> CopyEngineTransfer:
        """Issue this rank's copies to every peer on the copy stream. Local; nothing waits on peers here."""
        packed = not self.options.pitched and plan.direction is Direction.SCATTER
        if packed:
            x = packed_source(x, plan)
        self.prims.record_ready(self.stream)
        for peer, geometry in copies_to_all_peers(plan, self.rank, packed):
            self.prims.copy_2d(x, buffers.peers[peer], buffers.capacity_bytes, geometry, self.stream)
        self.prims.protect_input(x, self.stream)
        if self._pending is None:
            self._pending = _Completion()
        transfer = CopyEngineTransfer(self.prims, buffers.local, self._pending)
        if self.options.handshake_per_tensor:
            self._handshake()
        return transfer

    def _handshake(self) -> None:
        self._epoch += 1
        if self.options.handshake == "symm_barrier":  # ablation: the seed's first, slower design
            with torch.cuda.stream(self.stream):
                self.flags.handle.barrier(channel=0)
        else:
            self.prims.handshake(self.flags.peers, self.flags.local, self.rank, self._epoch, self.stream, self.options.flag_bits)
        completion = self._pending if self._pending is not None else _Completion()
        completion.epoch = self._epoch
        completion.event = self.prims.record_completion(self.stream)
        if self._watchdog is not None and completion.event is not None:
            self._watchdog.watch(self._epoch, completion.event)

    def _quiesce(self) -> None:
        """Every rank's copies and this rank's readers are done: buffers may be released."""
        self.prims.synchronize(self.stream)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # local readers of old outputs (a cache miss is rare)
        dist.barrier(group=self.group)

    def _evict_one(self) -> None:
        victim = next((k for k in self._targets if k not in self._group_keys), None)
        if victim is None:
            raise RuntimeError(
                f"one Ulysses group uses more than max_targets={self.options.max_targets} distinct targets"
            )
        self._quiesce()
        for slot in self._targets.pop(victim).slots:
            slot.release()
        self.evictions += 1

    def _release_uncached(self) -> None:
        if self._uncached:
            self._quiesce()
            for buffers in self._uncached:
                buffers.release()
            self._uncached.clear()

    # -- introspection for tests and benches ----------------------------------------------------------------------
    @property
    def cached_keys(self) -> list[tuple]:
        return list(self._targets)

    @property
    def epoch(self) -> int:
        return self._epoch
