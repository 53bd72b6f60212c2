"""The quality gate for ``sage_sm90`` (SageAttention2's SM90 kernel): the models' outputs against cuDNN bf16 attention.

    python -m tools.validation.sage_quality_gate --output sage_gate.json          # both models, official sizes
    python -m tools.validation.sage_quality_gate --models lingbot_world_v2 --session-frames 41
    python -m tools.validation.sage_quality_gate --models wan2.2-t2v-a14b --wan-frames 81

Random weights (no checkpoint is used here): random-weight attention is flatter than a trained model's, which hides
quantization error in the scores, so every model row also runs "peaky": the Q RMSNorm weights times --peak-gain
(sharper softmax). Keys with a per-channel offset are the kernel-level case of tools/bench/attention_sage_bench.py.

- ``minimax_h3``: one official-width MiniMax H3 DiT call (768p, 5 s, packed documents; bf16 GEMMs) with ``sage_sm90``
  against the same call with ``sdpa`` (cuDNN bf16): cosine and relative L2 of the prediction;
- ``lingbot_world_v2``, chunks: a LingBot-World v2 session of --chunks chunks at the official size (832×480, 3 latent frames a
  chunk, each forward committing), the same inputs through a ``sage_sm90`` session (window kept INT8/FP8) and an
  ``sdpa`` one: every chunk's prediction compared, the worst chunk reported (the last ones read a full window);
- ``wan2.2-t2v-a14b``: one Wan 2.2 T2V-A14B expert's denoising step at --resolution (the CFG batch of two, --wan-frames frames,
  blocks as compiled regions) with each of --wan-candidates against bf16 GEMMs with ``sdpa``: ``sage_sm90`` (bf16
  GEMMs), ``fp8`` (FP8 GEMMs with ``cudnn_fp8`` attention), ``fp8_gemm`` (FP8 GEMMs with ``sdpa``) and ``fp8_sage``
  (FP8 GEMMs with ``sage_sm90``); the FP8 candidates share one quantized model;
- ``lingbot_world_v2``, session: a whole `WorldSessionPipeline` session (tools/bench/lingbot_session_ab.py's helpers, its
  control trace and image) with ``sage_sm90`` against ``sdpa``: latents' relative L2 and cosine, frames' PSNR.

PASS when every row's cosine is >= --min-cosine (0.99, as for FP8) and, with --min-psnr, the session's PSNR is at
least that. Prints a markdown table. Needs an SM90 GPU and the SM90 extensions (ops/README.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


MINIMAX, LINGBOT, WAN = "minimax_h3", "lingbot_world_v2", "wan2.2-t2v-a14b"  # the registry names gated here
GATED = (MINIMAX, LINGBOT, WAN)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=GATED, default=list(GATED), help="registry names (default: all)")
    p.add_argument("--min-cosine", type=float, default=0.99)
    p.add_argument("--min-psnr", type=float, default=None, help="also require the LingBot session's frames PSNR")
    p.add_argument("--peak-gain", type=float, default=4.0, help="Q RMSNorm weights times this in the peaky rows")
    p.add_argument("--chunks", type=int, default=8, help="LingBot chunks in the chunk comparison")
    p.add_argument("--session-frames", type=int, default=41, help="frames of the LingBot pipeline session (0: skip)")
    p.add_argument("--resolution", default="832x480", help="LingBot's and Wan's canvas, WxH")
    p.add_argument("--wan-frames", type=int, default=81, help="frames of the Wan 2.2 step (4n + 1)")
    p.add_argument(
        "--wan-candidates",
        nargs="+",
        choices=sorted(WAN_CANDIDATES),
        default=sorted(WAN_CANDIDATES),
        help="what the Wan step is gated in against bf16 GEMMs with cuDNN bf16 attention",
    )
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    o, r = out.double().flatten(), ref.double().flatten()
    return {"cosine": F.cosine_similarity(o, r, dim=0).item(), "relative_l2": ((o - r).norm() / r.norm()).item()}


class scaled_norms:
    """Multiply the given norm weights by `gain` inside the block (restored after)."""

    def __init__(self, norms, gain: float):
        self.norms, self.gain = list(norms), gain

    def __enter__(self):
        for norm in self.norms:
            norm.weight.data.mul_(self.gain)

    def __exit__(self, *exc):
        for norm in self.norms:
            norm.weight.data.div_(self.gain)


# -- MiniMax H3 ---------------------------------------------------------------------------------------------------------
def minimax_rows(args) -> list[dict]:
    from telefuser.models.minimax_h3.config import MiniMaxH3Config
    from tools.bench.minimax_h3_dit_bench import MODEL, inputs

    config = MiniMaxH3Config()
    model = MODEL.loader("random")(
        config, seed=0, device=torch.device("cuda"), dtype=torch.bfloat16, attn_impl="sdpa", init_on_device=True
    ).eval()
    bench_args = argparse.Namespace(duration=5.0, resolution=768, aspect_ratio="16:9", text_len=256)
    _, batch = inputs(config, bench_args, torch.device("cuda"), torch.bfloat16)
    rows = []
    for variant in ("random weights", "peaky"):
        norms = [block.attn.q_norm for block in model.blocks] if variant == "peaky" else []
        with torch.inference_mode(), scaled_norms(norms, args.peak_gain):
            outputs = {}
            for impl in ("sdpa", "sage_sm90"):
                model.attn_impl = impl
                start = time.perf_counter()
                out = model(*batch)
                out = out[0] if isinstance(out, (tuple, list)) else out
                torch.cuda.synchronize()
                outputs[impl] = (out.float().cpu(), time.perf_counter() - start)
        rows.append(
            {
                "model": "MiniMax H3 DiT call (official, 768p 5 s, bf16 GEMMs)",
                "variant": variant,
                **compare(outputs["sage_sm90"][0], outputs["sdpa"][0]),
                "seconds": {impl: s for impl, (_, s) in outputs.items()},
            }
        )
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


# -- Wan 2.2 ------------------------------------------------------------------------------------------------------------
WAN_CANDIDATES = {  # name -> (quantization, attention, what the row says)
    "sage_sm90": ("none", "sage_sm90", "bf16 GEMMs, sage_sm90"),
    "fp8": ("fp8", "cudnn_fp8", "FP8 GEMMs, cuDNN FP8 attention"),
    "fp8_gemm": ("fp8", "sdpa", "FP8 GEMMs, cuDNN bf16 attention"),
    "fp8_sage": ("fp8", "sage_sm90", "FP8 GEMMs, sage_sm90"),
}


def wan_rows(args) -> list[dict]:
    from telefuser.models.registry import get_spec

    spec = get_spec("wan2.2-t2v-a14b")
    config = spec.config_of("official")
    width, height = (int(x) for x in args.resolution.split("x"))
    if (args.wan_frames - 1) % 4:
        raise SystemExit(f"--wan-frames must be 4n + 1, got {args.wan_frames}")
    grid = {"frames": (args.wan_frames - 1) // 4 + 1, "height": height // 8, "width": width // 8}
    model = spec.build_random(
        config, seed=0, device=torch.device("cuda"), dtype=torch.bfloat16, attn_impl="sdpa", init_on_device=True
    ).eval()
    example = spec.example_forward(model, seed=1, batch=2, text_rows=config.text_len, **grid)
    variants = {"random weights": [], "peaky": [block.self_attn.norm_q for block in model.blocks]}

    def run(variant: str) -> tuple[torch.Tensor, float]:
        with torch.inference_mode(), scaled_norms(variants[variant], args.peak_gain):
            start = time.perf_counter()
            out = example.run()[0]
            torch.cuda.synchronize()
            return out.float().cpu(), time.perf_counter() - start  # the first call of each setting compiles

    reference = {variant: run(variant) for variant in variants}  # bf16 GEMMs, cuDNN bf16 attention
    rows = []
    quantized = "none"
    # FP8 last: quantizing replaces the bf16 weights
    for name in sorted(args.wan_candidates, key=lambda n: WAN_CANDIDATES[n][0] != "none"):
        quantization, attention, label = WAN_CANDIDATES[name]
        if quantization != "none" and quantized != quantization:  # the FP8 candidates share one quantized model
            model.quantize(quantization)
            quantized = quantization
        model.attn_impl = attention
        for variant in variants:
            out, seconds = run(variant)
            rows.append(
                {
                    "model": f"Wan 2.2 T2V-A14B step ({args.resolution}, {args.wan_frames} frames, CFG batch, {label})",
                    "variant": variant,
                    **compare(out, reference[variant][0]),
                    "seconds": {"sdpa": reference[variant][1], name: seconds},
                }
            )
    return rows  # the model goes with this frame


# -- LingBot-World v2 ---------------------------------------------------------------------------------------------------
def lingbot_chunk_rows(args) -> list[dict]:
    from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit

    cfg = LingBotWorldV2Config()
    width, height = (int(x) for x in args.resolution.split("x"))
    grid = (3, height // 8, width // 8)  # latent frames, h, w of a chunk
    tokens_per_frame = (grid[1] // 2) * (grid[2] // 2)
    model = build_random_lingbot_dit(cfg, seed=0, device="cuda", dtype=torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    text = torch.randn(1, 64, cfg.text_dim, generator=g).to("cuda", torch.bfloat16)
    chunks = [
        (
            torch.randn(1, cfg.in_dim, *grid, generator=g).to("cuda"),
            torch.randn(1, grid[0] * tokens_per_frame, cfg.camera_feature_dim, generator=g).to("cuda"),
        )
        for _ in range(args.chunks)
    ]
    rows = []
    for variant in ("random weights", "peaky"):
        norms = [block.self_attn.norm_q for block in model.blocks] if variant == "peaky" else []
        with torch.inference_mode(), scaled_norms(norms, args.peak_gain):
            outputs = {}
            for impl in ("sdpa", "sage_sm90"):
                model.attn_impl = impl
                session = model.new_window(1, text, tokens_per_frame=tokens_per_frame)
                outs = []
                for latents, camera in chunks:
                    t = torch.tensor([500.0])
                    outs.append(model.forward_chunk(session, latents, t, camera, update_cache=True).float().cpu())
                session.close()
                outputs[impl] = outs
        per_chunk = [compare(a, b) for a, b in zip(outputs["sage_sm90"], outputs["sdpa"], strict=True)]
        worst = min(per_chunk, key=lambda m: m["cosine"])
        rows.append(
            {
                "model": f"LingBot chunk forwards ({args.chunks} chunks, {args.resolution}, window of "
                f"{cfg.local_attn_size} frames)",
                "variant": variant,
                **worst,
                "per_chunk": per_chunk,
            }
        )
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def lingbot_session_row(args) -> dict:
    from telefuser.pipelines.lingbot_world_v2 import WorldSessionPipeline, build_lingbot_pipeline, load_control_trace
    from telefuser.runtime import Runtime
    from tools.bench.lingbot_session_ab import CONTROLS, IMAGE, AttentionImplDiT, fp8_gate, run_session

    device = torch.device("cuda")
    base = build_lingbot_pipeline(config="official", runtime=Runtime.one_rank(device, torch.bfloat16), seed=0)
    trace = load_control_trace(CONTROLS)
    session_args = argparse.Namespace(resolution=args.resolution, num_frames=args.session_frames)
    results = {}
    for impl in ("sdpa", "sage_sm90"):
        dit = base.dit if impl == "sdpa" else AttentionImplDiT(base.dit, impl)
        pipe = WorldSessionPipeline(
            dit,
            base.prompt_encoder,
            base.vae,
            device=device,
            dit_dtype=torch.bfloat16,
            camera_factory=base.camera_factory,
            weights=base.weights,
        )
        results[impl] = run_session(pipe, session_args, trace, IMAGE)
    gate = fp8_gate(results["sage_sm90"], results["sdpa"])  # the same metrics as FP8's gate
    return {
        "model": f"LingBot session ({args.session_frames} frames, {args.resolution}, pipeline, fp32 VAE)",
        "variant": "random weights",
        "cosine": gate["latents_cosine"],
        "relative_l2": gate["latents_relative_l2"],
        "frames_psnr_db": gate["frames_psnr_db"],
        "steady_fps": {impl: r["summary"]["steady_compute_fps"] for impl, r in results.items()},
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    from telefuser.ops.attention_sage import default_granularity, sage_sm90_available, sage_sm90_build_info

    ok, why = sage_sm90_available()
    needs_sage = MINIMAX in args.models or LINGBOT in args.models or "sage_sm90" in args.wan_candidates
    if needs_sage and not ok:
        print(f"sage_quality_gate: sage_sm90 is not usable here: {why}", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {why}; granularity {default_granularity()}")
    rows = []
    if MINIMAX in args.models:
        rows += minimax_rows(args)
    if LINGBOT in args.models:
        rows += lingbot_chunk_rows(args)
        if args.session_frames:
            rows.append(lingbot_session_row(args))
    if WAN in args.models:
        rows += wan_rows(args)
    failed = []
    print(
        "\n| model | variant | cosine vs cuDNN bf16 | relative L2 | frames PSNR | verdict |\n|---|---|---|---|---|---|"
    )
    for row in rows:
        passes = row["cosine"] >= args.min_cosine
        psnr = row.get("frames_psnr_db")
        if psnr is not None and args.min_psnr is not None:
            passes = passes and psnr >= args.min_psnr
        row["passes"] = passes
        if not passes:
            failed.append(f"{row['model']} / {row['variant']}")
        shown = "-" if psnr is None else ("inf" if math.isinf(psnr) else f"{psnr:.1f} dB")
        print(
            f"| {row['model']} | {row['variant']} | {row['cosine']:.5f} | {row['relative_l2']:.3e} | {shown} | "
            f"{'PASS' if passes else 'FAIL'} |"
        )
    verdict = "FAIL" if failed else "PASS"
    print(f"\n{verdict}: cosine >= {args.min_cosine}" + (f", PSNR >= {args.min_psnr} dB" if args.min_psnr else ""))
    if failed:
        print(f"failed: {failed}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "sage_sm90": why,
            "sage_build": sage_sm90_build_info(),
            "granularity": default_granularity(),
            "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows,
            "verdict": verdict,
        }
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
