r"""LingBot-World v2: one image-to-video world session, chunk by chunk, steered by a control trace; timed.

    python examples/lingbot_world_v2/run_i2v.py --config tiny --device cpu          # CPU plumbing run
    torchrun --standalone --nproc-per-node=2 examples/lingbot_world_v2/run_i2v.py --config tiny --ulysses-degree 2
    torchrun --standalone --nproc-per-node=4 examples/lingbot_world_v2/run_i2v.py --checkpoint /models/lingbot-v2 \
        --ulysses-degree 4 --attn-impl flash_attn_4 --output outputs/lingbot_world_v2/u4.mp4

Writes the MP4 (H.264, video only) and ``<output>.json``: the request, the per-chunk measurements
(``index, frames, compute_seconds, phases``), the summary (steady compute FPS over chunks > 0, chunk mean / p50 /
p90 / max), session setup times and where every weight came from. Without --checkpoint every weight is random:
the frames are noise-like pictures, which is what a plumbing/timing run needs and nothing more.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm.auto import tqdm

from telefuser.arg_types import positive_int
from telefuser.media import write_mp4
from telefuser.memory.plan import plan_or_exit
from telefuser.models.registry import get_spec
from telefuser.pipelines.lingbot_world_v2 import (
    FRAME_POLICIES,
    ControlTrace,
    format_summary,
    load_control_trace,
    plan_session,
)
from telefuser.pipelines.lingbot_world_v2.image import load_reference_image
from telefuser.pipelines.lingbot_world_v2.loading import request_from_args
from telefuser.profiling.timing import device_peaks
from telefuser.runtime import Runtime, add_runtime_args
from telefuser.serving.common.startup import check_output_file, run_example

MODEL = get_spec("lingbot_world_v2")
HERE = Path(__file__).resolve().parent
DEFAULT_IMAGE = HERE / "assets" / "reference.png"
DEFAULT_CONTROLS = HERE / "assets" / "controls.json"
DEFAULT_PROMPT = "A quiet country road runs toward the horizon past a red barn and a white cottage under a clear sky."
TINY_RESOLUTION, OFFICIAL_RESOLUTION = "128x96", "832x480"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="reference image (first frame)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument(
        "--controls",
        default=str(DEFAULT_CONTROLS),
        help="control trace (JSON list or JSON lines of {chunk, keys}); 'none' for no keys",
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--resolution",
        default=None,
        help=f"WIDTHxHEIGHT, multiples of 16 (default {OFFICIAL_RESOLUTION}; {TINY_RESOLUTION} for "
        f"--config tiny without --checkpoint)",
    )
    p.add_argument(
        "--num-frames",
        type=positive_int,
        default=77,
        help="1 + 4k frames; 77 = 5 chunks (13 + 4 x 16); truncate drops an incomplete last chunk",
    )
    p.add_argument("--fps", type=positive_int, default=16)
    p.add_argument("--frame-policy", choices=FRAME_POLICIES, default="truncate")
    MODEL.add_flags(p.add_argument_group(f"model: {MODEL.name}"))
    p.add_argument(
        "--warmup",
        action="store_true",
        help="run a discarded two-chunk session first (as serve-stream does), so chunk 0 is measured warm",
    )
    p.add_argument("--output", type=Path, default=Path("outputs/lingbot_world_v2/i2v.mp4"))
    p.add_argument("--no-progress", action="store_true")
    add_runtime_args(p)  # --ulysses-degree (the VAE decode is height-sharded over the same ranks), --device, --dtype
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.resolution is None:
        args.resolution = TINY_RESOLUTION if args.config == "tiny" and args.checkpoint is None else OFFICIAL_RESOLUTION
    # Refuse a bad request before any process group or weight exists.
    try:
        plan = plan_session(
            resolution=args.resolution, num_frames=args.num_frames, fps=args.fps, frame_policy=args.frame_policy
        )
        trace = ControlTrace() if args.controls.lower() == "none" else load_control_trace(args.controls)
        image = load_reference_image(args.image)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if not args.prompt.strip():
        raise SystemExit("--prompt must not be empty")
    check_output_file(args.output)

    runtime = Runtime.from_args(args)
    mesh, device, dtype, rank = runtime.mesh, runtime.device, runtime.dtype, runtime.rank

    attn_impl = MODEL.attention_impl(args, runtime)  # --attn-impl auto resolved here, agreed by every rank
    memory = plan_or_exit(MODEL, args, runtime, request_from_args(args))  # before any weight loads, agreed by all
    pipe = MODEL.build_pipeline(args, runtime, attn_impl=attn_impl, placement=memory.placement, seed=args.seed)
    load_peak = device_peaks(device)  # loading one tensor or block at a time: never above the plan
    try:
        if args.warmup:
            seconds = pipe.warm_up(resolution=args.resolution, fps=args.fps)
            if rank == 0:
                print(f"warm-up session: {seconds:.1f} s", flush=True)
        with pipe.start(
            image,
            args.prompt,
            seed=args.seed,
            resolution=args.resolution,
            num_frames=args.num_frames,
            fps=args.fps,
            frame_policy=args.frame_policy,
        ) as session:
            frames = []
            bar = tqdm(range(session.total_chunks), desc="chunks", unit="chunk", disable=args.no_progress or rank != 0)
            for i in bar:
                chunk = session.next_chunk(trace.keys_for(i))
                frames.append(chunk.frames)
                bar.set_postfix(
                    frames=chunk.measurement["frames"],
                    s=f"{chunk.measurement['compute_seconds']:.2f}",
                    keys="".join(chunk.keys) or "-",
                )
            if rank == 0:
                report(args, pipe, session, frames, plan, mesh, device, dtype, attn_impl, memory, load_peak)
    finally:
        pipe.close()
        runtime.close()


def report(args, pipe, session, frames, plan, mesh, device, dtype, attn_impl, memory, load_peak) -> None:
    import numpy as np

    video = np.concatenate(frames, axis=0)
    write_mp4(args.output, video, args.fps)
    summary = session.summary()
    metrics = {
        "request": {**session.request, "image": str(args.image), "controls": args.controls},
        "plan": plan.as_dict(),
        "weights": pipe.weights,
        "launch": {
            "world_size": mesh.world_size if mesh is not None else 1,
            "ulysses_degree": args.ulysses_degree,
            "attn_impl": attn_impl,
            "attn_impl_requested": args.attn_impl,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "vae_dtype": args.vae_dtype,
            "vae_fast": args.vae_fast,
            "quantization": args.quantization,
            "cuda_graphs": args.cuda_graphs,
            "warmup": args.warmup,
            "config": args.config if args.checkpoint is None else "checkpoint",
        },
        "memory_plan": memory.as_dict(),
        "load_peak_bytes": load_peak,
        "open_peak_bytes": getattr(session, "open_peak_bytes", {}),  # the session's start: text, image, window
        "schedule": pipe.schedule.as_dict(),
        "setup_seconds": session.setup_seconds,
        "keys_per_chunk": session.keys_history,
        "chunks": session.measurements,
        "summary": summary,
        "output": {
            "path": str(args.output),
            "frames": int(video.shape[0]),
            "width": int(video.shape[2]),
            "height": int(video.shape[1]),
            "fps": args.fps,
        },
    }
    metrics_path = args.output.with_suffix(".json")
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    random_note = " -- random weights: output is not meaningful" if args.checkpoint is None else ""
    print(f"weights: {pipe.weights.get('summary')}{random_note}")
    for part in ("dit", "text_encoder", "tokenizer", "vae"):
        print(f"  {part}: {pipe.weights.get(part)}")
    truncated = f" (of {plan.requested_frames} asked)" if plan.requested_frames != plan.num_frames else ""
    print(
        f"video: {plan.width}x{plan.height}, {video.shape[0]} frames{truncated} @ {args.fps} fps, "
        f"{session.total_chunks} chunks {list(plan.frames_per_chunk)}"
    )
    setup = session.setup_seconds
    print("setup: " + ", ".join(f"{k} {v:.3f}" for k, v in setup.items()))
    print(format_summary(summary))
    peaks = [load_peak, getattr(session, "open_peak_bytes", {}), summary.get("phase_peak_bytes", {})]
    reserved = max(
        [
            p.get("reserved", 0)
            if isinstance(p.get("reserved"), int)
            else max(p.get("reserved", {}).values(), default=0)
            for p in peaks
        ],
        default=0,
    )
    if reserved:
        print(
            f"memory: planned peak {memory.peak_bytes / 2**30:.1f} GiB ({memory.placement.tier}); measured {reserved / 2**30:.1f} GiB reserved at most"
        )
    print(f"wrote {args.output} and {metrics_path}")


if __name__ == "__main__":
    raise SystemExit(run_example(main))
