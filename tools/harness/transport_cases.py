"""Copy-engine protocol cases that run on every rank, shared by the CPU (host-shm) and GPU (ce-ipc, ce-symm) suites.

Each function takes the rank context, the transport name and the device, and checks its outputs exactly against
results constructed rank by rank. The CPU suite runs them on gloo ranks with the host shared-memory mapping; the GPU
suite runs the same functions with the mapping of the transport under test (CUDA IPC on processes sharing one GPU,
Symmetric Memory with a GPU per rank). Failure injection always wraps that transport's own mapping.
"""

from __future__ import annotations

import sys
import time

import torch

from telefuser.distributed.ulysses import UlyssesCommunicator, UlyssesInputError
from telefuser.distributed.ulysses.communicator import UlyssesTransportError
from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions
from telefuser.distributed.ulysses.peer_mapping import agree_on_setup
from telefuser.distributed.ulysses.primitives import UlyssesTimeoutError
from tools.harness.ulysses_reference import expected_gather, expected_scatter, rank_input

PROBE_GROUPS = 1  # every copy-engine backend runs one probe group at setup


def make_comm(ctx, transport: str, device: str, **options) -> UlyssesCommunicator:
    return UlyssesCommunicator(ctx.group, transport=transport, options=CopyEngineOptions(**options))


def inputs_for(seed, world, shape, dtype, device):
    return [rank_input(seed, p, shape, dtype).to(device) for p in range(world)]


def skew(ctx, device, iteration):
    """Delay rank 0 now and then: on the GPU with a spin kernel on its stream, on the CPU with a sleep."""
    if ctx.rank == 0 and iteration % 8 == 7:
        if device == "cuda":
            torch.cuda._sleep(4_000_000)  # a few ms at H200 clocks
        else:
            time.sleep(0.004)


def case_exact_scatter_and_views(ctx, transport, device, dtype):
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device)
    fused = inputs_for(1, w, (2, 5, 3, 2 * w, 8), dtype, device)
    for which in (2, 0, 1):  # the strided V view first, then Q and K views
        views = [f[:, :, which] for f in fused]
        out = comm.scatter_heads(views[r]).wait()
        assert torch.equal(out.cpu(), expected_scatter([v.cpu() for v in views], r)), which
    ys = inputs_for(2, w, (2, 4 * w, 2, 8), dtype, device)
    assert torch.equal(comm.gather_heads(ys[r]).wait().cpu(), expected_gather([y.cpu() for y in ys], r))
    name = comm.transport
    comm.close()
    return name


def case_layouts_packed_locally(ctx, transport, device):
    """Layouts the pitched copy cannot read are valid data: packed locally, exact, no error, on every transport.
    The first call agrees the signature with contiguous inputs; then each rank alone switches layouts at the
    repeated signature (no exchange happens for them) and the data must still arrive exactly."""
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device)
    shape = (1, 6, 2 * w, 8)
    base = inputs_for(900, w, shape, torch.float32, device)
    assert torch.equal(comm.scatter_heads(base[r]).wait().cpu(), expected_scatter([x.cpu() for x in base], r))
    variants = {
        "heads_strided": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),
        "channels_strided": lambda x: torch.cat([x, x], dim=3)[..., ::2],
        "expanded_rows": lambda x: x[:, :1].expand(shape),
        "overlapping_rows": lambda x: x.flatten().as_strided(shape, (x.numel(), 2 * 8, 8, 1)),
    }
    names = sorted(variants)
    for i, name in enumerate(names):
        # rank p uses variant (i + p): at every step the ranks' layouts differ
        inputs = [variants[names[(i + p) % len(names)]](base[p]) for p in range(w)]
        out = comm.scatter_heads(inputs[r]).wait()
        assert torch.equal(out.cpu(), expected_scatter([x.cpu().contiguous() for x in inputs], r)), name
    ys = inputs_for(901, w, (1, 2 * w, 2, 8), torch.float32, device)
    y_strided = [y.transpose(2, 3).contiguous().transpose(2, 3) for y in ys]  # channels strided
    assert torch.equal(comm.gather_heads(y_strided[r]).wait().cpu(), expected_gather([y.cpu() for y in ys], r))
    name = comm.transport
    comm.close()
    return name


