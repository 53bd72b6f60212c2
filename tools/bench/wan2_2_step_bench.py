"""One Wan 2.2 T2V-A14B denoising step, ours against diffusers' WanTransformer3DModel at its best settings.

    python -m tools.bench.wan2_2_step_bench                                   # 480p and 720p, 81 frames, one H100
    python -m tools.bench.wan2_2_step_bench --resolutions 720p --attn-impl sage_sm90 --sides ours
    python -m tools.bench.wan2_2_step_bench --config tiny --device cpu --resolutions 64x32 --frames 5 \\
        --warmup 1 --iters 1 --compile-backend none                           # CPU smoke run

A step is one call of one expert (the high-noise one; both have the same architecture) on the CFG batch of two
(cond, uncond) at the release's 81 frames (21 latent frames through the Wan 2.1 VAE's 4 x 8 x 8 stride): 32,760
tokens at 480p (832x480), 75,600 at 720p (1280x720). Both models get random bf16 weights (outputs meaningless; said
so) with the fp32 parts each keeps (ours: time embedding, modulation, head; diffusers' `_keep_in_fp32_modules`), and
the same inputs: latents, the two timesteps and 512-row prompt states.

ours        `Wan22DiT` from the spec's random loader: every block one compiled region (Inductor), attention by
            --attn-impl (the spec's flag; sdpa runs cuDNN first on CUDA), --quantization fp8 optional. The prompt's
            cross-attention K/V are computed once per request (`text_kv`), outside the step.
diffusers   `WanTransformer3DModel` at its best settings: `compile_repeated_blocks` (torch.compile of each
            WanTransformerBlock) and its own cuDNN attention backend (`set_attention_backend("_native_cudnn")`;
            diffusers' native SDPA off CUDA). It embeds the prompt and projects its K/V inside every call (0.13% of
            the step's FLOPs at 480p, 3.35 PFLOP; 0.03% at 720p, 13.0 PFLOP).

The two are built one after the other (one A14B expert is ~28 GB in bf16; two beside their activations may not fit
80 GB), each freed before the next. Per resolution: --warmup calls (the first compiles), then --iters timed calls;
the table gives the median seconds per step, the achieved TFLOP/s (the spec's FLOP count of our forward, for both),
the peak allocated memory over the timed calls (weights included) and ours' speed-up. --output writes it as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from telefuser.models.registry import get_spec
from telefuser.models.wan.example import random_inputs
from telefuser.ops.fusion import fusion_enabled, set_fusion
from telefuser.ops.regions import compile_regions_on

SPEC = get_spec("wan2.2-t2v-a14b")
RESOLUTIONS = {"480p": (832, 480), "720p": (1280, 720)}
VAE_STRIDE = (4, 8, 8)  # the Wan 2.1 VAE's (frames, height, width) stride, T2V-A14B's
CFG_BATCH = 2
DTYPE = torch.bfloat16
SIDES = ("ours", "diffusers")


# -- shapes ----------------------------------------------------------------------------------------------------------
def parse_resolution(text: str) -> tuple[str, int, int]:
    """``480p`` | ``720p`` | ``WxH`` -> (label, width, height)."""
    if text in RESOLUTIONS:
        return (text, *RESOLUTIONS[text])
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 480p, 720p or WxH") from None
    return text, width, height


def latent_grid(config, frames: int, width: int, height: int) -> tuple[int, int, int]:
    """(latent frames, latent height, latent width) of a video, checked to patch evenly."""
    st, sh, sw = VAE_STRIDE
    pt, ph, pw = config.patch_size
    if (frames - 1) % st:
        raise SystemExit(f"--frames must be 4n + 1 (the VAE keeps the first frame and 4 per latent), got {frames}")
    if height % (sh * ph) or width % (sw * pw):
        raise SystemExit(f"{width}x{height} must be multiples of {sw * pw}x{sh * ph} (VAE stride x patch)")
    return (frames - 1) // st + 1, height // sh, width // sw


# -- timing -----------------------------------------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step, device: torch.device, *, warmup: int, iters: int) -> dict:
    """--warmup calls, then --iters timed ones: their seconds, the median, and the peak allocated memory over the
    timed calls (CUDA only)."""
    for _ in range(warmup):
        out = step()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        out = step()
        synchronize(device)
        times.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"median_s": statistics.median(times), "times_s": times, "peak_bytes": peak, "finite": out_is_finite(out)}


def out_is_finite(out) -> bool:
    return bool(torch.isfinite(out.float()).all())


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def free(device: torch.device) -> None:
    """Drop compiled code and cached blocks between the two sides, so the second starts from the same memory."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- the two sides ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def our_regions(backend: str, device: torch.device):
    """Our blocks as compiled regions with `backend` on `device` (CUDA compiles by default), or eagerly (none)."""
    if backend == "none":
        before = fusion_enabled()
        set_fusion(False)
        try:
            yield
        finally:
            set_fusion(before)
    else:
        with compile_regions_on(device.type, backend=backend):
            yield


def run_ours(args, config, grids, device) -> list[dict]:
    results = time_ours(args, config, grids, device)  # the model was local there: it is garbage now
    free(device)
    return results


def run_diffusers(args, config, grids, device) -> list[dict]:
    results = time_diffusers(args, config, grids, device)
    free(device)
    return results


def time_ours(args, config, grids, device) -> list[dict]:
    model = SPEC.build_random(
        config,
        seed=args.seed,
        device=device,
        dtype=DTYPE,
        attn_impl=args.attn_impl,
        init_on_device=device.type == "cuda",
    )
    model.quantize(args.quantization)
    weights = weight_bytes(model)
    results = []
    with our_regions(args.compile_backend, device):
        for frames, height, width in grids:
            shape = dict(batch=CFG_BATCH, frames=frames, height=height, width=width, text_rows=config.text_len)
            example = SPEC.example_forward(model, seed=args.seed, **shape)
            result = time_step(lambda: example.run()[0], device, warmup=args.warmup, iters=args.iters)
            results.append({**result, "weights_bytes": weights})
    return results


