r"""MiniMax H3 text -> video + audio, one request, timed.

    python examples/minimax_h3/run_t2va.py --config tiny --device cpu --dtype float32 \
        --duration 1 --resolution 32 --steps 3 --output outputs/minimax_h3/tiny.mp4
    torchrun --standalone --nproc-per-node=4 examples/minimax_h3/run_t2va.py --checkpoint /models/MiniMax-H3 \
        --ulysses-degree 2 --tp-degree 2 --attn-impl flash_attn_4 --enable-feature-cache --output out/h3.mp4

Writes the MP4 (H.264, 24 fps, AAC 32 kHz stereo) and ``<output>.json`` with timings, peak memory, DiT calls
computed/skipped and where the weights came from. Without --checkpoint every weight is random: the clip shows
noise-like pictures and sound, which is what a plumbing/timing run needs and nothing more.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from telefuser.arg_types import int_at_least, positive_float, positive_int
from telefuser.media import write_mp4
from telefuser.memory.plan import plan_or_exit
from telefuser.models.minimax_h3.lora import LoraError
from telefuser.models.registry import get_spec
from telefuser.pipelines.minimax_h3 import ASPECT_RATIOS, FlowSchedule, load_reference, partition_for_task, plan_shape
from telefuser.pipelines.minimax_h3.loading import request_from_args
from telefuser.pipelines.minimax_h3.presets import PRESETS, get_preset
from telefuser.profiling.timing import device_peaks
from telefuser.runtime import Runtime, add_runtime_args
from telefuser.serving.common.startup import check_output_file, run_example

MODEL = get_spec("minimax_h3")
DEFAULT_PROMPT = "A red fox trots across fresh snow at dawn, its paws crunching softly while a crow calls overhead."


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--duration", type=positive_float, default=5.0, help="seconds; snapped up to 17n+5 frames at 24 fps")
    p.add_argument("--resolution", default="768", help="short edge in pixels (with --aspect-ratio) or WIDTHxHEIGHT")
    p.add_argument(
        "--aspect-ratio",
        default=None,
        choices=list(ASPECT_RATIOS),
        help="default: the first keyframe's (FL2VA), else 16:9",
    )
    conditions = p.add_argument_group("keyframes (FL2VA) and references (Ref2VA: the release's Ref2VA DiT)")
    conditions.add_argument("--image", type=Path, default=None, metavar="FIRST", help="the first keyframe (an image)")
    conditions.add_argument("--last-image", type=Path, default=None, metavar="LAST", help="the last keyframe")
    conditions.add_argument(
        "--reference",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a reference, in order, repeatable: an image, a video or an audio file (told apart by extension: "
        f"{', '.join(sorted(REFERENCE_KINDS))}); runs Ref2VA",
    )
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="PATH[:SCALE]",
        help="a LoRA file merged into the DiT at SCALE (default 1), repeatable (stacked); any producer's format "
        "diffusers reads; refused if it was trained for the other DiT partition",
    )
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="release",
        help="sampling preset: DiT calls and flow shifts (default %(default)s; turbo-8 and turbo-4 for a step-distilled "
        "Turbo LoRA: which one its model card says); --steps and the shifts override it. "
        + "; ".join(
            f"{p.name}: {p.dit_calls} DiT calls, shifts {p.video_shift:g}/{p.audio_shift:g}" for p in PRESETS.values()
        ),
    )
    p.add_argument(
        "--steps",
        type=int_at_least(2),
        default=None,
        help="sigma points; the DiT runs steps-1 times (default: the preset's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flow-shift", type=positive_float, default=None, help="video flow shift (default: the preset's)")
    p.add_argument(
        "--audio-flow-shift", type=positive_float, default=None, help="audio flow shift (default: the preset's)"
    )
    p.add_argument(
        "--calibrate-feature-cache",
        type=Path,
        default=None,
        metavar="JSON",
        help="compute every step and write AdaTaylorCache params (audio-row ratios) to JSON",
    )
    MODEL.add_flags(p.add_argument_group(f"model: {MODEL.name}"))
    p.add_argument("--output", type=Path, default=Path("outputs/minimax_h3/t2va.mp4"))
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--repeat",
        type=positive_int,
        default=1,
        help="run the request this many times on the loaded pipeline (default 1): the first run compiles, the later "
        "ones time what a warm service pays; the report and the files are the last run's",
    )
    add_runtime_args(p, tp=True)
    args = p.parse_args()
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    try:
        args.loras = [lora_argument(text) for text in args.lora]
        args.references = [load_reference(reference_kind(path), path) for path in args.reference]
    except (ValueError, OSError) as exc:
        p.error(str(exc))
    if args.references and (args.image or args.last_image):
        p.error("keyframes (--image, --last-image) and --reference run on different DiTs: give one or the other")
    args.task = "ref2va" if args.references else "fl2va" if (args.image or args.last_image) else "t2va"
    preset = get_preset(args.preset)  # what the preset fills in, where the flags leave it
    args.steps = preset.steps if args.steps is None else args.steps
    args.flow_shift = preset.video_shift if args.flow_shift is None else args.flow_shift
    args.audio_flow_shift = preset.audio_shift if args.audio_flow_shift is None else args.audio_flow_shift
    return args


REFERENCE_KINDS = {
    **{ext: "image" for ext in (".png", ".jpg", ".jpeg", ".webp", ".bmp")},
    **{ext: "video" for ext in (".mp4", ".mov", ".webm", ".mkv", ".avi")},
    **{ext: "audio" for ext in (".wav", ".flac", ".mp3", ".ogg", ".m4a")},
}


def reference_kind(path: Path) -> str:
    kind = REFERENCE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"--reference {path}: cannot tell an image, a video or an audio file by {path.suffix!r}")
    return kind


def _image(path: Path | None):
    if path is None:
        return None
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def lora_argument(text: str) -> tuple[Path, float]:
    """``PATH[:SCALE]`` -> (path, scale); a suffix that is not a number stays part of the path."""
    path, _, scale = text.rpartition(":")
    try:
        return (Path(path), float(scale)) if path else (Path(text), 1.0)
    except ValueError:
        return Path(text), 1.0


def main() -> None:
    args = parse_args()
    if args.enable_feature_cache and args.calibrate_feature_cache:
        raise SystemExit("--enable-feature-cache and --calibrate-feature-cache exclude each other")
    metrics_path = args.output.with_suffix(".json")
    if args.calibrate_feature_cache and args.calibrate_feature_cache.resolve() == metrics_path.resolve():
        raise SystemExit(f"--calibrate-feature-cache {metrics_path} would be overwritten by the metrics JSON")
    # Refuse a bad request before any weight is loaded (the pipeline checks again with the DiT's patch size).
    try:
        plan_shape(duration_s=args.duration, resolution=args.resolution, aspect_ratio=args.aspect_ratio or "16:9")
        FlowSchedule.build(args.steps, args.flow_shift, args.audio_flow_shift)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    check_output_file(args.output)
    runtime = Runtime.from_args(args)
    attn_impl = MODEL.attention_impl(args, runtime)  # --attn-impl auto resolved here, agreed by every rank
    memory = plan_or_exit(MODEL, args, runtime, request_from_args(args))  # before any weight loads, agreed by all
    try:
        pipe = MODEL.build_pipeline(
            args,
            runtime,
            attn_impl=attn_impl,
            placement=memory.placement,
            seed=args.seed,
            show_progress=not args.no_progress,
            partition=partition_for_task(args.task),
            loras=args.loras,
        )
    except LoraError as exc:  # read before any weight loads: a start-up mistake, not a crash
        runtime.close()
        raise SystemExit(f"error: {exc}") from None
    load_peak = device_peaks(runtime.device)  # loading one tensor or block at a time: never above the plan
    feature_cache = None
    if args.enable_feature_cache:
        feature_cache = "ada_taylor"
    elif args.calibrate_feature_cache:
        feature_cache = "calibrator"
    try:
        runs = []
        for _ in range(args.repeat):
            result = pipe(
                args.prompt,
                duration=args.duration,
                resolution=args.resolution,
                aspect_ratio=args.aspect_ratio,
                steps=args.steps,
                seed=args.seed,
                flow_shift=args.flow_shift,
                audio_flow_shift=args.audio_flow_shift,
                feature_cache=feature_cache,
                first_frame=_image(args.image),
                last_frame=_image(args.last_image),
                references=args.references,
            )
            runs.append(result.timings)
        if runtime.rank == 0:
            if args.calibrate_feature_cache:
                result.feature_cache.save(
                    args.calibrate_feature_cache,
                    sigma_shift=args.flow_shift,
                    notes={
                        "audio_sigma_shift": args.audio_flow_shift,
                        "calibrated_on": "audio rows (tag 2)",
                        "_provenance": f"examples/minimax_h3/run_t2va.py, weights: {result.weights.get('summary')}",
                    },
                )
            report(args, result, runtime, attn_impl, memory, load_peak, runs)
    finally:
        pipe.close()
        runtime.close()


def report(
    args: argparse.Namespace, result, runtime: Runtime, attn_impl: str, memory, load_peak: dict, runs: list
) -> None:
    write_mp4(args.output, result.frames.numpy(), result.fps, result.audio.numpy(), result.sample_rate)
    metrics = result.metrics()
    metrics["launch"] = {
        "world_size": runtime.world_size,
        "ulysses_degree": args.ulysses_degree,
        "tp_degree": args.tp_degree,
        "attn_impl": attn_impl,
        "attn_impl_requested": args.attn_impl,
        "quantization": args.quantization,
        "dtype": runtime.dtype_name,
        "config": args.config if args.checkpoint is None else "checkpoint",
        "preset": args.preset,
        "task": args.task,
        "loras": [f"{path}:{scale:g}" for path, scale in args.loras],
    }
    metrics["memory_plan"] = memory.as_dict()
    metrics["runs"] = [
        {"pipeline_s": r.pipeline_s, "text_encode_s": r.text_encode_s, "dit_s": r.dit_total_s, "vae_s": r.vae_decode_s}
        for r in runs
    ]
    metrics["load_peak_bytes"] = load_peak
    metrics_path = args.output.with_suffix(".json")
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")

    t, s = result.timings, result.shape
    weights = result.weights.get("summary", "")
    random_note = " -- random weights: output is not meaningful" if args.checkpoint is None else ""
    print(f"weights: {weights}{random_note}")
    for part in ("tokenizer", "video_vae", "audio_vae"):
        print(f"  {part}: {result.weights.get(part)}")
    print(
        f"video: {s.width}x{s.height}, {s.frame_count} frames @ {result.fps} fps ({s.duration_s:.3f} s); "
        f"audio: {result.audio.shape[0]} ch x {result.audio.shape[1]} samples @ {result.sample_rate} Hz"
    )
    print(f"DiT calls computed/skipped: {result.dit_calls_computed}/{result.dit_calls_skipped}")
    print(
        f"pipeline {t.pipeline_s:.2f} s | text {t.text_encode_s:.2f} s | DiT {t.dit_total_s:.2f} s "
        f"({t.dit_total_s / max(1, len(t.dit_step_s)):.3f} s/call) | VAE {t.vae_decode_s:.2f} s"
    )
    for index, r in enumerate(runs[:-1] if len(runs) > 1 else (), 1):
        print(f"  run {index} of {len(runs)}: pipeline {r.pipeline_s:.2f} s | DiT {r.dit_total_s:.2f} s")
    print(f"peak memory: {result.peak_memory_bytes / 2**30:.2f} GiB ({result.peak_memory_kind})")
    reserved = max([load_peak.get("reserved", 0), *(result.stage_peak_bytes or {}).get("reserved", {}).values()])
    if reserved:
        print(
            f"memory: planned peak {memory.peak_bytes / 2**30:.1f} GiB ({memory.placement.tier}); measured "
            f"{reserved / 2**30:.1f} GiB reserved at most (loading {load_peak.get('reserved', 0) / 2**30:.1f} GiB)"
        )
    print(f"wrote {args.output} and {metrics_path}")


if __name__ == "__main__":
    raise SystemExit(run_example(main))