def case_grouped_reuse_and_stress(ctx, transport, device, iterations):
    """V/Q/K groups with rank skew and pointer reuse, checking the output-lifetime contract: a group's outputs stay
    valid until this rank completes the next group, so they are checked while the next group's V and Q are in flight
    (peers may already be writing them into the other buffer)."""
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device)
    pointers: dict[str, list[int]] = {"v": [], "q": [], "k": []}
    previous = None
    for it in range(iterations):
        fused = inputs_for(100 + it, w, (1, 6, 3, 2 * w, 16), torch.bfloat16, device)
        q, k, v = fused[r].unbind(2)
        skew(ctx, device, it)
        hv = comm.scatter_heads(v, tag="v", barrier=False)
        q = q * 1  # "norm + RoPE" on the compute stream while V moves
        hq = comm.scatter_heads(q, tag="q", barrier=False)
        if previous is not None:
            check(previous, r)
        hk = comm.scatter_heads(k, tag="k")
        outs = {"q": hq.wait(), "k": hk.wait(), "v": hv.wait()}
        for tag, out in outs.items():
            pointers[tag].append(out.data_ptr())
        previous = (outs, [f.cpu() for f in fused])
    check(previous, r)
    backend = comm.scatter_backend
    stats = None
    if hasattr(backend, "cached_keys"):
        stats = (len(backend.cached_keys), backend.allocations, backend.groups - PROBE_GROUPS)
    comm.close()
    distinct = {tag: sorted(set(p)) for tag, p in pointers.items()}
    alternates = all(p[i] == p[i % 2] for p in pointers.values() for i in range(len(p)))
    return distinct, alternates, stats


def case_options_exact(ctx, transport, device, options):
    """Every ablation knob still moves the data exactly (3 grouped iterations)."""
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device, **options)
    for it in range(3):
        exact_vqk_group(comm, inputs_for(800 + it, w, (2, 5, 3, 2 * w, 8), torch.bfloat16, device), r)
    backend = comm.scatter_backend
    result = (comm.transport, backend.groups - PROBE_GROUPS, backend.allocations)
    comm.close()
    return result


def exact_vqk_group(comm, fused, rank):
    """One V-first V/Q/K group from the rank's fused projection, checked exactly."""
    q, k, v = fused[rank].unbind(2)
    hv = comm.scatter_heads(v, tag="v", barrier=False)
    hq = comm.scatter_heads(q, tag="q", barrier=False)
    hk = comm.scatter_heads(k, tag="k")
    check(({"q": hq.wait(), "k": hk.wait(), "v": hv.wait()}, [f.cpu() for f in fused]), rank)


def check(previous, rank):
    outs, fused = previous
    for tag, idx in (("q", 0), ("k", 1), ("v", 2)):
        assert torch.equal(outs[tag].cpu(), expected_scatter([f[:, :, idx] for f in fused], rank)), tag


def case_cache_bound(ctx, transport, device, distinct_shapes, **options):
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device, **options)
    for i in range(distinct_shapes):
        xs = inputs_for(200 + i, w, (1, 2 + i, w, 8), torch.float16, device)
        assert torch.equal(
            comm.scatter_heads(xs[r], tag=f"t{i}").wait().cpu(), expected_scatter([x.cpu() for x in xs], r)
        )
    backend = comm.scatter_backend
    result = (len(backend.cached_keys), backend.evictions, [k[0] for k in backend.cached_keys], backend.cached_bytes)
    # The oldest entries went; the newest still hit without a new allocation.
    before = backend.allocations
    xs = inputs_for(299, w, (1, 2 + distinct_shapes - 1, w, 8), torch.float16, device)
    comm.scatter_heads(xs[r], tag=f"t{distinct_shapes - 1}").wait()
    hit = backend.allocations == before
    comm.close()
    return result, hit


