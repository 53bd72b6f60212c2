"""The LingBot condition encode and chunk decode (diffusers' Wan 2.1 VAE) in each layout and kernel choice, side by
side in one run, with the quality of each against the fp32 decode.

    python -m tools.bench.wan_vae_bench                                          # official size on the GPU
    python -m tools.bench.wan_vae_bench --size tiny --resolution 64x48 --device cpu --iters 1   # CPU smoke run

Variants: ``fp32``, ``bf16``, ``bf16+fused`` (norm + SiLU compiled into one kernel), ``bf16+cl`` (channels-last
weights), ``bf16+cl+fused``. Each decodes a warm-up chunk and then --iters steady chunks of --chunk-frames latent
frames (the same latents for every variant, so the caches see the same history), and stream-encodes the same
number of black frame groups after the reference image (the condition; steady-state reuse off, so every group
runs the encoder). Prints median seconds per chunk and the last chunk's PSNR against fp32 and against bf16.
Random weights (said so): timings and error figures only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from telefuser.pipelines.wan.vae import WanVideoVAE
from telefuser.pipelines.wan.vae_fusion import fuse_norm_activations, to_channels_last

VARIANTS = ("fp32", "bf16", "bf16+fused", "bf16+cl", "bf16+cl+fused")


def build(variant: str, size: str, device) -> WanVideoVAE:
    dtype = torch.float32 if variant == "fp32" else torch.bfloat16
    vae = WanVideoVAE.random(size, seed=0, device=device, dtype=dtype)
    if "+cl" in variant:
        to_channels_last(vae.model)
    if "fused" in variant:
        fuse_norm_activations(vae.model, compile=True)
    return vae


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pixels in [-1, 1] (peak-to-peak 2)."""
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(4.0 / mse)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(vae: WanVideoVAE, latents: list[torch.Tensor], image: torch.Tensor, frames: int, device):
    decoder, encoder = vae.stream_decoder(), vae.stream_encoder(image, reuse_steady_state=False)
    decode_s, encode_s = [], []
    with torch.inference_mode():
        out = decoder.decode(latents[0])  # warm-up chunk: compilation, cuDNN plans, the cache's first state
        encoder.next(1 + frames)
        for z in latents[1:]:
            sync(device)
            start = time.perf_counter()
            out = decoder.decode(z)
            sync(device)
            decode_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            cond = encoder.next(frames)
            sync(device)
            encode_s.append(time.perf_counter() - start)
    decoder.close(), encoder.close()
    return statistics.median(decode_s), statistics.median(encode_s), out.float().cpu(), cond.float().cpu()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=["tiny", "official"], default="official")
    p.add_argument("--resolution", default="832x480", help="WIDTHxHEIGHT of the frames")
    p.add_argument("--chunk-frames", type=int, default=4, help="latent frames per chunk (the pipeline's 4)")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    width, height = (int(v) for v in args.resolution.lower().split("x"))
    if width % 8 or height % 8:
        p.error(f"--resolution must be a multiple of 8 in both directions, got {args.resolution}")
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    latents = [
        torch.randn(1, 16, args.chunk_frames, height // 8, width // 8, generator=g).to(device)
        for _ in range(1 + args.iters)
    ]
    image = (torch.rand(3, height, width, generator=g) * 2 - 1).to(device)
    print(f"Wan 2.1 VAE ({args.size}, random weights: timings and error figures only), {width}x{height}", flush=True)
    results, outputs = {}, {}
    for variant in variants:
        vae = build(variant, args.size, device)
        decode_s, encode_s, frames, cond = measure(vae, latents, image, args.chunk_frames, device)
        results[variant] = {"decode_s": decode_s, "encode_s": encode_s}
        outputs[variant] = (frames, cond)
        print(f"  {variant}: decode {decode_s:.4f} s, condition {encode_s:.4f} s", file=sys.stderr, flush=True)
        del vae
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for variant, (frames, cond) in outputs.items():
        for ref in ("fp32", "bf16"):
            if ref in outputs and ref != variant:
                results[variant][f"decode_psnr_vs_{ref}_db"] = psnr(frames, outputs[ref][0])
                ref_cond = outputs[ref][1]
                results[variant][f"condition_rel_vs_{ref}"] = ((cond - ref_cond).norm() / ref_cond.norm()).item()
    base = results.get("bf16", next(iter(results.values())))
    print(
        "\n| variant | decode s/chunk | condition s/chunk | decode+condition | vs bf16 | PSNR vs fp32 | PSNR vs bf16 |"
        "\n|---|---|---|---|---|---|---|"
    )
    for variant, r in results.items():
        total = r["decode_s"] + r["encode_s"]
        speed = (base["decode_s"] + base["encode_s"]) / total
        cells = [f"{r.get(f'decode_psnr_vs_{ref}_db', float('nan')):.1f} dB" for ref in ("fp32", "bf16")]
        print(
            f"| {variant} | {r['decode_s']:.4f} | {r['encode_s']:.4f} | {total:.4f} | {speed:.2f}x | "
            + " | ".join(cells)
            + " |"
        )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(
            json.dumps({"args": vars(args) | {"output": str(args.output)}, "results": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
