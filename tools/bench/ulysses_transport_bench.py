"""Ulysses transport A/B bench: the grouped V/Q/K scatter of one attention layer, backend against backend.

    torchrun --standalone --nproc-per-node=2 -m tools.bench.ulysses_transport_bench --output docs/perf/x.json

Every backend runs in the same process on the same inputs (a fused [B, S_local, 3, H, D] bf16 projection whose V, Q and
K views are submitted V-first). For each (backend, shape) it reports:
  * ms per grouped layer: CUDA-event time of `iters` consecutive V/Q/K groups (submission to waited outputs) divided
    by iters; the median over `repeats`, then the max across ranks (the slowest rank gates the layer);
  * GB/s: the bytes this rank's copies move (3 x its input) over that time, and the same as a fraction of a flat
    copy of the same bytes into the same peer buffers (the ceiling measured in the same run);
  * CPU submission cost per scatter_heads call (host clock around the three calls, steady state).
And, for copy-engine backends: the handshake round trip (a stream of back-to-back handshakes, per handshake), and
pitched-vs-flat copy efficiency of the strided V view.

Backends whose requirements are not met (NCCL and Symmetric Memory need one GPU per rank) are listed as skipped with
the reason. With processes sharing one GPU, "peer" copies stay inside one HBM: use those numbers for protocol
overhead and copy efficiency, not NVLink bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.copy_engine import CLOSE_BANK, OPEN_BANK, CopyEngineOptions
from telefuser.distributed.ulysses.layout import flat_copy_to_peer, packed_source, pitched_copy_to_peer, plan_scatter

# Global problems (B, S_global, H, D) at each shape's native world size; at another world S_local = S_global / W.
SHAPES = {
    "minimax_h3_tp2_u2": (1, 18944, 28, 128),  # seed: (1, 9472, 28, 128) per rank at Ulysses2 under TP2
    "minimax_h3_u4": (1, 18944, 56, 128),  # seed: (1, 4736, 56, 128) per rank at Ulysses4
    "lingbot_u4": (1, 6240, 40, 128),  # seed: (1, 1560, 40, 128) per rank at Ulysses4
    "wan720p": (1, 75600, 40, 128),  # Wan 2.x 14B, 1280x720, 81 frames: 21 x 45 x 80 latent tokens
}
ABLATIONS = {
    "ce-nocache": dict(cache_targets=False),
    "ce-pack-flat": dict(pitched=False),
    "ce-handshake-per-tensor": dict(handshake_per_tensor=True),
    "ce-normal-priority": dict(high_priority_stream=False),
    "ce-flags32": dict(flag_bits=32),
    "ce-symm-barrier": dict(handshake="symm_barrier"),
}


@dataclass
class Row:
    backend: str
    shape: str
    local_shape: tuple
    ran_on: str
    ms_per_layer: float | None = None
    ms_min: float | None = None
    ms_max: float | None = None
    gbps: float | None = None
    of_flat_ceiling: float | None = None
    submit_us_per_call: float | None = None
    note: str = ""


def sync_all() -> None:
    torch.cuda.synchronize()
    dist.barrier()


def max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=CPU_GROUP)
    return float(t.item())


def time_groups(comm: UlyssesCommunicator, fused: torch.Tensor, iters: int, repeats: int) -> tuple[list[float], float]:
    """(per-repeat ms per group, CPU us per scatter_heads call)."""
    q, k, v = fused.unbind(2)

    def group():
        hv = comm.scatter_heads(v, tag="v", barrier=False)
        hq = comm.scatter_heads(q, tag="q", barrier=False)
        hk = comm.scatter_heads(k, tag="k")
        hv.wait(), hq.wait(), hk.wait()

    for _ in range(3):
        group()
    per_repeat, submit = [], []
    for _ in range(repeats):
        sync_all()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            t0 = time.perf_counter()
            hv = comm.scatter_heads(v, tag="v", barrier=False)
            hq = comm.scatter_heads(q, tag="q", barrier=False)
            hk = comm.scatter_heads(k, tag="k")
            submit.append((time.perf_counter() - t0) / 3)
            hv.wait(), hq.wait(), hk.wait()
        end.record()
        end.synchronize()
        per_repeat.append(start.elapsed_time(end) / iters)
    return per_repeat, statistics.median(submit) * 1e6


def copies_ms(comm: UlyssesCommunicator, src: torch.Tensor, plan, geometry_for, iters: int) -> float:
    """ms for this rank's copies of one tensor into every peer's target, on the copy stream (no handshake)."""
    backend = comm.scatter_backend
    buffers = backend.prepare(plan, "v", src.device)
    geometries = [geometry_for(plan, comm.rank, peer) for peer in range(comm.world_size)]
    sync_all()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(backend.stream):
        start.record()
        for _ in range(iters):
            for peer, pc in enumerate(geometries):
                backend.prims.copy_2d(src, buffers.peers[peer], buffers.capacity_bytes, pc, backend.stream)
        end.record()
    end.synchronize()
    sync_all()
    return start.elapsed_time(end) / iters


def pitched_and_flat_ms(comm: UlyssesCommunicator, fused: torch.Tensor, iters: int) -> tuple[float, float]:
    """The strided V view's pitched copies vs flat copies of the same bytes from a packed (contiguous) source."""
    v = fused[:, :, 2]
    plan = plan_scatter(v, comm.world_size)
    pitched = copies_ms(comm, v, plan, pitched_copy_to_peer, iters)
    flat = copies_ms(comm, packed_source(v, plan), plan, flat_copy_to_peer, iters)
    return pitched, flat


