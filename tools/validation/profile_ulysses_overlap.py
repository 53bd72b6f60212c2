"""Profile one V-first attention layer (attention replaced by identity) and measure the V-copy / Q-K prep overlap.

Both presets run the model's own attention module, built per rank with that rank's rows:

* minimax_h3_tp2_u2: `telefuser.models.minimax_h3.attention.JointAttention` (fused QKV, per-head RMSNorm, partial
  NeoX RoPE over 96 of 128 dims) at one TP rank's share of MiniMax H3 under TP2+U2: 28 heads x 128, hidden 5376,
  9472 rows per Ulysses rank.
* lingbot_u4: `telefuser.models.lingbot_world_v2.attention.CausalSelfAttention` (separate Q/K/V projections, RMSNorm
  over all heads, 3-axis RoPE after the exchange) with a real `KVWindow` (the released 18-frame window, 6 sink
  frames) and `chunk_rope`: one 4-latent-frame chunk at 832x480, 1560 tokens per frame x 4 = 6240 chunk rows split
  over the W ranks (1560 per rank with W = 4; padded as the model pads when W does not divide them), dim 5120,
  40 heads x 128. Every call reads an empty KV window without committing, so all calls are alike.

The *_tiny presets are CPU-sized versions of the same layers, for `--device cpu` smoke runs (gloo, the portable or
host-shm transport; a CPU trace has no GPU activity, so the overlap figures are 0 there).

    torchrun --standalone --nproc-per-node=2 -m tools.validation.profile_ulysses_overlap --output /tmp/overlap
    torchrun --standalone --nproc-per-node=4 -m tools.validation.profile_ulysses_overlap --preset lingbot_u4
    torchrun --standalone --nproc-per-node=2 -m tools.validation.profile_ulysses_overlap --preset lingbot_tiny \
        --device cpu --transport host-shm --output /tmp/overlap_cpu

Runs unchanged with processes sharing one GPU (CUDA IPC) or one GPU per rank. Rank 0 exports a Chrome trace
(`trace_rank0.json`, open it in chrome://tracing or Perfetto) and prints, per layer call, how long the V scatter's
copies ran on the GPU at the same time as the Q/K preparation kernels. Two readings:

* phase ranges (`telefuser.profiling.overlap.v_copy_overlap`): all GPU work started inside the layer's
  `ulysses.scatter.v` range against all GPU work started inside its `ulysses.qk_norm_rope` range. For MiniMax these
  are exactly the V copies and the Q/K norm + RoPE kernels. LingBot's ranges also hold the projections (V's GEMM
  in the V range; Q's and K's GEMMs, norms and the Q scatter's copies in the Q/K range);
* transfer vs compute (`transfer_compute_overlap`): only the V range's transfers (copies, NCCL kernels) against
  only the Q/K range's compute kernels, i.e. how much of the V transfer hides behind Q/K work. For MiniMax it equals
  the first reading.

The seed measured 157.7 us for a MiniMax H3 layer on 4xH100.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.schedule import PHASE_QK_PREP, PHASE_SCATTER_V
from telefuser.distributed.ulysses.selection import TRANSPORTS
from telefuser.distributed.ulysses.sequence import rank_rows
from telefuser.profiling.overlap import (
    OverlapReport,
    gpu_intervals_of_phase,
    intersection_length,
    union,
    v_copy_overlap,
)

# Per-rank shapes. MiniMax H3: one TP rank's share of the TP2+U2 layer (28 heads per TP rank, 9472 rows per Ulysses
# rank, hidden 5376). LingBot-World v2: one chunk of `frames` latent frames on a (h, w) token grid, split over ranks;
# dim, heads, window and eps come from the model config ("official" or "tiny").
PRESETS = {
    "minimax_h3_tp2_u2": dict(layer="minimax_h3", local_seq=9472, heads=28, head_dim=128, dim=5376, rotary_dim=96),
    "lingbot_u4": dict(layer="lingbot_world_v2", config="official", frames=4, grid=(30, 52)),
    "minimax_h3_tiny": dict(layer="minimax_h3", local_seq=32, heads=8, head_dim=16, dim=64, rotary_dim=12),
    "lingbot_tiny": dict(layer="lingbot_world_v2", config="tiny", frames=3, grid=(1, 3)),  # 9 rows: padded
}
_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def lingbot_config(cfg: dict):
    from telefuser.models.lingbot_world_v2.config import LingBotWorldV2Config

    return LingBotWorldV2Config() if cfg["config"] == "official" else LingBotWorldV2Config.tiny_session()


def local_shape(preset: str, rank: int, world: int) -> dict:
    """What rank `rank` of `world` feeds its layer: rows (first row, count; the padded total for LingBot), heads
    before and after the Ulysses scatter, and the model dims. A pure function (no devices, no process group)."""
    cfg = PRESETS[preset]
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    if cfg["layer"] == "lingbot_world_v2":
        config = lingbot_config(cfg)
        if config.num_heads % world:
            raise ValueError(f"{preset}: {config.num_heads} heads do not split over {world} Ulysses ranks")
        chunk_rows = cfg["frames"] * cfg["grid"][0] * cfg["grid"][1]
        rows, padded = rank_rows(chunk_rows, rank, world)
        return dict(
            layer=cfg["layer"],
            first_row=rows.start,
            rows=rows.stop - rows.start,
            chunk_rows=chunk_rows,
            padded_rows=padded,
            heads=config.num_heads,
            heads_after_scatter=config.num_heads // world,
            head_dim=config.head_dim,
            dim=config.dim,
        )
    heads = cfg["heads"] - cfg["heads"] % world  # the generic shape: drop the heads that do not split evenly
    if heads == 0:
        raise ValueError(f"{preset}: {cfg['heads']} heads do not split over {world} Ulysses ranks")
    local = cfg["local_seq"]
    return dict(
        layer=cfg["layer"],
        first_row=rank * local,
        rows=local,
        chunk_rows=local * world,
        padded_rows=local * world,
        heads=heads,
        heads_after_scatter=heads // world,
        head_dim=cfg["head_dim"],
        dim=cfg["dim"],
    )


def build_layer(
    preset: str, rank: int, world: int, comm: UlyssesCommunicator, device: torch.device, dtype: torch.dtype
):
    """(call, x): the preset's attention layer on `device` in `dtype`, attention replaced by identity, as a
    function of this rank's input rows x ``[1, rows, dim]``."""
    cfg, shape = PRESETS[preset], local_shape(preset, rank, world)
    torch.manual_seed(0)  # the same weights on every rank
    x = torch.randn(1, shape["rows"], shape["dim"], device=device, dtype=dtype)
    if cfg["layer"] == "minimax_h3":
        from telefuser.models.minimax_h3.attention import AttentionContext, JointAttention
        from telefuser.ops.rotary import rope_frequencies

        module = JointAttention(shape["dim"], shape["heads"], shape["head_dim"], qk_norm_eps=1e-5).to(device, dtype)
        positions = torch.arange(shape["first_row"], shape["first_row"] + shape["rows"])
        cos, sin = (t.to(device) for t in rope_frequencies(positions, cfg["rotary_dim"]))
        ctx = AttentionContext(rope=(cos, sin), communicator=comm, attn_impl="identity")
        return (lambda inp: module(inp, ctx)), x

    from telefuser.models.lingbot_world_v2.attention import CausalSelfAttention, ChunkInputs, window_rows
    from telefuser.models.lingbot_world_v2.kv_cache import KVWindow
    from telefuser.models.wan.rope import chunk_rope

    config = lingbot_config(cfg)
    grid_h, grid_w = cfg["grid"]
    module = CausalSelfAttention(config.dim, config.num_heads, config.eps).to(device, dtype)
    window = KVWindow(  # what LingBotWorldV2DiT.new_window allocates, for one layer (no text K/V needed)
        batch=1,
        num_layers=1,
        tokens_per_frame=grid_h * grid_w,
        local_attn_size=config.local_attn_size,
        sink_size=config.sink_size,
        local_heads=shape["heads_after_scatter"],
        head_dim=config.head_dim,
        ulysses_degree=world,
        cross_kv=[],
        device=device,
        dtype=dtype,
    )
    plan = window.plan(cfg["frames"])
    cos, sin = chunk_rope(  # all ranks' rows: RoPE runs after the scatter
        window.frame_offset, cfg["frames"], grid_h, grid_w, config.head_dim, theta=config.rope_theta, device=device
    )
    slots, rows, fresh = plan.slot_rows(device), window_rows(plan), plan.kept == 0
    # the exchange is the communicator itself (its eager V-first calls, which this tool profiles), not its op key
    chunk = ChunkInputs(cos, sin, slots, rows, shape["chunk_rows"], comm, "identity", window.format, fresh)
    return (lambda inp: module(inp, window.layers[0], chunk)), x