def mapping_holdings(mapping) -> int:
    """What a mapping still holds after close: live buffers (host, Symmetric Memory) or exported buffers and opened
    handles (CUDA IPC)."""
    held = getattr(mapping, "live_buffers", 0) + getattr(mapping, "exported_buffers", 0)
    return held + len(getattr(mapping, "_opened", ()))


def case_close_releases(ctx, transport, device):
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device)
    xs = inputs_for(300, w, (1, 4, w, 8), torch.float32, device)
    comm.scatter_heads(xs[r], tag="a").wait()
    backend = comm.scatter_backend
    mapping = backend.mapping
    held_before = mapping_holdings(mapping)
    comm.close()
    comm.close()  # idempotent
    held_after = mapping_holdings(mapping)
    try:
        comm.scatter_heads(xs[r])
    except RuntimeError as exc:
        return backend.name, held_before, held_after, str(exc)
    raise AssertionError("a closed communicator accepted a call")


def real_mapping(transport, channel, group, device):
    """The mapping the transport under test really uses."""
    if transport == "host-shm":
        from telefuser.distributed.ulysses.mapping_host import HostSharedMemoryMapping

        return HostSharedMemoryMapping(channel)
    if transport == "ce-symm":
        from telefuser.distributed.ulysses.mapping_symm import SymmetricMemoryMapping

        return SymmetricMemoryMapping(channel, group, device)
    from telefuser.distributed.ulysses.mapping_ipc import CudaIpcMapping

    return CudaIpcMapping(channel, torch.ops.tf_kernel, device)


class _InjectedFailure:
    """Wraps the transport's real mapping and fails, agreed across ranks, at one allocation on one rank. The count
    is shared by every mapping the factory builds (a reset builds a new one), so the failure happens once."""

    def __init__(self, inner, fail_rank: int, fail_call: int, channel, count: list[int]):
        self.inner, self.fail_rank, self.fail_call, self.channel = inner, fail_rank, fail_call, channel
        self.name = inner.name
        self.count = count

    def _maybe_fail(self):
        self.count[0] += 1
        if self.count[0] == self.fail_call:  # every rank reaches the same call; only one rank fails it
            error = "injected failure" if self.channel.rank == self.fail_rank else None
            agree_on_setup(error, self.channel, "test mapping")

    def allocate_flags(self, bits):
        self._maybe_fail()
        return self.inner.allocate_flags(bits)

    def allocate(self, shape, dtype):
        self._maybe_fail()
        return self.inner.allocate(shape, dtype)

    def close(self, agreed=False):
        self.inner.close(agreed=agreed)

    def __getattr__(self, item):
        return getattr(self.inner, item)


def _failing_comm(ctx, transport, fail_call, **options):
    count = [0]

    def factory(channel, device):
        inner = real_mapping(transport, channel, ctx.group, device)
        return _InjectedFailure(inner, ctx.world_size - 1, fail_call, channel, count)

    return UlyssesCommunicator(
        ctx.group, transport=transport, options=CopyEngineOptions(**options), mapping_factory=factory
    )


def case_agreed_fallback(ctx, transport, device, fail_call):
    """Setup fails on the last rank only, before any group started: every rank falls back to portable."""
    w, r = ctx.world_size, ctx.rank
    comm = _failing_comm(ctx, transport, fail_call)
    for it in range(2):
        xs = inputs_for(400 + it, w, (1, 3, 2 * w, 8), torch.bfloat16, device)
        hv = comm.scatter_heads(xs[r], tag="v", barrier=False)
        hk = comm.scatter_heads(xs[r] + 1, tag="k")
        assert torch.equal(hv.wait().cpu(), expected_scatter([x.cpu() for x in xs], r))
        assert torch.equal(hk.wait().cpu(), expected_scatter([(x + 1).cpu() for x in xs], r))
    name, reasons = comm.transport, dict(comm.fallback_reasons)
    comm.close()
    return name, reasons


