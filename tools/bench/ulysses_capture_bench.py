"""A forward's worth of Ulysses communication, eager against one replayed CUDA graph, on the copy engine.

    torchrun --standalone --nproc-per-node=4 -m tools.bench.ulysses_capture_bench --output docs/perf/x.json

Per layer: the V-first V/Q/K group (V, Q and K strided views of a fused [1, S_local, 3, H, D] bf16 projection), the
head gather of the attention output; after the last layer the row gather of the model output. Each output is copied
into a result buffer inside the forward, as attention consumes it. Every rank runs the same forward:
  * eager: the host time until the forward's calls return (the device idle at the start) and the device time of the
    forward (CUDA events), medians over `--repeats`;
  * graph: the same forward captured once with `torch.cuda.graph` and replayed with `CUDAGraph.replay()`: the host
    time of one `replay()` call and the device time; and how many times Python's `scatter_heads` ran during the
    replays (none: a replay is one graph launch);
  * the gathers on the copy engine against the portable path (gloo stages device tensors through the host there):
    ms per gather_heads call, eager.
Replayed results are checked equal to the eager ones (same inputs, same kernels). With processes sharing one GPU the
device times include every rank's copies on one HBM: use them for host cost and protocol overhead, not NVLink.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions

# (S_global, H, D) of one attention layer: LingBot-World v2 at 832x480 (6,240 tokens of a chunk, 40 x 128 heads).
SHAPE = (6240, 40, 128)


class Forward:
    def __init__(self, comm: UlyssesCommunicator, layers: int, device: torch.device):
        w = comm.world_size
        s, h, d = SHAPE
        self.comm, self.layers = comm, layers
        self.fused = torch.randn(1, s // w, 3, h, d, device=device, dtype=torch.bfloat16)
        self.attn_out = torch.randn(1, s, h // w, d, device=device, dtype=torch.bfloat16)
        self.rows = torch.randn(1, s // w, 64, device=device)  # the model output: out_dim x patch volume, fp32
        self.results: dict[str, torch.Tensor] = {}
        self.calls = 0

    def __call__(self) -> None:
        comm = self.comm
        q, k, v = self.fused.unbind(2)
        for layer in range(self.layers):
            hv = comm.scatter_heads(v, tag="v", barrier=False)
            hq = comm.scatter_heads(q, tag="q", barrier=False)
            hk = comm.scatter_heads(k, tag="k")
            self._keep("qkv", torch.stack([hq.wait(), hk.wait(), hv.wait()]))
            self._keep("gather", comm.gather_heads(self.attn_out).wait())
        self._keep("rows", comm.gather_rows(self.rows).wait())

    def _keep(self, name: str, out: torch.Tensor) -> None:
        if name not in self.results:
            self.results[name] = torch.empty_like(out)
        self.results[name].copy_(out)


def counting_scatters(comm: UlyssesCommunicator, forward: Forward) -> None:
    original = comm.scatter_heads

    def counted(*args, **kwargs):
        forward.calls += 1
        return original(*args, **kwargs)

    comm.scatter_heads = counted


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median host ms until `fn` returns, median device ms), the device idle before each run."""
    host, device = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        device.append(start.elapsed_time(end))
    return statistics.median(host), statistics.median(device)


def gather_ms(comm: UlyssesCommunicator, y: torch.Tensor, iters: int) -> float:
    for _ in range(3):
        comm.gather_heads(y).wait()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.gather_heads(y).wait()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


def max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--output", default=None, help="JSON file for the result (rank 0 writes it)")
    args = p.parse_args()
    if "WORLD_SIZE" not in os.environ:
        raise SystemExit("run under torchrun: torchrun --standalone --nproc-per-node=4 " + __file__)
    world_env = int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", 0 if torch.cuda.device_count() < world_env else int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    w, rank = dist.get_world_size(), dist.get_rank()
    comm = UlyssesCommunicator(transport="auto")
    forward = Forward(comm, args.layers, device)
    forward()  # selects the transport and allocates every target
    if comm.transport == "portable":
        raise SystemExit(f"the copy engine is not available here: {comm.fallback_reasons}")
    eager_host, eager_device = timed(forward, args.repeats)
    eager = {name: out.clone() for name, out in forward.results.items()}

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    counting_scatters(comm, forward)
    graph_host, graph_device = timed(graph.replay, args.repeats)
    torch.cuda.synchronize()
    exact = all(torch.equal(forward.results[name], eager[name]) for name in eager)

    y = forward.attn_out
    ce_gather = gather_ms(comm, y, 20)
    portable = UlyssesCommunicator(transport="auto", options=CopyEngineOptions(gather="portable"))
    portable.scatter_heads(forward.fused[:, :, 2]).wait()  # selects the copy engine; gathers stay portable
    portable_gather = gather_ms(portable, y, 20)

    result = {
        "world_size": w,
        "layers": args.layers,
        "shape_global": SHAPE,
        "transport": comm.transport,
        "eager": {"host_ms": max_over_ranks(eager_host), "device_ms": max_over_ranks(eager_device)},
        "graph": {
            "host_ms": max_over_ranks(graph_host),
            "device_ms": max_over_ranks(graph_device),
            "python_scatter_calls_during_replays": int(max_over_ranks(forward.calls)),
            "replays": args.repeats,
            "exact": bool(max_over_ranks(0.0 if exact else 1.0) == 0.0),
        },
        "gather_heads_ms": {"copy_engine": max_over_ranks(ce_gather), "portable": max_over_ranks(portable_gather)},
    }
    if rank == 0:
        calls = 3 * args.layers
        print(f"Ulysses{w}, {args.layers} layers of {SHAPE} (V/Q/K group + head gather each) + a row gather")
        print("| forward | host ms (max over ranks) | device ms | Python scatter_heads calls |")
        print("| --- | ---: | ---: | ---: |")
        print(f"| eager | {result['eager']['host_ms']:.3f} | {result['eager']['device_ms']:.3f} | {calls} |")
        g = result["graph"]
        print(f"| CUDA graph replay | {g['host_ms']:.3f} | {g['device_ms']:.3f} | "
              f"{g['python_scatter_calls_during_replays']} in {g['replays']} replays |")  # fmt: skip
        print(f"replays equal to eager: {g['exact']}")
        ga = result["gather_heads_ms"]
        print(f"gather_heads ms per call: copy engine {ga['copy_engine']:.3f}, portable (gloo) {ga['portable']:.3f}")
        if args.output:
            with open(args.output, "w") as f:
                json.dump(result, f, indent=2)
    portable.close()
    comm.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
