"""Where the CPU time of a copy-engine scatter_heads call goes (steady state: agreed signature, cached target).

    torchrun --standalone --nproc-per-node=2 -m tools.bench.submission_cost [--transport auto] [--public-only]

Times, per call (median of short bursts, the GPU drained in between so a full launch queue never throttles the
submitting thread):
  * the public calls of one V-first group: V and Q (barrier=False) and K (barrier=True: it adds the handshake);
  * with the current code, their parts in isolation: the cached plan, the agreement lookup, the target lookup, the
    one `copy_2d_batch` op (readiness wait plus every peer's pitched copy), `record_stream`, the handshake, and a
    bare torch.ops call. `--public-only` skips the parts, so the same script also times an older tree.
Prints microseconds per call, and which submission path tf-kernel took (one batched driver call or one per copy).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.copy_engine import CLOSE_BANK, OPEN_BANK


def per_call_us(fn, n=100, bursts=20):
    samples = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def public_costs(comm, q, k, v, groups=400):
    """Median CPU microseconds of the V, Q and K calls of one group, and of a whole group per call."""
    cost = {"v": [], "q": [], "k": [], "group": []}
    for i in range(groups):
        if i % 20 == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        hv = comm.scatter_heads(v, tag="v", barrier=False)
        t1 = time.perf_counter()
        hq = comm.scatter_heads(q, tag="q", barrier=False)
        t2 = time.perf_counter()
        hk = comm.scatter_heads(k, tag="k")
        t3 = time.perf_counter()
        hv.wait(), hq.wait(), hk.wait()
        for name, dt in (("v", t1 - t0), ("q", t2 - t1), ("k", t3 - t2), ("group", (t3 - t0) / 3)):
            cost[name].append(dt * 1e6)
    return {name: statistics.median(values) for name, values in cost.items()}


def part_costs(comm, v, w):
    from telefuser.distributed.ulysses.layout import Direction

    backend = comm.scatter_backend
    _, plan = comm._plan_for(v, Direction.SCATTER)
    _, copies = backend._target_for(plan, "v", v.device, False, False)
    stream = backend.stream
    rows = {
        "plan (cached validation)": lambda: comm._plan_for(v, Direction.SCATTER),
        "agreement lookup": lambda: comm._agree("scatter_heads", "v", False, plan, ("cuda", False), None),
        "target lookup": lambda: backend._target_for(plan, "v", v.device, False, False),
        f"copy_2d_batch: readiness wait + {w} copies, one op": lambda: backend.prims.submit(v, copies, stream),
        "record_stream": lambda: v.record_stream(stream),
        "handshake (open + close: two stream_phase ops, one event)": lambda: (
            backend._phase(OPEN_BANK, ready=True),
            backend._phase(CLOSE_BANK, ready=False),
            backend.prims.record_completion(stream),
        ),
        "torch.ops call overhead (build_info)": lambda: torch.ops.tf_kernel.build_info(),
    }
    return {name: per_call_us(fn) for name, fn in rows.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", default=os.environ.get("TRANSPORT", "auto"))
    p.add_argument("--public-only", action="store_true", help="only the public calls (works on older trees too)")
    p.add_argument("--label", default="")
    p.add_argument(
        "--profile", type=int, default=0, metavar="N", help="also print rank 0's top N functions by own time"
    )
    args = p.parse_args()
    world_env = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0 if torch.cuda.device_count() < world_env else int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")
    comm = UlyssesCommunicator(transport=args.transport)
    w = dist.get_world_size()
    fused = torch.randn(1, 1024, 3, 8 * w, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = fused.unbind(2)
    for _ in range(5):
        comm.scatter_heads(v, tag="v", barrier=False)
        comm.scatter_heads(q, tag="q", barrier=False)
        comm.scatter_heads(k, tag="k").wait()
    torch.cuda.synchronize()
    dist.barrier()
    public = public_costs(comm, q, k, v)
    parts = {} if args.public_only else part_costs(comm, v, w)
    torch.cuda.synchronize()
    profile = None
    if args.profile:  # where the public calls' time goes that the parts above do not show
        import cProfile
        import io
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        public_costs(comm, q, k, v, groups=200)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
        profile = text.getvalue()
    modes = None
    try:
        import tf_kernel

        modes = tf_kernel.submission_modes()
    except (ImportError, AttributeError):
        pass
    if comm.rank == 0:
        print(
            f"\nCPU cost per call {args.label}, {comm.transport}, world {w}, fused V/Q/K views "
            f"[1, 1024, {8 * w}, 128] bf16 (median, us)"
        )
        for name, label in (("v", "scatter_heads(v, barrier=False)"), ("q", "scatter_heads(q, barrier=False)"),
                            ("k", "scatter_heads(k) completing, with handshake"), ("group", "per call, whole group")):  # fmt: skip
            print(f"  {label:<52} {public[name]:8.1f}")
        for name, value in parts.items():
            print(f"    {name:<50} {value:8.1f}")
        if modes is not None:
            print(f"  tf-kernel submission modes (copies, memops): {modes} (1: one batched driver call)")
        if profile is not None:
            print(f"\ncProfile of 200 groups (600 calls) on rank 0, by own time:\n{profile}")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
