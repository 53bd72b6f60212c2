"""LingBot-World v2 whole sessions (condition, DiT, KV commit, decode, convert), variants side by side in one run.

    python -m tools.bench.lingbot_session_ab                                   # official sizes on the GPU
    python -m tools.bench.lingbot_session_ab --config tiny --device cpu --resolution 128x96 --rounds 1

One pipeline (random weights, said so) is built once; every variant is a `WorldSessionPipeline` over the same
models, so the variants differ only in what they name:

* ``recompute``: the DiT as it ran before the chunk-reuse change: every forward recomputes the camera's share of
  every block, and the KV commit is a full forward whose prediction is dropped;
* ``reuse``: the camera modulation once per chunk and the lean commit (`camera_modulation`, `commit_chunk`);
* ``reuse+bf16-vae``: the same with the VAE (condition encode and decode) in bfloat16;
* ``reuse+fast-vae``: the bf16 VAE as ``--vae-fast`` runs it: channels-last weights and each norm + SiLU pair
  compiled into one kernel (`vae_fusion.optimize_vae`; the 2026-12-01 log's ``reuse+fused-vae`` had the fusion only);
* ``fp8``: ``reuse`` with a copy of the DiT whose block GEMMs run in FP8 (`LingBotWorldV2DiT.quantize`);
* ``fp8+bf16-vae``: both, the fastest configuration a service can ask for today;
* ``fp8+fast-vae``: FP8 GEMMs with the ``--vae-fast`` VAE;
* ``fp8+fp8-attn+bf16-vae`` and ``fp8+fp8-attn+fast-vae``: those with attention in FP8 too (cuDNN frontend,
  `ops.attention_fp8`), the session keeping its keys in FP8 as ``--attn-impl cudnn_fp8`` does; in the default list
  only where the frontend is installed;
* ``fp8+fp8-attn-requant+fast-vae``: the same over a bf16 window, quantized whole on every call (the path before
  the FP8-key window; not in the default list);
* ``fp8+sage+fast-vae``: FP8 GEMMs with attention through SageAttention2's SM90 kernel (``sage_sm90``, the window
  kept INT8/FP8 as ``--attn-impl sage_sm90`` does); in the default list only where its SM90 build is installed;
* ``<variant>+graphs`` (for ``reuse+fast-vae``, ``fp8+fast-vae`` and ``fp8+fp8-attn+fast-vae``): that variant with
  its steady forwards replayed as CUDA graphs (`LingBotWorldV2DiT.enable_cuda_graphs`; the warm-up session captures
  them). Not in the default list; on a CUDA device only. Its session must equal its twin's without graphs bit for bit.

After a warm-up session per variant, --rounds rounds each run one session per variant, the order rotating, so every
variant sees the same clocks. The table gives steady compute FPS, the steady chunk mean and each phase's mean, and
chunk 0 over the steady mean (the service warms up the same way). Quality: the variants that share the fp32 VAE must
give bit-identical latents and frames (the reuse is the same arithmetic); the bf16 VAE is compared with the fp32
one by the PSNR of decoding the same latents and by the relative error of the condition latents. FP8's quality gate
is its session against ``reuse`` (the same inputs and seed): the latents' relative L2 and cosine, the frames' PSNR.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from telefuser.models.flags import SIZES
from telefuser.pipelines.lingbot_world_v2 import WorldSessionPipeline, build_lingbot_pipeline, load_control_trace
from telefuser.pipelines.wan.vae import WanVideoVAE
from telefuser.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
IMAGE = REPO / "examples" / "lingbot_world_v2" / "assets" / "reference.png"
CONTROLS = REPO / "examples" / "lingbot_world_v2" / "assets" / "controls.json"
VARIANTS = (
    "recompute",
    "reuse",
    "reuse+bf16-vae",
    "reuse+fast-vae",
    "fp8",
    "fp8+bf16-vae",
    "fp8+fast-vae",
    "fp8+fp8-attn+bf16-vae",
    "fp8+fp8-attn+fast-vae",
    "fp8+fp8-attn-requant+fast-vae",
    "fp8+sage+fast-vae",
    "reuse+fast-vae+graphs",
    "fp8+fast-vae+graphs",
    "fp8+fp8-attn+fast-vae+graphs",
)
GRAPHS = "+graphs"
VARIANT_VAE = {  # variants with the same VAE and a bf16 DiT must give bit-identical sessions
    "recompute": "fp32",
    "reuse": "fp32",
    "reuse+bf16-vae": "bf16",
    "reuse+fast-vae": "fast",
    "fp8": "fp32",
    "fp8+bf16-vae": "bf16",
    "fp8+fast-vae": "fast",
    "fp8+fp8-attn+bf16-vae": "bf16",
    "fp8+fp8-attn+fast-vae": "fast",
    "fp8+fp8-attn-requant+fast-vae": "fast",
    "fp8+sage+fast-vae": "fast",
    "reuse+fast-vae+graphs": "fast",
    "fp8+fast-vae+graphs": "fast",
    "fp8+fp8-attn+fast-vae+graphs": "fast",
}


class RecomputingDiT:
    """The DiT as the pipeline drove it before: raw camera features into every forward (each recomputes every
    block's camera modulation) and a full committing forward for the KV update."""

    def __init__(self, dit):
        self.dit = dit

    def __getattr__(self, name):
        return getattr(self.dit, name)

    def camera_modulation(self, camera):
        return camera

    def commit_chunk(self, session, latents, t, camera):
        self.dit.forward_chunk(session, latents, t, camera, update_cache=True)


class AttentionImplDiT:
    """The same DiT with another attention implementation for the calls made through it (no second copy)."""

    def __init__(self, dit, attn_impl: str, *, per_call_quantization: bool = False):
        # per_call_quantization: the session is the model's own (bf16 keys), so FP8 attention quantizes the whole
        # window on every call, as before the FP8-key window
        self.dit, self.impl, self.per_call_quantization = dit, attn_impl, per_call_quantization

    def __getattr__(self, name):
        return getattr(self.dit, name)

    def _with_impl(self, method, *args, **kwargs):
        saved, self.dit.attn_impl = self.dit.attn_impl, self.impl
        try:
            return method(*args, **kwargs)
        finally:
            self.dit.attn_impl = saved

    def new_window(self, *args, **kwargs):  # a cudnn_fp8 session keeps its keys in FP8
        if self.per_call_quantization:
            return self.dit.new_window(*args, **kwargs)
        return self._with_impl(self.dit.new_window, *args, **kwargs)

    def forward_chunk(self, *args, **kwargs):
        return self._with_impl(self.dit.forward_chunk, *args, **kwargs)

    def commit_chunk(self, *args, **kwargs):
        return self._with_impl(self.dit.commit_chunk, *args, **kwargs)


class GraphedDiT:
    """The same DiT with its steady forwards replayed as CUDA graphs for the sessions made through it: the graph pool
    is this object's, lent to the model for each call (no second copy of the weights)."""

    def __init__(self, dit):
        from telefuser.models.lingbot_world_v2.graphs import ChunkGraphs

        self.dit, self.graphs = dit, ChunkGraphs()

    def __getattr__(self, name):
        return getattr(self.dit, name)

    def _with_graphs(self, method, *args, **kwargs):
        model = self.dit.dit if isinstance(self.dit, AttentionImplDiT) else self.dit
        saved, model.graphs = model.graphs, self.graphs
        try:
            return method(*args, **kwargs)
        finally:
            model.graphs = saved

    def new_window(self, *args, **kwargs):
        return self._with_graphs(self.dit.new_window, *args, **kwargs)

    def forward_chunk(self, *args, **kwargs):
        return self._with_graphs(self.dit.forward_chunk, *args, **kwargs)

    def commit_chunk(self, *args, **kwargs):
        return self._with_graphs(self.dit.commit_chunk, *args, **kwargs)


def default_variants() -> list[str]:
    from telefuser.ops.attention_registry import available_names

    available = available_names()
    fp8_attention, sage = "cudnn_fp8" in available, "sage_sm90" in available
    return [
        v
        for v in VARIANTS
        if (fp8_attention or "fp8-attn" not in v)
        and (sage or "sage" not in v)
        and "requant" not in v
        and GRAPHS not in v
    ]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=SIZES, default="official")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--resolution", default="832x480")
    p.add_argument("--num-frames", type=int, default=77)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=None, help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up sessions (a CPU smoke run)")
    p.add_argument("--output", type=Path, default=None, help="JSON with every session's measurements")
    args = p.parse_args(argv)
    if args.variants is None:
        args.variants = default_variants()
    else:
        args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown or not args.variants:
        p.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    if args.device == "cpu" and any(GRAPHS in v for v in args.variants):
        p.error("--variants: the +graphs variants replay CUDA graphs and need a CUDA device")
    return args


