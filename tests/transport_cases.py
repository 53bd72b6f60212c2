"""Copy-engine protocol cases that run on every rank, shared by the CPU (host-shm) and GPU (ce-ipc) suites.

Each function takes the rank context, the transport name and the device, and checks its outputs exactly against
results constructed rank by rank. The CPU suite runs them on gloo ranks with the host shared-memory mapping; the GPU
suite runs the same functions on processes sharing one GPU with the CUDA IPC mapping.
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
from tests.ulysses_reference import expected_gather, expected_scatter, rank_input


def make_comm(ctx, transport: str, device: str, **options) -> UlyssesCommunicator:
    return UlyssesCommunicator(ctx.group, transport=transport, options=CopyEngineOptions(**options))


def expected_backend(transport: str) -> str:
    return {"ce-ipc": "ce-ipc", "ce-symm": "ce-symm"}.get(transport, transport)


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
    name = comm.backend_name
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
    stats = (len(backend.cached_keys), backend.allocations, backend.epoch) if hasattr(backend, "cached_keys") else None
    comm.close()
    distinct = {tag: sorted(set(p)) for tag, p in pointers.items()}
    alternates = all(p[i] == p[i % 2] for p in pointers.values() for i in range(len(p)))
    return distinct, alternates, stats


def case_options_exact(ctx, transport, device, options):
    """Every ablation knob still moves the data exactly (3 grouped iterations)."""
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device, **options)
    for it in range(3):
        fused = inputs_for(800 + it, w, (2, 5, 3, 2 * w, 8), torch.bfloat16, device)
        q, k, v = fused[r].unbind(2)
        hv = comm.scatter_heads(v, tag="v", barrier=False)
        hq = comm.scatter_heads(q, tag="q", barrier=False)
        hk = comm.scatter_heads(k, tag="k")
        check(({"q": hq.wait(), "k": hk.wait(), "v": hv.wait()}, [f.cpu() for f in fused]), r)
    backend = comm.scatter_backend
    result = (comm.backend_name, backend.epoch, backend.allocations)
    comm.close()
    return result


def check(previous, rank):
    outs, fused = previous
    for tag, idx in (("q", 0), ("k", 1), ("v", 2)):
        assert torch.equal(outs[tag].cpu(), expected_scatter([f[:, :, idx] for f in fused], rank)), tag


def case_cache_bound(ctx, transport, device, distinct_shapes):
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device)
    for i in range(distinct_shapes):
        xs = inputs_for(200 + i, w, (1, 2 + i, w, 8), torch.float16, device)
        assert torch.equal(comm.scatter_heads(xs[r], tag=f"t{i}").wait().cpu(), expected_scatter([x.cpu() for x in xs], r))
    backend = comm.scatter_backend
    result = (len(backend.cached_keys), backend.evictions, [k[0] for k in backend.cached_keys])
    # The oldest entries went; the newest still hit without a new allocation.
    before = backend.allocations
    xs = inputs_for(299, w, (1, 2 + distinct_shapes - 1, w, 8), torch.float16, device)
    comm.scatter_heads(xs[r], tag=f"t{distinct_shapes - 1}").wait()
    hit = backend.allocations == before
    comm.close()
    return result, hit


def case_close_releases(ctx, transport, device):
    w, r = ctx.world_size, ctx.rank
    comm = make_comm(ctx, transport, device)
    xs = inputs_for(300, w, (1, 4, w, 8), torch.float32, device)
    comm.scatter_heads(xs[r], tag="a").wait()
    backend = comm.scatter_backend
    mapping = backend.mapping
    comm.close()
    comm.close()  # idempotent
    live = getattr(mapping, "live_buffers", None)
    opened = len(getattr(mapping, "_opened", ()))
    try:
        comm.scatter_heads(xs[r])
    except RuntimeError as exc:
        return live, opened, str(exc)
    raise AssertionError("a closed communicator accepted a call")


class _InjectedFailure:
    """Wraps the transport's real mapping and fails, agreed across ranks, at one allocation on one rank."""

    def __init__(self, inner, fail_rank: int, fail_call: int, group):
        self.inner, self.fail_rank, self.fail_call, self.group = inner, fail_rank, fail_call, group
        self.name = inner.name
        self.calls = 0

    def _maybe_fail(self):
        self.calls += 1
        if self.calls == self.fail_call:  # every rank reaches the same call; only one rank fails it
            import torch.distributed as dist

            error = "injected failure" if dist.get_rank(self.group) == self.fail_rank else None
            agree_on_setup(error, self.group, "test mapping")

    def allocate_flags(self, bits):
        self._maybe_fail()
        return self.inner.allocate_flags(bits)

    def allocate(self, shape, dtype):
        self._maybe_fail()
        return self.inner.allocate(shape, dtype)

    def close(self):
        self.inner.close()

    def __getattr__(self, item):
        return getattr(self.inner, item)


def _real_mapping(transport, group, device):
    if transport == "host-shm":
        from telefuser.distributed.ulysses.mapping_host import HostSharedMemoryMapping

        return HostSharedMemoryMapping(group)
    from telefuser.distributed.ulysses.mapping_ipc import CudaIpcMapping

    return CudaIpcMapping(group, torch.ops.tf_kernel, device)


def _failing_comm(ctx, transport, fail_call, **options):
    def factory(group, device):
        return _InjectedFailure(_real_mapping(transport, group, device), ctx.world_size - 1, fail_call, group)

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
    name, reasons = comm.backend_name, dict(comm.fallback_reasons)
    comm.close()
    return name, reasons


def case_failure_after_group_start(ctx, transport, device):
    """The Q target's setup fails (agreed) after V went out on the copy engine: every rank raises, none falls back."""
    w, r = ctx.world_size, ctx.rank
    # allocation calls: 1 = flags, 2-3 = V's two buffers, 4 = Q's first buffer
    comm = _failing_comm(ctx, transport, fail_call=4)
    xs = inputs_for(500, w, (1, 3, 2 * w, 8), torch.float32, device)
    comm.scatter_heads(xs[r], tag="v", barrier=False)
    try:
        comm.scatter_heads(xs[r], tag="q", barrier=False)
    except UlyssesTransportError as exc:
        message = str(exc)
    else:
        raise AssertionError("no error after group start")
    backend_after = comm.backend_name
    try:
        comm.scatter_heads(xs[r], tag="k")
    except UlyssesTransportError as exc:
        later = str(exc)
    comm.close()
    return message, backend_after, later


def case_missing_peer_times_out(ctx, transport, device, timeout_s):
    """The last rank raises before submitting K; the others must get a timeout error, not hang.

    A first full group warms the signatures and targets up, so the failing group needs no collective on the CPU:
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
