"""Four-rank (or any-rank) Ulysses transport correctness, exact against rank-wise constructed results.

    torchrun --standalone --nproc-per-node=4 -m tools.validation.ulysses_correctness [--transports portable,ce-ipc,ce-symm]

Runs unchanged with several processes on one GPU (gloo control group; CUDA IPC) and on a multi-GPU host (NCCL for
the portable path; CUDA IPC and Symmetric Memory). For each transport and dtype it checks contiguous and strided
(fused-QKV V view) scatters, gather, and 64 grouped V/Q/K iterations with a rank-skewed GPU delay, then prints a table.
A transport the ranks cannot use is reported as skipped with the agreed reason. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from telefuser.distributed.ulysses import UlyssesCommunicator


def rank_input(seed, rank, shape, dtype, device):
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return (torch.randn(*shape, generator=g) * 3 + rank).to(dtype).to(device)


def expected_scatter(inputs, rank):
    hl = inputs[0].shape[2] // len(inputs)
    return torch.cat([x[:, :, rank * hl : (rank + 1) * hl].cpu() for x in inputs], dim=1)


def expected_gather(inputs, rank):
    s = inputs[0].shape[1] // len(inputs)
    return torch.cat([y[:, rank * s : (rank + 1) * s].cpu() for y in inputs], dim=2)


def check_transport(transport: str, dtype: torch.dtype, device, world: int, rank: int, iterations: int) -> dict:
    comm = UlyssesCommunicator(transport=transport)
    failures = []
    fused = [rank_input(1, p, (2, 48, 3, 2 * world, 64), dtype, device) for p in range(world)]
    for which in (2, 0):
        views = [f[:, :, which] for f in fused]
        if not torch.equal(comm.scatter_heads(views[rank]).wait().cpu(), expected_scatter(views, rank)):
            failures.append(f"scatter view {which}")
    ys = [rank_input(2, p, (2, 48 * world, 2, 64), dtype, device) for p in range(world)]
    if not torch.equal(comm.gather_heads(ys[rank]).wait().cpu(), expected_gather(ys, rank)):
        failures.append("gather")
    for it in range(iterations):
        fused = [rank_input(10 + it, p, (1, 96, 3, 2 * world, 128), dtype, device) for p in range(world)]
        q, k, v = fused[rank].unbind(2)
        if rank == it % world and it % 8 == 7 and device.type == "cuda":
            torch.cuda._sleep(2_000_000)  # rank-skewed GPU delay
        hv = comm.scatter_heads(v, tag="v", barrier=False)
        hq = comm.scatter_heads(q * 1, tag="q", barrier=False)
        hk = comm.scatter_heads(k, tag="k")
        for handle, idx in ((hq, 0), (hk, 1), (hv, 2)):
            if not torch.equal(handle.wait().cpu(), expected_scatter([f[:, :, idx] for f in fused], rank)):
                failures.append(f"group {it} tag {handle.tag}")
    name, reasons = comm.transport, dict(comm.fallback_reasons)
    comm.close()
    return {"backend": name, "failures": failures, "reasons": reasons}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transports", default="portable,ce-ipc,ce-symm")
    p.add_argument("--iterations", type=int, default=64)
    args = p.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    one_gpu_per_rank = torch.cuda.is_available() and torch.cuda.device_count() >= world_env
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank if one_gpu_per_rank else 0)
    dist.init_process_group("cpu:gloo,cuda:nccl" if one_gpu_per_rank else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    rows, ok = [], True
    for transport in args.transports.split(","):
        for dtype in (torch.bfloat16, torch.float16):
            result = check_transport(transport, dtype, device, world, rank, args.iterations)
            results = [None] * world
            dist.all_gather_object(results, result)
            bad = [f"rank {r}: {res['failures'][:3]}" for r, res in enumerate(results) if res["failures"]]
            used = results[0]["backend"]
            if transport != "portable" and used != transport:
                status = f"skipped ({results[0]['reasons'].get(transport, 'unavailable')})"
            else:
                status = "FAIL " + "; ".join(bad) if bad else "exact"
                ok &= not bad
            rows.append((transport, str(dtype).removeprefix("torch."), used, status))
    if rank == 0:
        print(
            f"\nUlysses transport correctness: world={world}, device={torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
            f"{'one GPU per rank' if one_gpu_per_rank else 'ranks share a GPU'}, {args.iterations} grouped iterations"
        )
        print(f"{'transport':<10} {'dtype':<9} {'ran on':<10} result")
        for row in rows:
            print(f"{row[0]:<10} {row[1]:<9} {row[2]:<10} {row[3]}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