def handshake_us(comm: UlyssesCommunicator, n: int) -> float:
    backend = comm.scatter_backend
    sync_all()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(backend.stream):
        start.record()
        for _ in range(n):  # one group's handshake: the open and the close phase
            backend._phase(OPEN_BANK, ready=False)
            backend._phase(CLOSE_BANK, ready=False)
        end.record()
    end.synchronize()
    sync_all()
    return start.elapsed_time(end) / n * 1e3


CPU_GROUP = None
_ZERO_CTA = {}


def nccl_zero_cta_row(shape_name, local, fused, iters, repeats, bytes_moved) -> Row:
    """The portable exchange on NCCL's copy-engine collectives: a CTA_POLICY_ZERO communicator and send/receive
    buffers from Symmetric Memory's NCCL backend (registered windows). Run it in its own process: it switches the
    Symmetric Memory backend. The layout permutes stay, as NCCL's CE all-to-all moves contiguous chunks only."""
    row = Row("nccl-zero-cta", shape_name, local, "nccl-zero-cta")
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if "group" not in _ZERO_CTA:
            opts = dist.ProcessGroupNCCL.Options()
            opts.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO
            _ZERO_CTA["group"] = dist.new_group(backend="nccl", pg_options=opts)
            symm_mem.set_backend("NCCL")
        group = _ZERO_CTA["group"]
        world = dist.get_world_size()
        b, s, h, d = local
        hl = h // world
        pairs = []
        for _ in range(3):
            send = symm_mem.empty(b * s * h * d, dtype=fused.dtype, device=fused.device)
            recv = symm_mem.empty(b * s * h * d, dtype=fused.dtype, device=fused.device)
            symm_mem.rendezvous(send, group)
            symm_mem.rendezvous(recv, group)
            pairs.append((send, recv))

        def layer():
            works = []
            for idx, (send, recv) in zip((2, 0, 1), pairs):  # V first
                send.view(world, b, s, hl, d).copy_(fused[:, :, idx].unflatten(2, (world, hl)).permute(2, 0, 1, 3, 4))
                works.append(dist.all_to_all_single(recv, send, group=group, async_op=True))
            for work in works:
                work.wait()

        for _ in range(3):
            layer()
        per_repeat = []
        for _ in range(repeats):
            sync_all()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                layer()
            end.record()
            end.synchronize()
            per_repeat.append(start.elapsed_time(end) / iters)
        med = max_over_ranks(statistics.median(per_repeat))
        row.ms_per_layer, row.ms_min, row.ms_max = med, max_over_ranks(min(per_repeat)), max_over_ranks(max(per_repeat))
        row.gbps = bytes_moved / (med * 1e-3) / 1e9
    except Exception as exc:  # report, do not hide: the row says why it did not run
        row.ran_on, row.note = "", f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
    return row