# allocation calls of a fresh backend: 1 = flags, 2 = the probe's target, 3-4 = V's two buffers, 5 = Q's first buffer
FIRST_TARGET_CALL, Q_TARGET_CALL = 3, 5


def _request_failing_mid_group(comm, x) -> tuple[str, str, str]:
    """V goes out, Q's target setup fails (agreed); returns (Q's error, the backend after it, K's refusal)."""
    comm.scatter_heads(x, tag="v", barrier=False)
    try:
        comm.scatter_heads(x, tag="q", barrier=False)
    except UlyssesTransportError as exc:
        message = str(exc)
    else:
        raise AssertionError("no error after group start")
    backend_after = comm.transport
    try:
        comm.scatter_heads(x, tag="k")
    except UlyssesTransportError as exc:
        return message, backend_after, str(exc)
    raise AssertionError("a failed communicator accepted a call")


def case_failure_after_group_start(ctx, transport, device):
    """The Q target's setup fails (agreed) after V went out on the copy engine: every rank raises, none falls back."""
    comm = _failing_comm(ctx, transport, fail_call=Q_TARGET_CALL)
    result = _request_failing_mid_group(
        comm, inputs_for(500, ctx.world_size, (1, 3, 2 * ctx.world_size, 8), torch.float32, device)[ctx.rank]
    )
    comm.close()
    return result


def case_reset_reopens_copy_engine(ctx, transport, device):
    """Request 1 fails on the copy engine after its group started (an agreed setup failure at Q's target); reset()
    at the request boundary reopens the copy engine, and request 2 runs on it exactly."""
    w, r = ctx.world_size, ctx.rank
    comm = _failing_comm(ctx, transport, fail_call=Q_TARGET_CALL)
    _, failed_on, refused = _request_failing_mid_group(
        comm, inputs_for(510, w, (1, 3, 2 * w, 8), torch.float32, device)[r]
    )
    did_reset = comm.reset()
    healthy_again = comm.reset()  # nothing failed since: a no-op everywhere
    exact_vqk_group(comm, inputs_for(511, w, (1, 3, 3, 2 * w, 8), torch.float32, device), r)
    request2 = comm.transport
    comm.close()
    return failed_on, refused, did_reset, healthy_again, request2


def case_reset_after_fallback(ctx, transport, device):
    """An agreed setup failure at a new shape fell back to portable; reset() brings the copy engine back."""
    w, r = ctx.world_size, ctx.rank
    comm = _failing_comm(ctx, transport, fail_call=FIRST_TARGET_CALL)
    xs = inputs_for(520, w, (1, 3, 2 * w, 8), torch.float32, device)
    assert torch.equal(comm.scatter_heads(xs[r], tag="v").wait().cpu(), expected_scatter([x.cpu() for x in xs], r))
    after_fallback = comm.transport
    did_reset = comm.reset()
    assert torch.equal(comm.scatter_heads(xs[r], tag="v").wait().cpu(), expected_scatter([x.cpu() for x in xs], r))
    result = (after_fallback, did_reset, comm.transport)
    comm.close()
    return result


class _LocalOutOfMemory:
    """The real mapping, with this rank's n-th local allocation raising an out-of-memory error -- locally, inside
    the agreed step, not pre-agreed: the protocol itself must turn it into the same outcome on every rank."""

    def __init__(self, inner, fail_at: int):
        self.inner = inner
        self.count = 0
        original = inner.new_local

        def new_local(*args, **kwargs):
            self.count += 1
            if self.count == fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)\nmore lines")
            return original(*args, **kwargs)

        inner.new_local = new_local

    def __getattr__(self, item):
        return getattr(self.inner, item)