def _is_transfer(event: dict) -> bool:
    nccl = "nccl" in event.get("name", "").lower()
    return event.get("cat") == "gpu_memcpy" or (event.get("cat") == "kernel" and nccl)


def _is_compute(event: dict) -> bool:
    return event.get("cat") == "kernel" and "nccl" not in event.get("name", "").lower()


def transfer_compute_overlap(trace: dict | str | Path) -> OverlapReport:
    """Like `v_copy_overlap`, but only the V range's transfers (copies, NCCL kernels) against only the Q/K range's
    compute kernels (not the Q scatter's copies, which LingBot's Q/K range starts too)."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    events = trace["traceEvents"] if "traceEvents" in trace else trace

    def keeping(keep):  # CPU events all stay (they carry the ranges and correlation ids); GPU events if `keep`
        return [e for e in events if e.get("cat") not in _GPU_CATEGORIES or keep(e)]

    v = gpu_intervals_of_phase(keeping(_is_transfer), PHASE_SCATTER_V)
    qk = gpu_intervals_of_phase(keeping(_is_compute), PHASE_QK_PREP)
    return OverlapReport(
        v_copy_us=sum(i.length for i in union(v)),
        qk_prep_us=sum(i.length for i in union(qk)),
        overlap_us=intersection_length(v, qk),
    )


def phase_ranges(trace: dict) -> dict[str, int]:
    """How often the trace holds each phase range of the V-first schedule (one per layer call, when the layer ran
    with a communicator and the profiler saw it)."""
    events = trace["traceEvents"] if "traceEvents" in trace else trace
    names = (PHASE_SCATTER_V, PHASE_QK_PREP)
    counts = dict.fromkeys(names, 0)
    for e in events:
        if e.get("ph") == "X" and e.get("name") in counts and e.get("cat") in ("user_annotation", "cpu_op"):
            counts[e["name"]] += 1
    return counts


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="minimax_h3_tp2_u2")
    p.add_argument("--transport", choices=TRANSPORTS, default="auto")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: a smoke run of the same code over gloo (use a *_tiny preset; no GPU overlap to see)",
    )
    p.add_argument("--output", type=Path, default=Path("outputs/overlap"))
    args = p.parse_args(argv)
    if args.iters < 1:
        p.error("--iters must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = PRESETS[args.preset]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_shape(args.preset, int(os.environ.get("RANK", "0")), world)  # a bad world fails before any collective
    on_gpu = args.device == "cuda"
    if on_gpu:
        if not torch.cuda.is_available():
            raise SystemExit(
                "--device cuda asked for, but no CUDA GPU is visible; use --device cpu --preset lingbot_tiny"
            )
        one_gpu_per_rank = torch.cuda.device_count() >= world
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if one_gpu_per_rank else 0)
        device, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
        dist.init_process_group("cpu:gloo,cuda:nccl" if one_gpu_per_rank else "gloo")
    else:
        one_gpu_per_rank = False
        device, dtype = torch.device("cpu"), torch.float32
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    shape = local_shape(args.preset, rank, world)
    comm = UlyssesCommunicator(transport=args.transport)
    layer, x = build_layer(args.preset, rank, world, comm, device, dtype)

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    with torch.inference_mode():
        for _ in range(3):
            layer(x)
        sync()
        dist.barrier()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=activities) as prof:
            for _ in range(args.iters):
                layer(x)
            sync()
    backend = comm.transport
    comm.close()
    if rank == 0:
        args.output.mkdir(parents=True, exist_ok=True)
        trace = args.output / "trace_rank0.json"
        prof.export_chrome_trace(str(trace))
        trace_events = json.loads(trace.read_text())
        per_call = {k: v / args.iters for k, v in vars(v_copy_overlap(trace_events)).items()}
        split = {k: v / args.iters for k, v in vars(transfer_compute_overlap(trace_events)).items()}
        ranges = phase_ranges(trace_events)
        summary = {
            "preset": args.preset,
            "layer": cfg["layer"],
            "world": world,
            "transport": backend,
            "one_gpu_per_rank": one_gpu_per_rank,
            "device": torch.cuda.get_device_name() if on_gpu else "cpu",
            "iters": args.iters,
            "rank0_shape": shape,
            "phase_ranges": ranges,
            "per_layer_call_us": per_call,
            "transfer_vs_compute_per_layer_call_us": split,
        }
        (args.output / "overlap.json").write_text(json.dumps(summary, indent=2) + "\n")
        v_label, qk_label = (
            ("V copy", "Q/K norm+RoPE")
            if cfg["layer"] == "minimax_h3"
            else ("V range (V GEMM + copies)", "Q/K range (Q/K GEMMs + norms, Q copies)")
        )
        print(
            f"{args.preset}, world {world}, {backend}, {shape['rows']} rows x {shape['heads']} heads per rank: "
            f"per layer call: {v_label} {per_call['v_copy_us']:.1f} us, {qk_label} {per_call['qk_prep_us']:.1f} us, "
            f"overlap {per_call['overlap_us']:.1f} us -> {trace}"
        )
        print(
            f"{args.preset}, transfer vs compute: V transfer {split['v_copy_us']:.1f} us, Q/K compute kernels "
            f"{split['qk_prep_us']:.1f} us, overlap {split['overlap_us']:.1f} us"
            + ("" if on_gpu else " (CPU run: no GPU activity in the trace)")
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
