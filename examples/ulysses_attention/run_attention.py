"""One DiT attention layer under Ulysses against dense execution.

    torchrun --standalone --nproc-per-node=4 examples/ulysses_attention/run_attention.py --output outputs/demo

Every rank builds the same layer and the same global input (seeded), runs its sequence shard through the V-first
Ulysses schedule, and the gathered result is compared with the dense layer on the whole sequence. Rank 0 prints the
per-call times and the max error, and writes them to a metrics JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from attention_layer import UlyssesSelfAttention  # beside this script

from telefuser.distributed.mesh import ParallelConfig, init_distributed
from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.ops.rotary import rope_frequencies


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=2048, help="global sequence length (divisible by the world size)")
    p.add_argument("--dim", type=int, default=256, help="model width")
    p.add_argument("--heads", type=int, default=8, help="attention heads (divisible by the world size)")
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--iters", type=int, default=10, help="timed calls of each variant")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--output", type=Path, default=Path("outputs/demo"), help="directory for the metrics JSON")
    return p.parse_args()


def timed(fn, iters: int) -> float:
    """Median wall seconds per call, every rank starting together."""
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_alone(fn, iters: int, rank: int) -> float:
    """Median wall seconds per call on rank 0 while the other ranks idle at a barrier."""
    result = [0.0]
    if rank == 0:
        result[0] = statistics.median(_wall(fn) for _ in range(iters))
    dist.barrier()
    return result[0]


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mesh = init_distributed(ParallelConfig(ulysses_degree=world))
    mesh.config.check_heads(args.heads)
    if args.seq_len % world:
        raise SystemExit(f"--seq-len {args.seq_len} must be divisible by the world size {world}")
    rank, dtype, device = mesh.rank, getattr(torch, args.dtype), mesh.device
    torch.manual_seed(0)  # identical weights and input on every rank
    layer = UlyssesSelfAttention(args.dim, args.heads, args.head_dim).to(device, dtype).eval()
    x = torch.randn(1, args.seq_len, args.dim, device=device, dtype=dtype)
    cos, sin = rope_frequencies(torch.arange(args.seq_len), args.head_dim)
    shard = args.seq_len // world
    rows = slice(rank * shard, (rank + 1) * shard)

    comm = UlyssesCommunicator(mesh.ulysses_group)
    with torch.inference_mode():
        dense = layer(x, cos, sin)
        layer.communicator = comm
        local = layer(x[:, rows], cos[rows], sin[rows])
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local)
        max_err = (torch.cat(gathered, dim=1) - dense).abs().max().item()
        ulysses_s = timed(lambda: layer(x[:, rows], cos[rows], sin[rows]), args.iters)
        layer.communicator = None
        # The dense baseline is one process with the machine to itself: the other ranks wait meanwhile.
        dense_s = timed_alone(lambda: layer(x, cos, sin), args.iters, rank)
    comm.close()

    if rank == 0:
        metrics = {
            "world_size": world,
            "backend": comm.transport,
            "seq_len": args.seq_len,
            "dim": args.dim,
            "heads": args.heads,
            "head_dim": args.head_dim,
            "dtype": args.dtype,
            "ulysses_ms_per_call": ulysses_s * 1e3,
            "dense_ms_per_call": dense_s * 1e3,
            "max_abs_error_vs_dense": max_err,
        }
        args.output.mkdir(parents=True, exist_ok=True)
        path = args.output / f"ulysses_attention_w{world}.json"
        path.write_text(json.dumps(metrics, indent=2) + "\n")
        print(
            f"Ulysses{world} ({comm.transport}, gloo CPU) seq={args.seq_len} dim={args.dim} heads={args.heads}: "
            f"ulysses {ulysses_s * 1e3:.2f} ms/call | dense (one process) {dense_s * 1e3:.2f} ms/call | "
            f"max |err| vs dense {max_err:.2e} -> {path}"
        )
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        if not max_err <= tol:
            raise SystemExit(f"Ulysses output differs from dense by {max_err:.3e} (tolerance {tol})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