def build_variants(args) -> tuple[dict[str, WorldSessionPipeline], dict[str, WanVideoVAE]]:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = build_lingbot_pipeline(config=args.config, runtime=Runtime.one_rank(device, dtype), seed=0)
    vae32 = base.vae
    vae16 = WanVideoVAE(copy.deepcopy(vae32.model).to(dtype=torch.bfloat16), description=vae32.description + ", bf16")
    vaes = {"fp32": vae32, "bf16": vae16}
    if any(VARIANT_VAE[v] == "fast" for v in args.variants):
        from telefuser.pipelines.wan.vae_fusion import optimize_vae

        fast = copy.deepcopy(vae16.model)
        optimize_vae(fast)
        vaes["fast"] = WanVideoVAE(fast, description=vae16.description + ", channels-last, fused norm+SiLU")

    def pipeline(dit, vae):
        return WorldSessionPipeline(
            dit,
            base.prompt_encoder,
            vae,
            device=device,
            dit_dtype=dtype,
            camera_factory=base.camera_factory,
            weights=base.weights,
        )

    fp8_dit = fp8_copy(base.dit) if any(v.startswith("fp8") for v in args.variants) else None
    made = {
        "recompute": lambda: pipeline(RecomputingDiT(base.dit), vae32),
        "reuse": lambda: pipeline(base.dit, vae32),
        "reuse+bf16-vae": lambda: pipeline(base.dit, vae16),
        "reuse+fast-vae": lambda: pipeline(base.dit, vaes["fast"]),
        "fp8": lambda: pipeline(fp8_dit, vae32),
        "fp8+bf16-vae": lambda: pipeline(fp8_dit, vae16),
        "fp8+fast-vae": lambda: pipeline(fp8_dit, vaes["fast"]),
        "fp8+fp8-attn+bf16-vae": lambda: pipeline(AttentionImplDiT(fp8_dit, "cudnn_fp8"), vae16),
        "fp8+fp8-attn+fast-vae": lambda: pipeline(AttentionImplDiT(fp8_dit, "cudnn_fp8"), vaes["fast"]),
        "fp8+sage+fast-vae": lambda: pipeline(AttentionImplDiT(fp8_dit, "sage_sm90"), vaes["fast"]),
        "fp8+fp8-attn-requant+fast-vae": lambda: pipeline(
            AttentionImplDiT(fp8_dit, "cudnn_fp8", per_call_quantization=True), vaes["fast"]
        ),
    }
    for name in VARIANTS:
        if name.endswith(GRAPHS):
            made[name] = functools.partial(graphed, made[name.removesuffix(GRAPHS)])
    return {name: made[name]() for name in args.variants}, vaes


