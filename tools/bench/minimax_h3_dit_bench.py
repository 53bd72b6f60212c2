r"""One MiniMax H3 DiT call at a request's real token count: time, achieved TFLOP/s, peak memory.

    python tools/bench/minimax_h3_dit_bench.py                          # official config, 768p 5 s, one GPU
    torchrun --standalone --nproc-per-node=2 tools/bench/minimax_h3_dit_bench.py --layers 8 --ulysses 2
    torchrun --standalone --nproc-per-node=4 tools/bench/minimax_h3_dit_bench.py --tp 2 --ulysses 2 \
        --transports portable,auto                                      # TP2+Ulysses2, both transports side by side
    python tools/bench/minimax_h3_dit_bench.py --config tiny --device cpu --resolution 64 --duration 1   # smoke

Random bf16 weights (said so). FLOPs, on this rank (telefuser/profiling/flop_rates.py): matmuls as torch's
FlopCounterMode sees them dispatched during an extra untimed eager call, plus attention by formula (4·B·H·Sq·Sk·D per
call over the packed layout's documents, the padding document included, and the text refiner's attention over the
prompt on the rank that holds it), so backends outside aten (flash-attn-4, SageAttention) are counted like SDPA; with
torch SDPA the counter's own attention count is reported beside the formula's (they agree; CI checks it). Rates are
given against both ceilings: the lent H200's measured bf16 matmul rate (786 TFLOP/s, shared/notes) and the H200
datasheet's dense bf16 (989 TFLOP/s).
With --ulysses N (and optionally --tp M) under torchrun the model runs Ulysses over N ranks (TP over M inside each) with
the communicator's default transport (processes sharing one GPU use CUDA IPC), which proves the copy-engine path in the
real model.

--transports a,b,... compares Ulysses transports (auto, portable, ce-symm, ce-ipc, host-shm) in one process: the model
opens one communicator per transport (in the order given, on every rank alike), warms each up, then the timed calls
alternate between them (the order rotating every iteration), so every transport sees the same clocks and neighbours.
Each communicator is opened once and kept: re-opening it per switch would put its setup (buffers, peer mappings) into
the timed call. The table gives each transport's median s/call and its ratio to the first one; "runs on" is the
transport the communicator actually selected (a copy-engine transport that a group cannot use falls back to portable).
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

from telefuser.models.flags import SIZES
from telefuser.distributed.ulysses.selection import TRANSPORTS
from telefuser.models.minimax_h3.config import MiniMaxH3Config
from telefuser.models.minimax_h3.dit import STEREO
from telefuser.models.minimax_h3.packing import pack_layout
from telefuser.models.registry import get_spec
from telefuser.ops.attention_registry import AUTO
from telefuser.ops.fusion import set_fusion
from telefuser.pipelines.minimax_h3.shapes import plan_shape
from telefuser.profiling.flop_rates import (
    NO_ATTENTION_IMPLS,
    attention_flops,
    counted_flops,
    describe,
    dispatched_attention_flops,
    flop_counter,
    rate,
)
from telefuser.runtime import Runtime
from tools.bench.transport_ab import TransportSwitch, agree_on_arguments, default_transports, parse_transports, rotated

MODEL = get_spec("minimax_h3")


def parallel_label(tp: int, ulysses: int) -> str:
    parts = ([f"TP{tp}"] if tp > 1 else []) + ([f"Ulysses{ulysses}"] if ulysses > 1 else [])
    return "+".join(parts) or "one rank"


# -- the bench -------------------------------------------------------------------------------------------------------
def attention_flops_this_rank(model, batch_inputs, *, ulysses_rank: int, ulysses: int, tp: int) -> int:
    """One forward's attention on this rank, by formula. Every block attends within each document of the packed
    sequence (the valid rows, then the padding) with this rank's heads (H / TP / Ulysses after the scatter); the text
    refiner attends over the prompt with the TP rank's heads, on a rank that holds prompt rows."""
    if model.attn_impl in NO_ATTENTION_IMPLS:
        return 0
    config = model.config
    video, audio, text = batch_inputs[:3]
    layout = pack_layout(
        text_rows=text.shape[1],
        video_latent_thw=tuple(video.shape[2:]),
        audio_rows=audio.shape[2],
        audio_channels=STEREO,
        patch_size=config.patch_size,
        alignment=model.sequence_alignment,
        multiple_of=ulysses,
    )
    batch, heads, head_dim = video.shape[0], config.num_attention_heads // tp, config.attention_head_dim
    blocks = config.num_layers * sum(
        attention_flops(batch, heads // ulysses, stop - start, stop - start, head_dim)
        for start, stop in layout.documents
    )
    holds_text = layout.local_rows(ulysses_rank, ulysses).start < layout.text.stop
    refiner = (
        config.token_refiner_num_layers * attention_flops(batch, heads, text.shape[1], text.shape[1], head_dim)
        if holds_text
        else 0
    )
    return blocks + refiner


def inputs(config: MiniMaxH3Config, args, device, dtype):
    shape = plan_shape(duration_s=args.duration, resolution=args.resolution, aspect_ratio=args.aspect_ratio)
    g = torch.Generator(device="cpu").manual_seed(0)
    video = torch.randn(shape.video_latent_shape, generator=g).to(device)
    audio = torch.randn(shape.audio_latent_shape, generator=g).to(device)
    text = torch.randn(1, args.text_len, config.text_dim, generator=g).to(device, dtype)
    t = torch.full((1,), 500.0, device=device)
    return shape, (video, audio, text, t, t.clone())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=SIZES, default="official")
    p.add_argument("--layers", type=int, default=None, help="override num_layers (fit several ranks on one GPU)")
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--resolution", type=int, default=768)
    p.add_argument("--aspect-ratio", default="16:9")
    p.add_argument("--text-len", type=int, default=256, help="prompt tokens after the text encoder")
    p.add_argument("--ulysses", type=int, default=1)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (world size = tp x ulysses)")
    p.add_argument(
        "--transports",
        type=parse_transports,
        default=None,
        help=f"comma-separated Ulysses transports to time side by side ({', '.join(TRANSPORTS)}); "
        "default: the communicator's default ($TELEFUSER_ULYSSES_TRANSPORT, else auto)",
    )
    # the model's --attn-impl (auto, its default, included), plus the attention-free one that times everything else
    MODEL.flag("attn_impl").add_to(p, choices=(AUTO, *MODEL.attention_impls, *NO_ATTENTION_IMPLS))
    p.add_argument("--iters", type=int, default=3)
    p.add_argument(
        "--fusion",
        choices=["fused", "eager", "both"],
        default="fused",
        help="elementwise chains (norms, AdaLN, RoPE) as compiled kernels on CUDA, or eager ops; "
        "'both' alternates them in this run",
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--output", default=None, help="JSON file for the result")
    args = p.parse_args(argv)
    if args.transports is None:
        args.transports = default_transports()
    if args.iters < 1 or args.ulysses < 1 or args.tp < 1:
        p.error("--iters, --ulysses and --tp must be at least 1")
    if len(args.transports) > 1 and args.ulysses < 2:
        p.error("--transports with several transports compares Ulysses transports: run with --ulysses 2 or more")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    config = MiniMaxH3Config() if args.config == "official" else MiniMaxH3Config.tiny()
    if args.layers:
        config = replace(config, num_layers=args.layers)
    on_gpu = args.device == "cuda"
    if int(os.environ.get("WORLD_SIZE", "1")) == 1 and len(args.transports) > 1:
        raise SystemExit("--transports with several transports needs Ulysses ranks: start it with torchrun")
    runtime = Runtime.launch(ulysses_degree=args.ulysses, tp_degree=args.tp, device=args.device)
    if runtime.mesh is not None:
        agree_on_arguments(args)
    mesh, device, dtype, rank = runtime.mesh, runtime.device, runtime.dtype, runtime.rank
    if args.attn_impl == AUTO:  # what the model's entry points run: its preference that is usable here
        args.attn_impl = MODEL.attention_impl(args, runtime)

    t0 = time.perf_counter()
    model = MODEL.loader("random")(
        config, seed=0, device=device, dtype=dtype, attn_impl=args.attn_impl, init_on_device=on_gpu
    ).eval()
    build_s = time.perf_counter() - t0
    transports = args.transports
    # collective: TP slicing, then one communicator per transport
    switch = TransportSwitch(model, MODEL, runtime, transports)
    shape, batch = inputs(config, args, device, dtype)
    variants = ["fused", "eager"] if args.fusion == "both" else [args.fusion]
    samples = {(name, variant): [] for name in transports for variant in variants}
    counter = flop_counter()
    with torch.inference_mode():
        for name in transports:  # warm-up each (allocator, kernels, compilation, communicator setup and targets)
            switch.use(name)
            for variant in variants:
                set_fusion(variant == "fused")
                model(*batch)
        switch.use(transports[0])
        set_fusion(False)  # count in eager mode: the dispatch mode and the compiled kernel do not mix
        with counter:
            model(*batch)  # this rank's FLOP count (elementwise work is not counted either way)
        counted = counted_flops(counter)
        attention_dispatched = dispatched_attention_flops(counter)
        attention_formula = attention_flops_this_rank(
            model, batch, ulysses_rank=mesh.ulysses_rank if mesh else 0, ulysses=args.ulysses, tp=args.tp
        )
        flops = counted + attention_formula
        for iteration in range(args.iters):
            for name in rotated(transports, iteration):  # alternate, so all see the same clocks and neighbours
                switch.use(name)
                for variant in variants:
                    set_fusion(variant == "fused")
                    if mesh is not None:
                        dist.barrier()
                    if on_gpu:
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    model(*batch)
                    if on_gpu:
                        torch.cuda.synchronize()
                    samples[name, variant].append(time.perf_counter() - start)
    first = transports[0]
    by_variant = {v: statistics.median(samples[first, v]) for v in variants}
    times = samples[first, variants[0]]
    seconds = statistics.median(times)
    backend = switch.runs_on(first)
    by_transport = {}
    for name in transports:
        median = statistics.median(samples[name, variants[0]])
        by_transport[name] = {
            "runs_on": switch.runs_on(name),
            "fallback_reasons": switch.fallback_reasons(name),
            "seconds_per_call": median,
            "seconds_all": samples[name, variants[0]],
            "ratio_to_first": median / seconds,
            "seconds_per_call_by_fusion": {v: statistics.median(samples[name, v]) for v in variants},
        }
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu"
    achieved = rate(flops, seconds, device_name)
    result = {
        "config": args.config,
        "attn_impl": args.attn_impl,  # what ran (`auto` resolved)
        "layers": config.num_layers,
        "device": device_name,
        "world": runtime.world_size,
        "tp": args.tp,
        "ulysses": args.ulysses,
        "ulysses_transport": backend,
        "request": shape.as_dict(),
        "text_tokens": args.text_len,
        "flops_this_rank": flops,
        "flops_counted": counted,
        "attention_flops_formula": attention_formula,
        "attention_flops_dispatched": attention_dispatched,
        "seconds_per_call": seconds,
        "seconds_all": times,
        **achieved,
        "fusion": variants[0],
        "seconds_per_call_by_fusion": by_variant,
        "transports": transports,
        "by_transport": by_transport,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "weights": model.weights_source,
        "weight_init_s": build_s,
    }
    switch.close()
    if rank == 0:
        print(json.dumps(result, indent=2))
        print(
            f"MiniMax H3 DiT ({args.config}, {config.num_layers} layers, random weights) "
            f"{shape.width}x{shape.height} {shape.frame_count} frames: {seconds * 1e3:.1f} ms/call, "
            f"{flops / 1e12:.1f} TFLOP on rank 0 ({attention_formula / 1e12:.1f} of them attention) -> "
            f"{describe(achieved)}, Ulysses transport: {backend}, fusion: {variants[0]}"
        )
        if len(variants) > 1:
            print("fusion side by side: " + ", ".join(f"{v} {t * 1e3:.1f} ms/call" for v, t in by_variant.items()))
        if len(transports) > 1:
            print(transport_table(result, parallel_label(args.tp, args.ulysses), variants, args.iters))
        if args.output:
            with open(args.output, "w") as f:
                json.dump(result, f, indent=2)
    if mesh is not None:
        dist.destroy_process_group()
    return 0


def transport_table(result: dict, label: str, variants: list[str], iters: int) -> str:
    first = result["transports"][0]
    lines = [
        f"MiniMax H3 {label}: DiT time per call ({result['config']}, {result['layers']} layers, "
        f"{result['request']['width']}x{result['request']['height']} {result['request']['frame_count']} frames, "
        f"median of {iters})",
        "transport | runs on  | " + " | ".join(f"ms/call ({v})" for v in variants) + f" | vs {first}",
    ]
    for name, row in result["by_transport"].items():
        cells = " | ".join(f"{row['seconds_per_call_by_fusion'][v] * 1e3:{len(f'ms/call ({v})')}.1f}" for v in variants)
        lines.append(f"{name:9s} | {row['runs_on']:8s} | {cells} | {row['ratio_to_first']:.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