def time_diffusers(args, config, grids, device) -> list[dict]:
    from tools.bench.lingbot_world_bench import build_diffusers_wan  # the same construction as LingBot's bench

    torch.manual_seed(args.seed)  # diffusers' own (random) init
    model = build_diffusers_wan(config, device, DTYPE)
    model.requires_grad_(False)
    model.set_attention_backend(args.diffusers_attention)
    if args.compile_backend != "none":
        model.compile_repeated_blocks(backend=args.compile_backend)  # as the LingBot bench runs it on the device
    weights = weight_bytes(model)
    results = []
    for frames, height, width in grids:
        shape = dict(batch=CFG_BATCH, frames=frames, height=height, width=width, text_rows=config.text_len)
        latents, t, text = random_inputs(config, seed=args.seed, device=device, **shape)
        latents, text = latents.to(DTYPE), text.to(DTYPE)  # diffusers' pipeline feeds both in the model's dtype

        def step():
            with torch.inference_mode():
                return model(hidden_states=latents, timestep=t, encoder_hidden_states=text, return_dict=False)[0]

        results.append({**time_step(step, device, warmup=args.warmup, iters=args.iters), "weights_bytes": weights})
    return results


# -- the report -------------------------------------------------------------------------------------------------------
def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def table(report: dict) -> str:
    lines = [
        "| resolution | latent grid | tokens | side | s/step | TFLOP/s | peak GiB | weights GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        for side in report["sides"]:
            r = row[side]
            tflops = row["flops"] / r["median_s"] / 1e12
            lines.append(
                f"| {row['resolution']} | {'x'.join(map(str, row['latent']))} | {row['tokens']:,} | {side} | "
                f"{r['median_s']:.3f} | {tflops:.1f} | {gib(r['peak_bytes'])} | {gib(r['weights_bytes'])} |"
            )
    speedups = [f"{row['resolution']}: {row['speedup']:.2f}x" for row in report["rows"] if "speedup" in row]
    if speedups:
        lines.append("\nours against diffusers (its median over ours): " + ", ".join(speedups))
    return "\n".join(lines)


def describe_device(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=SPEC.sizes, default="official", help="the DiT's size (default %(default)s)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--resolutions", default="480p,720p", help="comma-separated 480p, 720p or WxH (%(default)s)")
    p.add_argument("--frames", type=int, default=81, help="video frames, 4n + 1 (default %(default)s)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per resolution and side, the first compiles")
    p.add_argument("--iters", type=int, default=5, help="timed calls per resolution and side")
    SPEC.add_flags(p, only=("attn_impl", "quantization"))
    p.add_argument(
        "--diffusers-attention",
        default=None,
        help="diffusers' attention backend (default: _native_cudnn on CUDA, native elsewhere)",
    )
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of both sides; none: eager")
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of ours and diffusers (%(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, default=None, help="write the report as JSON")
    args = p.parse_args(argv)
    args.resolutions = [parse_resolution(r) for r in args.resolutions.split(",")]
    args.sides = [s for s in SIDES if s in args.sides.split(",")]  # a fixed order: ours first
    if not args.sides:
        p.error(f"--sides names none of {', '.join(SIDES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.diffusers_attention is None:
        args.diffusers_attention = "_native_cudnn" if device.type == "cuda" else "native"
    # "auto" resolved for this device, an explicit one checked to be installed
    args.attn_impl = SPEC.attention_impl(args, SimpleNamespace(device=device, world_size=1))
    config = SPEC.config_of(args.config)
    grids = [latent_grid(config, args.frames, width, height) for _, width, height in args.resolutions]
    runners = {"ours": run_ours, "diffusers": run_diffusers}
    measured = {side: runners[side](args, config, grids, device) for side in args.sides}

    rows = []
    for i, ((label, width, height), grid) in enumerate(zip(args.resolutions, grids, strict=True)):
        shape = dict(batch=CFG_BATCH, frames=grid[0], height=grid[1], width=grid[2], text_rows=config.text_len)
        pt, ph, pw = config.patch_size
        row = {
            "resolution": label,
            "width": width,
            "height": height,
            "latent": list(grid),
            "tokens": (grid[0] // pt) * (grid[1] // ph) * (grid[2] // pw),
            "flops": SPEC.forward_flops(config, **shape),
            **{side: measured[side][i] for side in args.sides},
        }
        if len(args.sides) == 2:
            row["speedup"] = row["diffusers"]["median_s"] / row["ours"]["median_s"]
        rows.append(row)
    report = {
        "model": SPEC.name,
        "config": args.config,
        "weights": "random (no checkpoint): timings only, outputs meaningless",
        "device": describe_device(device),
        "dtype": "bfloat16",
        "frames": args.frames,
        "batch": CFG_BATCH,
        "sides": args.sides,
        "ours": {"attn_impl": args.attn_impl, "quantization": args.quantization, "regions": args.compile_backend},
        "diffusers": {
            "attention_backend": args.diffusers_attention,
            "compile": "none"
            if args.compile_backend == "none"
            else f"compile_repeated_blocks ({args.compile_backend})",
        },
        "warmup": args.warmup,
        "iters": args.iters,
        "rows": rows,
    }
    print(
        f"Wan 2.2 T2V-A14B step ({args.config}, random bf16 weights) on {report['device']}, {args.frames} frames, "
        f"CFG batch {CFG_BATCH}; ours: {args.attn_impl}, {args.quantization}; diffusers: {args.diffusers_attention}"
    )
    print(table(report))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