def main() -> int:
    global CPU_GROUP
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--transports", default="portable,ce-ipc,ce-symm," + ",".join(ABLATIONS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", default=None, help="JSON file for the rows")
    p.add_argument("--hang-dump-s", type=float, default=0, help="dump every thread's stack after this many seconds")
    args = p.parse_args()
    if args.hang_dump_s:
        import faulthandler

        faulthandler.dump_traceback_later(args.hang_dump_s, exit=True)

    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    one_gpu_per_rank = torch.cuda.device_count() >= world_env
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if one_gpu_per_rank else 0)
    dist.init_process_group("cpu:gloo,cuda:nccl" if one_gpu_per_rank else "gloo")
    CPU_GROUP = dist.new_group(backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    rows: list[Row] = []
    extras: dict = {}
    for shape_name in args.shapes.split(","):
        b, s_global, h, d = SHAPES[shape_name]
        if s_global % world or h % world:
            continue
        local = (b, s_global // world, h, d)
        torch.manual_seed(rank)
        fused = torch.randn(b, local[1], 3, h, d, device="cuda", dtype=torch.bfloat16)
        bytes_moved = 3 * fused[:, :, 0].numel() * fused.element_size()
        for name in args.transports.split(","):
            transport = "ce-ipc" if name in ABLATIONS else name
            if name in ABLATIONS and "ce-symm" in (r.ran_on for r in rows if r.shape == shape_name):
                transport = "ce-symm"  # ablate the preferred transport where it runs
            if name == "ce-symm-barrier":
                transport = "ce-symm"
            if name == "nccl-zero-cta":
                rows.append(nccl_zero_cta_row(shape_name, local, fused, args.iters, args.repeats, bytes_moved))
                continue
            row = Row(name, shape_name, local, "")
            if transport == "portable" and not one_gpu_per_rank:
                row.note = "skipped: NCCL needs one GPU per rank (gloo staging through the host is not a baseline)"
                rows.append(row)
                continue
            options = CopyEngineOptions(**ABLATIONS.get(name, {}))
            comm = UlyssesCommunicator(transport=transport, options=options)
            comm.scatter_heads(fused[:, :, 2], tag="v").wait()  # selects the transport (agreed) before any timing
            row.ran_on = comm.transport
            if transport != "portable" and comm.transport != transport:
                row.note = f"skipped: {comm.fallback_reasons.get(transport, 'unavailable')}"
                comm.close()
                rows.append(row)
                continue
            per_repeat, submit_us = time_groups(comm, fused, args.iters, args.repeats)
            med = max_over_ranks(statistics.median(per_repeat))
            row.ms_per_layer, row.ms_min, row.ms_max = (
                med,
                max_over_ranks(min(per_repeat)),
                max_over_ranks(max(per_repeat)),
            )
            row.gbps = bytes_moved / (med * 1e-3) / 1e9
            row.submit_us_per_call = max_over_ranks(submit_us)
            if name in ("ce-ipc", "ce-symm"):
                pitched, flat = (max_over_ranks(t) for t in pitched_and_flat_ms(comm, fused, args.iters))
                ceiling = 3 * flat  # flat copies of the layer's three tensors, back to back
                row.of_flat_ceiling = ceiling / med
                extras[f"{shape_name}/{name}"] = {
                    "flat_ceiling_ms_per_layer": ceiling,
                    "pitched_v_copy_ms": pitched,
                    "flat_same_bytes_ms": flat,
                    "pitched_over_flat_efficiency": flat / pitched,
                }
            if comm.scatter_backend is not None and name != "portable":
                extras.setdefault(f"{shape_name}/{name}", {})["handshake_us"] = max_over_ranks(handshake_us(comm, 200))
            comm.close()
            rows.append(row)
    if rank == 0:
        dev = torch.cuda.get_device_name()
        print(
            f"\nUlysses grouped V/Q/K scatter per layer: world={world}, {dev}, "
            f"{'one GPU per rank' if one_gpu_per_rank else 'ranks share one GPU'}, bf16, "
            f"{args.repeats} repeats x {args.iters} groups (median; max over ranks)"
        )
        print(
            f"{'backend':<24} {'shape':<18} {'local [B,S,H,D]':<22} {'ms/layer':>9} {'min-max':>15} {'GB/s':>7} "
            f"{'of flat':>8} {'submit us/call':>15}"
        )
        for r in rows:
            if r.ms_per_layer is None:
                print(f"{r.backend:<24} {r.shape:<18} {str(list(r.local_shape)):<22} {r.note}")
                continue
            flat = f"{r.of_flat_ceiling:.0%}" if r.of_flat_ceiling else "-"
            submit = f"{r.submit_us_per_call:.1f}" if r.submit_us_per_call is not None else "-"
            print(
                f"{r.backend:<24} {r.shape:<18} {str(list(r.local_shape)):<22} {r.ms_per_layer:>9.3f} "
                f"{r.ms_min:>7.3f}-{r.ms_max:<7.3f} {r.gbps:>7.0f} {flat:>8} {submit:>15}"
            )
        for key, value in extras.items():
            print(f"{key}: " + ", ".join(f"{k}={v:.4g}" for k, v in value.items()))
        if args.output:
            with open(args.output, "w") as f:
                json.dump(
                    {
                        "world": world,
                        "device": dev,
                        "one_gpu_per_rank": one_gpu_per_rank,
                        "torch": torch.__version__,
                        "rows": [asdict(r) for r in rows],
                        "extras": extras,
                    },
                    f,
                    indent=2,
                )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
