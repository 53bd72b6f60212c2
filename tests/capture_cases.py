"""Graph capture of the copy engine, case by case on every rank: shared by the CPU suite (host-shm, with the host
primitives' capture standing in for a CUDA graph) and the GPU suite (ce-ipc on processes sharing the GPU, captured with
`torch.cuda.graph` and replayed with `CUDAGraph.replay()`).

A "forward" here is a few V-first layers (V strided out of a fused projection, Q built while V moves, K completing the
group), then a head gather and a row gather; every output is copied into a result buffer inside the region, before the
next group starts, as a model's attention consumes it. Inputs live in static buffers refilled between replays with
fresh data; every result is compared exactly with the exchange constructed rank by rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from telefuser.distributed.ulysses import UlyssesCaptureError, UlyssesProtocolError
from telefuser.distributed.ulysses.layout import copies_to_all_peers, plan_scatter
from tools.harness.transport_cases import inputs_for, make_comm
from tools.harness.ulysses_reference import expected_gather, expected_scatter

Step = Callable[[Callable[[], None]], None]


class Recorder:
    """Records a region once and replays it: `torch.cuda.graph` on CUDA, the host primitives' capture on CPU. The
    region runs its own (non-communicator) work through `step`, which the host capture records too."""

    def __init__(self, comm, device: str):
        self.comm, self.device = comm, device
        self._replay: Callable[[], None] | None = None

    def eager(self, region: Callable[[Step], None]) -> None:
        region(lambda fn: fn())

    def capture(self, region: Callable[[Step], None]) -> None:
        if self.device == "cuda":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                region(lambda fn: fn())
            self._replay = graph.replay
        else:
            with self.comm.scatter_backend.prims.capture() as host_graph:
                region(host_graph.add)
            self._replay = host_graph.replay

    def replay(self) -> None:
        self._replay()


def delay(device: str, on: bool) -> Callable[[], None]:
    """A rank held back on its stream (GPU: a spin kernel, recorded in the graph) or its thread (CPU)."""
    if not on:
        return lambda: None
    if device == "cuda":
        return lambda: torch.cuda._sleep(2_000_000)  # about a millisecond at H200 clocks
    return lambda: time.sleep(0.002)


class Forward:
    """`layers` V-first groups, a head gather and a row gather over static buffers of one shape (a "session")."""

    def __init__(self, ctx, comm, device: str, *, layers: int, rows: int, heads_per_rank: int, dim: int, seed: int):
        self.ctx, self.comm, self.device, self.layers, self.seed = ctx, comm, device, layers, seed
        w = ctx.world_size
        self.fused_shape = (1, rows, 3, heads_per_rank * w, dim)
        self.gather_shape = (1, rows * w, heads_per_rank, dim)
        self.rows_shape = (1, rows, 4 * dim)
        self.fused = [torch.empty(self.fused_shape, dtype=torch.bfloat16, device=device) for _ in range(layers)]
        self.y = torch.empty(self.gather_shape, dtype=torch.bfloat16, device=device)
        self.rows = torch.empty(self.rows_shape, dtype=torch.float32, device=device)
        self.results: dict[str, torch.Tensor] = {}
        self.delay_produce = delay(device, ctx.rank == 1)  # one rank late before producing its inputs
        self.delay_consume = delay(device, ctx.rank == w - 1 if w > 2 else ctx.rank == 0)  # another before reading

    def inputs(self, it: int) -> dict:
        w, base = self.ctx.world_size, self.seed + 1000 * it
        return {
            "fused": [
                inputs_for(base + layer, w, self.fused_shape, torch.bfloat16, "cpu") for layer in range(self.layers)
            ],
            "y": inputs_for(base + 500, w, self.gather_shape, torch.bfloat16, "cpu"),
            "rows": inputs_for(base + 600, w, self.rows_shape, torch.float32, "cpu"),
        }

    def load(self, inputs: dict) -> None:
        """Fresh data into the static buffers, on the stream the replay runs on."""
        r = self.ctx.rank
        for layer in range(self.layers):
            self.fused[layer].copy_(inputs["fused"][layer][r])
        self.y.copy_(inputs["y"][r])
        self.rows.copy_(inputs["rows"][r])

    def region(self, step: Step) -> None:
        comm = self.comm
        for layer in range(self.layers):
            q, k, v = self.fused[layer].unbind(2)
            step(self.delay_produce)
            hv = comm.scatter_heads(v, tag="v", barrier=False)  # the strided V view of the fused projection
            hq = comm.scatter_heads(q, tag="q", barrier=False)
            hk = comm.scatter_heads(k, tag="k")
            outs = {"q": hq.wait(), "k": hk.wait(), "v": hv.wait()}
            step(self.delay_consume)
            for tag, out in outs.items():
                self._keep(step, f"{layer}{tag}", out)
        self._keep(step, "gather", comm.gather_heads(self.y).wait())
        self._keep(step, "rows", comm.gather_rows(self.rows).wait())

    def _keep(self, step: Step, name: str, out: torch.Tensor) -> None:
        if name not in self.results:
            self.results[name] = torch.empty_like(out)
        result = self.results[name]
        step(lambda: result.copy_(out))  # consumed before the next group starts, as attention consumes it

    def check(self, inputs: dict) -> list[str]:
        """Names of the results that differ from the exchange constructed rank by rank (empty: all exact)."""
        if self.device == "cuda":
            torch.cuda.synchronize()
        r, wrong = self.ctx.rank, []
        for layer in range(self.layers):
            views = [f.unbind(2) for f in inputs["fused"][layer]]
            for i, tag in enumerate("qkv"):
                if not torch.equal(self.results[f"{layer}{tag}"].cpu(), expected_scatter([p[i] for p in views], r)):
                    wrong.append(f"{layer}{tag}")
        if not torch.equal(self.results["gather"].cpu(), expected_gather(inputs["y"], r)):
            wrong.append("gather")
        if not torch.equal(self.results["rows"].cpu(), torch.cat(inputs["rows"], dim=1)):
            wrong.append("rows")
        return wrong


def case_replays_exact_with_delayed_ranks(ctx, transport, device, replays):
    """One eager forward, one capture, then `replays` replays on fresh inputs with one rank late before producing and
    another before consuming: every replay exact. An odd number of groups per region on purpose (no parity rule)."""
    comm = make_comm(ctx, transport, device, gather="copy-engine")  # gathers recorded too, on CPU as on a GPU
    fwd = Forward(ctx, comm, device, layers=3, rows=5, heads_per_rank=2, dim=16, seed=3000)
    rec = Recorder(comm, device)
    warm = fwd.inputs(0)
    fwd.load(warm)
    rec.eager(fwd.region)
    assert fwd.check(warm) == [], "eager warm-up"
    rec.capture(fwd.region)
    groups_after_capture = comm.scatter_backend.groups
    wrong = {}
    for it in range(1, replays + 1):
        inputs = fwd.inputs(it)
        fwd.load(inputs)
        rec.replay()
        bad = fwd.check(inputs)
        if bad:
            wrong[it] = bad
    # No Python ran for the replays: the backend issued no group since the capture.
    return comm.transport, wrong, comm.scatter_backend.groups - groups_after_capture


def case_eager_replay_and_new_session_interleaved(ctx, transport, device):
    """Two "sessions" of different shapes, each warmed up eagerly and captured; then eager forwards and replays of
    both, in an irregular order: every one exact."""
    comm = make_comm(ctx, transport, device, gather="copy-engine")  # gathers recorded too, on CPU as on a GPU
    sessions = {
        "a": Forward(ctx, comm, device, layers=2, rows=4, heads_per_rank=2, dim=8, seed=5000),
        "b": Forward(ctx, comm, device, layers=3, rows=7, heads_per_rank=2, dim=8, seed=7000),
    }
    recorders = {name: Recorder(comm, device) for name in sessions}
    order = ["a:eager", "a:capture", "a:replay", "a:eager", "a:replay", "b:eager", "a:replay", "b:capture",
             "b:replay", "a:eager", "b:replay", "a:replay", "a:replay", "b:eager", "b:eager", "b:replay", "a:replay"]  # fmt: skip
    wrong = []
    for it, what in enumerate(order):
        name, action = what.split(":")
        fwd, rec = sessions[name], recorders[name]
        inputs = fwd.inputs(it)
        fwd.load(inputs)
        if action == "eager":
            rec.eager(fwd.region)
        elif action == "capture":
            rec.capture(fwd.region)
            rec.replay()  # a capture records, it does not run: replay once to produce this step's results
        else:
            rec.replay()
        if fwd.check(inputs):
            wrong.append((it, what, fwd.check(inputs)))
    return comm.transport, wrong


def case_capture_refusals(ctx, transport, device):
    """What the copy engine cannot record is refused with a clear error on every rank, and nothing breaks: a scatter
    whose target no eager call allocated, and a group that would span the start of a capture. Afterwards the earlier
    graph still replays exactly and eager calls work."""
    comm = make_comm(ctx, transport, device, gather="copy-engine")  # gathers recorded too, on CPU as on a GPU
    fwd = Forward(ctx, comm, device, layers=1, rows=4, heads_per_rank=2, dim=8, seed=9000)
    rec = Recorder(comm, device)
    fwd.load(fwd.inputs(0))
    rec.eager(fwd.region)
    rec.capture(fwd.region)
    messages = []
    unseen = torch.ones(1, 6, 2 * ctx.world_size, 8, dtype=torch.bfloat16, device=device)  # a shape never run eagerly
    try:
        Recorder(comm, device).capture(lambda step: comm.scatter_heads(unseen, tag="v").wait())
    except UlyssesCaptureError as exc:
        messages.append(str(exc))
    q, k, v = fwd.fused[0].unbind(2)
    pending = comm.scatter_heads(v, tag="v", barrier=False)  # the group starts eagerly ...
    try:
        Recorder(comm, device).capture(lambda step: comm.scatter_heads(k, tag="k"))  # ... and would end captured
    except UlyssesProtocolError as exc:
        messages.append(str(exc))
    comm.scatter_heads(q, tag="q", barrier=False)
    comm.scatter_heads(k, tag="k")  # the eager group completes eagerly
    del pending
    inputs = fwd.inputs(1)
    fwd.load(inputs)
    rec.replay()
    after_replay = fwd.check(inputs)
    inputs = fwd.inputs(2)
    fwd.load(inputs)
    rec.eager(fwd.region)
    return messages, after_replay, fwd.check(inputs), comm.failure


def check_refusals(results: list) -> None:
    """What case_capture_refusals returns on every rank: both refusals, the same everywhere, nothing broken."""
    for messages, after_replay, after_eager, failure in results:
        assert len(messages) == 2, messages
        assert "needs a copy-engine target that no eager call has allocated" in messages[0]
        assert "a group cannot span the start or end of a capture" in messages[1]
        assert after_replay == [] and after_eager == [] and failure is None
    assert all(r[0] == results[0][0] for r in results)  # the same refusal on every rank


def _epoch_handshake(backend, epoch: int) -> Callable[[], None]:
    """The pre-graph protocol, one phase with a monotonic epoch (publish it, wait GEQ), as a negative control: a
    capture fixes the epoch, so from the second replay on the waits pass on the flags of the replay before."""
    flags, rank, world = backend.flags, backend.rank, backend.world_size
    if backend.prims.name == "cuda":
        ops, bits = backend.prims.ops, backend.options.flag_bits
        return lambda: ops.stream_handshake(
            flags.peers[:world], flags.local.data_ptr(), rank, world, epoch, backend.stream.cuda_stream, bits
        )

    def host() -> None:
        for p in range(world):
            if p != rank:
                flags.peers[p][rank] = epoch
        while any(int(flags.local[p]) < epoch for p in range(world) if p != rank):
            time.sleep(0.0002)

    return host


def case_stale_epochs_corrupt(ctx, transport, device, replays):
    """Negative control: the same exchange with the one-phase epoch handshake captured as it is. A replay's waits
    pass on the previous replay's epochs, so a rank late before producing delivers after its peers already read:
    wrong data. Returns how many replays read at least one wrong element on this rank (the positive twin, the
    communicator's two constant phases, is case_replays_exact_with_delayed_ranks)."""
    comm = make_comm(ctx, transport, device)
    w, r = ctx.world_size, ctx.rank
    shape = (1, 64, 2 * w, 32)
    x = torch.empty(shape, dtype=torch.bfloat16, device=device)
    x.copy_(inputs_for(1, w, shape, torch.bfloat16, "cpu")[r])
    comm.scatter_heads(x, tag="v").wait()  # agrees the transport and runs the probe
    backend = comm.scatter_backend
    prims, stream = backend.prims, backend.stream
    plan = plan_scatter(x, w)
    target = backend.prepare(plan, "v", x.device)  # a target of the right shape, reused by every group below
    copies = prims.copy_list(target.peers, target.capacity_bytes, copies_to_all_peers(plan, r))
    result = torch.empty(plan.out_shape, dtype=x.dtype, device=device)
    late = delay(device, r == 1)

    def region(step: Step) -> None:
        for g in range(2):
            step(late)
            step(lambda: prims.submit(x, copies, stream, ready=True))
            step(_epoch_handshake(backend, 1_000_000 + g))
            if device == "cuda":
                prims.caller_wait(prims.record_completion(stream))
            step(lambda: result.copy_(target.local))

    rec = Recorder(comm, device)
    rec.capture(region)
    corrupted = 0
    for it in range(1, replays + 1):
        inputs = inputs_for(100 + it, w, shape, torch.bfloat16, "cpu")
        x.copy_(inputs[r])
        rec.replay()
        if device == "cuda":
            torch.cuda.synchronize()
        corrupted += not torch.equal(result.cpu(), expected_scatter(inputs, r))
    comm.close()  # its flags hold stale epochs now
    return corrupted