def graphed(make_twin) -> WorldSessionPipeline:
    pipe = make_twin()
    pipe.dit = GraphedDiT(pipe.dit)
    return pipe


def fp8_copy(dit):
    quantized = copy.deepcopy(dit)
    quantized.quantize("fp8")
    return quantized


def run_session(pipe, args, trace, image) -> dict:
    chunks, latents = [], []
    frames = []
    with pipe.start(
        image,
        "a corridor in an old castle",
        seed=42,
        resolution=args.resolution,
        num_frames=args.num_frames,
        frame_policy="truncate",
        keep_latents=True,
    ) as session:
        for i in range(session.total_chunks):
            chunk = session.next_chunk(trace.keys_for(i))
            chunks.append(chunk.measurement)
            latents.append(chunk.latents)
            frames.append(chunk.frames)
        summary = session.summary()
    return {
        "summary": summary,
        "chunks": chunks,
        "latents": torch.cat(latents, dim=2),
        "frames": np.concatenate(frames),
    }


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def fp8_gate(fp8: dict, bf16: dict) -> dict:
    a, b = fp8["latents"].double().flatten(), bf16["latents"].double().flatten()
    return {
        "latents_relative_l2": ((a - b).norm() / b.norm()).item(),
        "latents_cosine": torch.nn.functional.cosine_similarity(a, b, dim=0).item(),
        "frames_psnr_db": psnr(fp8["frames"], bf16["frames"]),
    }


