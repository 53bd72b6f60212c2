r"""Wan 2.2 text (+ image, TI2V-5B) -> video, one request, timed.

    python examples/wan2_2/run_t2v.py --config tiny --device cpu --dtype float32 --output outputs/wan2_2/tiny.mp4
    python examples/wan2_2/run_t2v.py --model wan2.2-ti2v-5b --config tiny --device cpu --output outputs/wan2_2/5b.mp4
    python examples/wan2_2/run_t2v.py --model wan2.2-ti2v-5b --checkpoint /models/Wan2.2-TI2V-5B-Diffusers \
        --image first_frame.png --prompt "the fox turns and runs" --output out/fox.mp4
    torchrun --standalone --nproc-per-node=4 examples/wan2_2/run_t2v.py --checkpoint /models/Wan2.2-T2V-A14B \
        --size 1280x720 --output out/wan22.mp4

Writes the MP4 (H.264, the release's frame rate, no audio) and ``<output>.json`` with timings, DiT calls, the memory
plan and where the weights came from. The plan comes first (`--offload auto` takes the cheapest tier that fits
`--gpu-memory-gb` or the device; `model` keeps one T2V-A14B expert on the GPU at a time); a request that cannot fit
is refused before anything loads. Without --checkpoint every weight is random (the log says so): the clip shows noise, which is
what a plumbing or timing run needs and nothing more. Steps, guidance, size and frames default to the release's
(T2V-A14B: 40 steps, guidance 4.0 then 3.0, 1280x720, 81 frames at 16 fps; TI2V-5B: 50 steps, 5.0, 1280x704,
121 frames at 24 fps; tiny: 4 steps, 9 frames). `--image` (TI2V-5B) makes the picture the clip's first frame,
stretched onto the canvas, as diffusers' `WanImageToVideoPipeline` for TI2V-5B does.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from telefuser.arg_types import finite_float, positive_int
from telefuser.media import write_mp4
from telefuser.memory.plan import plan_or_exit
from telefuser.models.registry import get_spec
from telefuser.models.wan2_2.config import release
from telefuser.profiling.timing import device_peaks
from telefuser.runtime import Runtime, add_runtime_args
from telefuser.serving.common.startup import check_output_file, run_example

MODELS = ("wan2.2-t2v-a14b", "wan2.2-ti2v-5b")
DEFAULT_PROMPT = "A red fox trots across fresh snow at dawn, its breath steaming in the cold air."


def parse_args(argv=None) -> argparse.Namespace:
    # --model picks the spec whose flags (--config, --checkpoint, --attn-impl, ...) the full parser, and --help, show
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--model", choices=MODELS, default=MODELS[0])
    model = probe.parse_known_args(argv)[0].model
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default=MODELS[0], help="which Wan 2.2 release (default %(default)s)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--size", default=None, help="WIDTHxHEIGHT (default: the release's canvas)")
    p.add_argument("--num-frames", type=positive_int, default=None, help="4n + 1 (default: the release's)")
    p.add_argument(
        "--steps", type=positive_int, default=None, help="denoising steps, one DiT call each (default: the release's)"
    )
    p.add_argument(
        "--guidance-scale", type=finite_float, default=None, help="the high-noise expert's (default: release)"
    )
    p.add_argument(
        "--guidance-scale-2", type=finite_float, default=None, help="the low-noise expert's (default: release)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--image",
        type=Path,
        default=None,
        help="wan2.2-ti2v-5b only: a PNG/JPEG/WebP picture to start the clip from (its first frame, stretched onto "
        "--size); the prompt says what happens next. Without it the video comes from the text alone",
    )
    p.add_argument("--output", type=Path, default=Path("outputs/wan2_2/t2v.mp4"))
    add_runtime_args(p, ulysses_default=None)
    get_spec(model).add_flags(p.add_argument_group(f"{model} flags"))
    args = p.parse_args(argv)
    check_shape(p, args)
    args.first_frame = read_image(p, args)
    return args


def check_shape(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--size and --num-frames against the release's rules, before anything is planned or loaded (one error line)."""
    variant = release(args.model.removeprefix("wan2.2-"), "official" if args.checkpoint else args.config)
    multiple = variant.vae_scale * 2  # the VAE's stride times the DiT's 2x2 patch, as the pipeline checks
    if args.size is not None:
        try:
            width, height = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            p.error(f"--size must be WIDTHxHEIGHT such as 1280x720, got {args.size!r}")
        if width % multiple or height % multiple or width < multiple or height < multiple:
            p.error(
                f"--size {args.size}: {args.model} needs width and height that are positive multiples of {multiple}"
            )
    if args.num_frames is not None and (args.num_frames < 1 or (args.num_frames - 1) % 4):
        p.error(f"--num-frames must be 4n + 1 (1, 5, 9, ..., 81), got {args.num_frames}")


def read_image(p: argparse.ArgumentParser, args: argparse.Namespace) -> Image.Image | None:
    """--image opened as RGB before anything is planned or loaded: a variant without the image condition, a missing
    file or one that is not a readable image ends the command in one line."""
    if args.image is None:
        return None
    if not release(args.model.removeprefix("wan2.2-")).takes_image:
        p.error(f"--image: {args.model} is text-to-video only; the image condition is wan2.2-ti2v-5b's")
    try:
        with Image.open(args.image) as opened:
            return opened.convert("RGB")
    except FileNotFoundError:
        p.error(f"--image {args.image}: no such file")
    except (UnidentifiedImageError, OSError) as exc:
        p.error(f"--image {args.image}: not a readable image ({type(exc).__name__}: {exc})")


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = get_spec(args.model)
    check_output_file(args.output)
    runtime = Runtime.from_args(args)
    # before any weight loads: the cheapest --offload tier that fits, or a refusal naming what would (exit status 2)
    plan = plan_or_exit(spec, args, runtime, spec.request_from_args(args))
    start = time.perf_counter()
    pipe = spec.build_pipeline(args, runtime, placement=plan.placement)
    load_s = time.perf_counter() - start
    width, height = (int(v) for v in args.size.lower().split("x")) if args.size else (None, None)
    video = pipe(
        args.prompt,
        negative_prompt=args.negative_prompt,
        width=width,
        height=height,
        num_frames=args.num_frames,
        steps=args.steps,
        guidance_scale=args.guidance_scale,
        guidance_scale_2=args.guidance_scale_2,
        seed=args.seed,
        image=args.first_frame,
    )
    if runtime.rank == 0:
        write_mp4(args.output, video.frames, fps=video.fps)
        variant = release(args.model.removeprefix("wan2.2-"), "official" if args.checkpoint else args.config)
        summary = {
            "model": args.model,
            "image": str(args.image) if args.image else None,
            "frames": list(video.frames.shape),
            "fps": video.fps,
            "dit_calls": video.dit_calls,
            "experts": variant.experts,
            "load_s": load_s,
            "timings": video.timings,
            "peaks": device_peaks(runtime.device),
            "memory_plan": plan.as_dict(),
            "weights": pipe.weights,
        }
        args.output.with_suffix(".json").write_text(json.dumps(summary, indent=2, default=str))
        print(json.dumps(summary, indent=2, default=str))
    runtime.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(run_example(main))
