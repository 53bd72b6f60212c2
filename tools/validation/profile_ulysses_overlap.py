"""Profile one V-first attention layer (attention replaced by identity) and measure the V-copy / Q-K prep overlap.

The MiniMax H3 preset runs the model's own attention module (`telefuser.models.minimax_h3.attention.JointAttention`,
fused QKV, per-head RMSNorm, partial NeoX RoPE over 96 of 128 dims); the LingBot preset runs the generic V-first
layer until the LingBot-World v2 model lands.

    torchrun --standalone --nproc-per-node=2 tools/validation/profile_ulysses_overlap.py --output /tmp/overlap

Runs unchanged with processes sharing one GPU (CUDA IPC) or one GPU per rank. Rank 0 exports a Chrome trace
(`trace_rank0.json`, open it in chrome://tracing or Perfetto) and prints, per layer call, how long the V scatter's
copies ran on the GPU at the same time as the Q/K RMSNorm + RoPE kernels. The seed measured 157.7 us for a MiniMax H3
layer on 4xH100.
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
from telefuser.layers.attention import UlyssesSelfAttention
from telefuser.ops.rotary import rope_frequencies
from telefuser.profiling.overlap import v_copy_overlap

# Per-rank shapes: MiniMax H3's TP2+U2 layer (28 heads per TP rank, 9472 rows per Ulysses rank, hidden 5376).
PRESETS = {
    "minimax_h3_tp2_u2": dict(layer="minimax_h3", local_seq=9472, heads=28, head_dim=128, dim=5376, rotary_dim=96),
    "lingbot_u4": dict(layer="generic", local_seq=1560, heads=40, head_dim=128, dim=5120, rotary_dim=128),
}


def build_layer(cfg: dict, heads: int, comm: UlyssesCommunicator, cos: torch.Tensor, sin: torch.Tensor):
    """(module, call) for the preset's attention layer, on CUDA in bf16, attention replaced by identity."""
    if cfg["layer"] == "minimax_h3":
        from telefuser.models.minimax_h3.attention import AttentionContext, JointAttention

        module = JointAttention(cfg["dim"], heads, cfg["head_dim"], qk_norm_eps=1e-5).cuda().to(torch.bfloat16)
        ctx = AttentionContext(rope=(cos, sin), communicator=comm, attn_impl="identity")
        return module, lambda x: module(x, ctx)
    module = UlyssesSelfAttention(cfg["dim"], heads, cfg["head_dim"], attn_impl="identity").cuda().to(torch.bfloat16)
    module.communicator = comm
    return module, lambda x: module(x, cos, sin)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="minimax_h3_tp2_u2")
    p.add_argument("--transport", default="auto")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--output", type=Path, default=Path("outputs/overlap"))
    args = p.parse_args()
    cfg = PRESETS[args.preset]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    one_gpu_per_rank = torch.cuda.device_count() >= world
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if one_gpu_per_rank else 0)
    dist.init_process_group("cpu:gloo,cuda:nccl" if one_gpu_per_rank else "gloo")
    rank = dist.get_rank()
    heads = cfg["heads"] - cfg["heads"] % world
    torch.manual_seed(0)
    comm = UlyssesCommunicator(transport=args.transport)
    x = torch.randn(1, cfg["local_seq"], cfg["dim"], device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(rank * cfg["local_seq"], (rank + 1) * cfg["local_seq"])
    cos, sin = (t.cuda() for t in rope_frequencies(pos, cfg["rotary_dim"]))
    _, layer = build_layer(cfg, heads, comm, cos, sin)
    with torch.inference_mode():
        for _ in range(3):
            layer(x)
        torch.cuda.synchronize()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                layer(x)
            torch.cuda.synchronize()
    backend = comm.backend_name
    comm.close()
    if rank == 0:
        args.output.mkdir(parents=True, exist_ok=True)
        trace = args.output / "trace_rank0.json"
        prof.export_chrome_trace(str(trace))
        report = v_copy_overlap(trace)
        per_call = {k: v / args.iters for k, v in vars(report).items()}
        summary = {"preset": args.preset, "layer": cfg["layer"], "world": world, "transport": backend, "one_gpu_per_rank": one_gpu_per_rank,
                   "device": torch.cuda.get_device_name(), "iters": args.iters, "per_layer_call_us": per_call}
        (args.output / "overlap.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"{args.preset}, world {world}, {backend}: per layer call: V copy {per_call['v_copy_us']:.1f} us, "
              f"Q/K norm+RoPE {per_call['qk_prep_us']:.1f} us, overlap {per_call['overlap_us']:.1f} us -> {trace}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
