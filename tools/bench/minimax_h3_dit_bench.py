"""One MiniMax H3 DiT call at a request's real token count: time, achieved TFLOP/s, peak memory.

    python tools/bench/minimax_h3_dit_bench.py                          # official config, 768p 5 s, one GPU
    torchrun --standalone --nproc-per-node=2 tools/bench/minimax_h3_dit_bench.py --layers 8 --ulysses 2
    python tools/bench/minimax_h3_dit_bench.py --config tiny --device cpu --resolution 64 --duration 1   # smoke

Random bf16 weights (said so). FLOPs are counted with torch's FlopCounterMode during an extra untimed call (matmuls and
attention as torch dispatches them, on this rank), so the TFLOP/s figure counts what the model actually runs. The ceiling to
compare with is the measured bf16 matmul rate of the same GPU (786 TFLOP/s on the lent H200, shared/notes).
With --ulysses N under torchrun the model runs Ulysses over N ranks with the communicator's default transport
(processes sharing one GPU use CUDA IPC), which proves the copy-engine path in the real model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from telefuser.distributed.mesh import ParallelConfig, init_distributed
from telefuser.models.minimax_h3.checkpoint import build_random_minimax_h3_dit
from telefuser.models.minimax_h3.config import MiniMaxH3Config
from telefuser.ops.fusion import set_fusion
from telefuser.pipelines.minimax_h3.shapes import plan_shape

MATMUL_CEILING_TFLOPS = 786.0  # bf16 8192^3 on the lent H200 (shared/notes/gpu-facts.md)


def inputs(config: MiniMaxH3Config, args, device, dtype):
    shape = plan_shape(duration_s=args.duration, resolution=args.resolution, aspect_ratio=args.aspect_ratio)
    g = torch.Generator(device="cpu").manual_seed(0)
    video = torch.randn(shape.video_latent_shape, generator=g).to(device)
    audio = torch.randn(shape.audio_latent_shape, generator=g).to(device)
    text = torch.randn(1, args.text_len, config.text_dim, generator=g).to(device, dtype)
    t = torch.full((1,), 500.0, device=device)
    return shape, (video, audio, text, t, t.clone())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=["official", "tiny"], default="official")
    p.add_argument("--layers", type=int, default=None, help="override num_layers (fit several ranks on one GPU)")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--resolution", type=int, default=768)
    p.add_argument("--aspect-ratio", default="16:9")
    p.add_argument("--text-len", type=int, default=256, help="prompt tokens after the text encoder")
    p.add_argument("--ulysses", type=int, default=1)
    p.add_argument("--attn-impl", default="sdpa")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--fusion", choices=["fused", "eager", "both"], default="fused",
                   help="elementwise chains (norms, AdaLN, RoPE) as compiled kernels on CUDA, or eager ops; "
                        "'both' alternates them in this run")
    p.add_argument("--device", default="cuda")
    p.add_argument("--output", default=None, help="JSON file for the result")
    args = p.parse_args()

    config = MiniMaxH3Config() if args.config == "official" else MiniMaxH3Config.tiny()
    if args.layers:
        config = replace(config, num_layers=args.layers)
    on_gpu = args.device == "cuda"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    world = int(os.environ.get("WORLD_SIZE", "1"))
    mesh = None
    if world > 1:
        if world != args.ulysses:
            raise SystemExit(f"--ulysses {args.ulysses} must equal the torchrun world size {world}")
        shared_gpu = on_gpu and torch.cuda.device_count() < world
        mesh = init_distributed(ParallelConfig(ulysses_degree=world), backend="gloo" if shared_gpu or not on_gpu else None)
    rank = mesh.rank if mesh else 0
    device = torch.device("cuda", torch.cuda.current_device() if mesh and torch.cuda.device_count() >= world else 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)

    t0 = time.perf_counter()
    model = build_random_minimax_h3_dit(config, seed=0, device=device, dtype=dtype, attn_impl=args.attn_impl,
                                        init_on_device=on_gpu).eval()
    build_s = time.perf_counter() - t0
    if mesh is not None:
        model.enable_parallel(mesh)
    shape, batch = inputs(config, args, device, dtype)
    variants = ["fused", "eager"] if args.fusion == "both" else [args.fusion]
    times = {variant: [] for variant in variants}
    counter = FlopCounterMode(display=False)
    with torch.inference_mode():
        for variant in variants:  # warm-up each (allocator, kernels, compilation, communicator targets)
            set_fusion(variant == "fused")
            model(*batch)
        set_fusion(False)  # count in eager mode: the dispatch mode and the compiled kernel do not mix
        with counter:
            model(*batch)  # this rank's FLOP count (elementwise work is not counted either way)
        flops = counter.get_total_flops()
        for _ in range(args.iters):
            for variant in variants:  # alternate, so both see the same clocks and neighbours
                set_fusion(variant == "fused")
                if mesh is not None:
                    dist.barrier()
                if on_gpu:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                model(*batch)
                if on_gpu:
                    torch.cuda.synchronize()
                times[variant].append(time.perf_counter() - start)
    by_variant = {v: statistics.median(t) for v, t in times.items()}
    times = times[variants[0]]
    seconds = statistics.median(times)
    backend = model.communicator.backend_name if model.communicator is not None else "none (one rank)"
    tflops = flops / seconds / 1e12
    result = {
        "config": args.config, "layers": config.num_layers, "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "world": world, "ulysses_transport": backend, "request": shape.as_dict(), "text_tokens": args.text_len,
        "flops_this_rank": flops, "seconds_per_call": seconds, "seconds_all": times, "achieved_tflops": tflops,
        "fusion": variants[0], "seconds_per_call_by_fusion": by_variant,
        "of_matmul_ceiling": tflops / MATMUL_CEILING_TFLOPS if on_gpu else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "weights": model.weights_source, "weight_init_s": build_s,
    }
    model.close()
    if rank == 0:
        print(json.dumps(result, indent=2))
        print(f"MiniMax H3 DiT ({args.config}, {config.num_layers} layers, random weights) "
              f"{shape.width}x{shape.height} {shape.frame_count} frames: {seconds * 1e3:.1f} ms/call, "
              f"{flops / 1e12:.1f} TFLOP on rank 0 -> {tflops:.1f} TFLOP/s" +
              (f" ({tflops / MATMUL_CEILING_TFLOPS:.0%} of the {MATMUL_CEILING_TFLOPS:.0f} TFLOP/s matmul ceiling)" if on_gpu else "") +
              f", Ulysses transport: {backend}, fusion: {variants[0]}")
        if len(variants) > 1:
            print("fusion side by side: " + ", ".join(f"{v} {t * 1e3:.1f} ms/call" for v, t in by_variant.items()))
        if args.output:
            with open(args.output, "w") as f:
                json.dump(result, f, indent=2)
    if mesh is not None:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
