"""Where the CPU time of one copy-engine scatter_heads call goes (steady state: agreed signature, cached target).

    torchrun --standalone --nproc-per-node=2 tools/bench/submission_cost.py

Times, per call, the whole scatter_heads and its parts in isolation: input validation (plan), the communicator's
agreement lookup, the target lookup, the caller-stream readiness wait, the per-peer pitched copy submissions and the
allocator protection. Prints microseconds per call (median of many).
"""

import os
import statistics
import time

import torch
import torch.distributed as dist

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.layout import pitched_copy_to_peer, plan_scatter


def per_call_us(fn, n=100):
    """Short bursts, the GPU drained in between, so a full launch queue never throttles the submitting thread."""
    samples = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def main():
    torch.cuda.set_device(0 if torch.cuda.device_count() < int(os.environ["WORLD_SIZE"]) else int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")
    comm = UlyssesCommunicator(transport=os.environ.get("TRANSPORT", "ce-ipc"))
    w = dist.get_world_size()
    v = torch.randn(1, 1024, 3, 8 * w, 128, device="cuda", dtype=torch.bfloat16)[:, :, 2]
    for _ in range(3):
        comm.scatter_heads(v, tag="v").wait()
    torch.cuda.synchronize()
    dist.barrier()
    backend = comm.scatter_backend
    plan = plan_scatter(v, w)
    buffers = backend.prepare(plan, "v", v.device)
    geoms = [pitched_copy_to_peer(plan, comm.rank, p) for p in range(w)]
    stream = backend.stream
    rows = {
        "scatter_heads(barrier=False) total": None,
        "plan_scatter (validation)": lambda: plan_scatter(v, w),
        "agreement lookup": lambda: comm._agree("scatter_heads", "v", False, plan, "cuda", None),
        "target lookup (prepare)": lambda: backend.prepare(plan, "v", v.device),
        "record_ready (stream wait)": lambda: backend.prims.record_ready(stream),
        f"copy_2d x{w} (one per peer)": lambda: [backend.prims.copy_2d(v, buffers.peers[p], buffers.capacity_bytes, g, stream) for p, g in enumerate(geoms)],
        "copy_2d x1": lambda: backend.prims.copy_2d(v, buffers.peers[0], buffers.capacity_bytes, geoms[0], stream),
        "record_stream": lambda: v.record_stream(stream),
        "torch.ops call overhead (build_info)": lambda: torch.ops.tf_kernel.build_info(),
    }
    results = {}
    for name, fn in rows.items():
        if fn is None:
            continue
        results[name] = per_call_us(fn)
        torch.cuda.synchronize()
    # The full call, V only (barrier=False), with the group completed outside the timed region now and then.
    samples = []
    for _ in range(200):
        t0 = time.perf_counter()
        h = comm.scatter_heads(v, tag="v", barrier=False)
        samples.append((time.perf_counter() - t0) * 1e6)
        comm.scatter_heads(v, tag="k").wait()
    results["scatter_heads(barrier=False) total"] = statistics.median(samples)
    torch.cuda.synchronize()
    if comm.rank == 0:
        print(f"\nCPU cost per call, {comm.backend_name}, world {w}, V view [1, 1024, {8 * w}, 128] bf16 (median, us)")
        for name in rows:
            print(f"  {name:<40} {results[name]:8.1f}")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