def _one_scatter_with_wrapped_mapping(ctx, transport, device, wrap_rank, wrap, seed):
    """One scatter on a communicator whose mapping is wrapped by `wrap(inner, device)` on `wrap_rank` only.
    Returns (backend, fallback reasons, outputs exact) on every rank."""
    w, r = ctx.world_size, ctx.rank

    def factory(channel, dev):
        inner = real_mapping(transport, channel, ctx.group, dev)
        return wrap(inner, dev) if r == wrap_rank else inner

    comm = UlyssesCommunicator(ctx.group, transport=transport, options=CopyEngineOptions(), mapping_factory=factory)
    xs = inputs_for(seed, w, (1, 3, 2 * w, 8), torch.float32, device)
    exact = torch.equal(comm.scatter_heads(xs[r], tag="v").wait().cpu(), expected_scatter([x.cpu() for x in xs], r))
    result = (comm.transport, dict(comm.fallback_reasons), exact)
    comm.close()
    return result


def case_oom_on_one_rank(ctx, transport, device, fail_at, fail_rank):
    """An out-of-memory at one rank's local allocation number `fail_at` (1 flags, 2 probe, 3 first target)."""
    wrap = lambda inner, dev: _LocalOutOfMemory(inner, fail_at)  # noqa: E731
    return _one_scatter_with_wrapped_mapping(ctx, transport, device, fail_rank, wrap, 530)


class _MisdirectedWrites:
    """On one rank, the first buffers it maps (the probe's target) send every peer's copy to a private scratch buffer:
    the data never arrives, which the probe must catch on the receiving ranks."""

    def __init__(self, inner, device):
        self.inner, self.device, self.done = inner, device, False
        self.name = inner.name

    def allocate(self, shape, dtype):
        buffers = self.inner.allocate(shape, dtype)
        if not self.done:
            self.done = True
            scratch = torch.empty(buffers.capacity_bytes, dtype=torch.uint8, device=self.device)
            self._scratch = scratch  # keeps it alive
            target = scratch.data_ptr() if scratch.is_cuda else scratch
            buffers.peers = [b if p == self.inner.rank else target for p, b in enumerate(buffers.peers)]
        return buffers

    def __getattr__(self, item):
        return getattr(self.inner, item)


def case_probe_catches_wrong_data(ctx, transport, device, bad_rank):
    return _one_scatter_with_wrapped_mapping(ctx, transport, device, bad_rank, _MisdirectedWrites, 540)


def case_missing_peer_times_out(ctx, transport, device, timeout_s):
    """The last rank raises before submitting K; the others must get a timeout error, not hang.

    A first full group warms the signatures and targets up, so the failing group needs no exchange on the CPU:
    the only thing left to wait on is the GPU-side (here: shared-memory) handshake."""
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device, timeout_s=timeout_s)
    xs = inputs_for(600, w, (1, 3, 2 * w, 8), torch.float32, device)
    comm.scatter_heads(xs[r], tag="v", barrier=False)
    comm.scatter_heads(xs[r], tag="k").wait()
    comm.scatter_heads(xs[r], tag="v", barrier=False)
    if r == w - 1:
        comm.close()
        return "skipped K"
    t0 = time.monotonic()
    try:
        comm.scatter_heads(xs[r], tag="k")
        if device == "cuda":
            torch.cuda.synchronize()  # the watchdog ends this process before this returns
    except UlyssesTimeoutError as exc:
        elapsed = time.monotonic() - t0
        comm.close()
        return str(exc), elapsed
    raise AssertionError("no timeout")


def case_agreed_input_error(ctx, transport, device):
    """Validation stays agreed on copy-engine transports: only the last rank passes fp64, all ranks raise."""
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device)
    x = rank_input(700, r, (1, 2, w, 8), torch.float32).to(device)
    try:
        comm.scatter_heads(x.double() if r == w - 1 else x)
    except UlyssesInputError as exc:
        message = str(exc)
    xs = inputs_for(701, w, (1, 2, w, 8), torch.float32, device)
    assert torch.equal(comm.scatter_heads(xs[r]).wait().cpu(), expected_scatter([x.cpu() for x in xs], r))
    comm.close()
    return message


def flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