def vae_quality(vae32: WanVideoVAE, vae16: WanVideoVAE, latents: torch.Tensor, image) -> dict:
    """Decode the same latents and encode the same condition with both VAEs; fp32 is the reference (`vae16`: any
    other one)."""
    from telefuser.pipelines.lingbot_world_v2.image import image_to_canvas, load_reference_image
    from telefuser.pipelines.wan.vae import to_uint8_frames

    device = vae32.device
    out = {}
    decoded = []
    for vae in (vae32, vae16):
        stream = vae.stream_decoder()
        decoded.append(to_uint8_frames(stream.decode(latents.to(device))).cpu().numpy())
        stream.close()
    out["decode_psnr_db"] = psnr(decoded[1], decoded[0])
    h, w = (int(v) for v in reversed(latents.shape[-2:]))
    canvas = image_to_canvas(load_reference_image(image), w * 8, h * 8)
    cond = [vae.encode_condition(canvas, latents.shape[2]).float() for vae in (vae32, vae16)]
    out["condition_relative_error"] = ((cond[1] - cond[0]).abs().max() / cond[0].abs().max()).item()
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    trace = load_control_trace(CONTROLS)
    start = time.perf_counter()
    variants, vaes = build_variants(args)
    weights = next(iter(variants.values())).weights["summary"]
    print(f"built the pipeline in {time.perf_counter() - start:.1f} s; weights: {weights} (timings only)", flush=True)
    for name, pipe in variants.items() if not args.no_warmup else ():
        seconds = pipe.warm_up(resolution=args.resolution)
        print(f"warm-up {name}: {seconds:.1f} s", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            result = run_session(variants[name], args, trace, IMAGE)
            runs[name].append(result)
            s = result["summary"]
            print(
                f"round {r} {name}: steady {s['steady_compute_fps']:.3f} FPS, chunk 0 {s['first_chunk_seconds']:.3f} s",
                flush=True,
            )

    rows, report = [], {"args": {k: str(v) for k, v in vars(args).items()}, "variants": {}}
    reference = runs[names[0]][0]
    first_with_vae = {}  # the variants with the same VAE must agree bit for bit with the first of them
    for name in names:
        first_with_vae.setdefault(VARIANT_VAE[name], name)
    for name, results in runs.items():
        fps = [x["summary"]["steady_compute_fps"] for x in results]
        chunk = [x["summary"]["chunk_seconds"]["mean"] for x in results]
        first = [x["summary"]["first_chunk_seconds"] for x in results]
        phases = {
            p: statistics.fmean(x["summary"]["phase_mean_seconds"][p] or 0.0 for x in results)
            for p in results[0]["summary"]["phase_mean_seconds"]
        }
        baseline = first_with_vae[VARIANT_VAE[name]]
        twin = name.removesuffix(GRAPHS)
        if name.endswith(GRAPHS) and twin in runs:
            baseline = twin  # a replay runs the eager forward's kernels: the same session, FP8 included
        other = runs[baseline][0]
        exact = (
            None
            if baseline == name or (baseline != twin and (name.startswith("fp8") or baseline.startswith("fp8")))
            else bool(
                torch.equal(results[0]["latents"], other["latents"])
                and np.array_equal(results[0]["frames"], other["frames"])
            )
        )
        rows.append((name, statistics.median(fps), statistics.fmean(chunk), phases, statistics.fmean(first), exact))
        report["variants"][name] = {
            "steady_fps": fps,
            "chunk_mean_s": chunk,
            "first_chunk_s": first,
            "phase_mean_s": phases,
            "same_latents_and_frames_as_first_variant": exact,
            "sessions": [{"summary": x["summary"], "chunks": x["chunks"]} for x in results],
        }
    phase_names = list(rows[0][3])
    head = [
        "variant",
        "steady FPS",
        "chunk s",
        *phase_names,
        "chunk0/steady",
        "output vs baseline (same VAE; +graphs: its twin)",
    ]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, fps, chunk, phases, first, exact in rows:
        cells = [
            name,
            f"{fps:.3f}",
            f"{chunk:.3f}",
            *(f"{phases[p]:.3f}" for p in phase_names),
            f"{first / chunk:.2f}",
            "-" if exact is None else ("bit-identical" if exact else "DIFFERENT"),
        ]
        print("| " + " | ".join(cells) + " |")
    for kind in ("bf16", "fast"):
        if not any(VARIANT_VAE[name] == kind for name in variants):
            continue
        quality = vae_quality(vaes["fp32"], vaes[kind], reference["latents"], IMAGE)
        report[f"vae_{kind}_quality"] = quality
        print(
            f"\n{kind} VAE against fp32 on the same latents: decode PSNR {quality['decode_psnr_db']:.1f} dB; "
            f"condition latents relative error {quality['condition_relative_error']:.2e}"
        )
    for name in names:  # each FP8 variant against the bf16-DiT variant with the same VAE, when there is one
        bf16 = next((n for n in names if n.startswith("reuse") and VARIANT_VAE[n] == VARIANT_VAE[name]), None)
        if not name.startswith("fp8") or bf16 is None:
            continue
        gate = fp8_gate(runs[name][0], runs[bf16][0])
        report["fp8_quality" if name == "fp8" else f"{name}_quality"] = {**gate, "against": bf16}
        label = "fp8 against bf16" if name == "fp8" else f"{name} against {bf16}"
        print(
            f"{label} over a session: latents relative L2 {gate['latents_relative_l2']:.3e}, cosine "
            f"{gate['latents_cosine']:.5f}; frames PSNR {gate['frames_psnr_db']:.1f} dB"
        )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    failed = [r[0] for r in rows if r[5] is False]
    if failed:
        print(f"error: {failed} changed the output against the baseline with the same VAE", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
