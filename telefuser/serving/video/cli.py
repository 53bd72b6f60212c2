"""`telefuser serve`: the batch text(+keyframes or references)-to-video(+audio) service, and under torchrun its
follower ranks.

    telefuser serve --fake --port 8000                           # fake-MiniMax-H3: test pattern + tone, no weights
    telefuser serve --config tiny --device cpu                   # --model minimax_h3 (the default), tiny, on the CPU
    telefuser serve --model wan2.2-t2v-a14b --config tiny --device cpu   # Wan 2.2: video without audio, with CFG
    telefuser serve --checkpoint /models/MiniMax-H3 --task-partition Ref2VA --lora-dir /models/loras   # references
    torchrun --nproc-per-node 4 -m telefuser.cli serve --checkpoint /models/MiniMax-H3 \\
        --ulysses-degree 2 --tp-degree 2                         # rank 0 serves HTTP, ranks 1..3 follow
    telefuser serve ... --job-store postgresql://db/telefuser --artifacts s3://videos/jobs   # one of N replicas
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ...arg_types import canvas_size, finite_float, non_negative_float, non_negative_int, positive_float, positive_int
from ...models.registry import names
from ...runtime import add_runtime_args
from ..common.auth import keys_from_args
from ..common.http_errors import RequestError
from ..common.launch import add_server_args, run_command, run_service, serve_until_stopped
from ..common.limits import add_canvas_limit_args
from ..common.model_args import add_model_args, chosen_spec
from ..common.startup import StartupError
from ..common.warmup import add_warmup_arg
from .contract import VideoRunner
from .limits import VideoLimitFlags
from .lora_field import LoraPolicy
from .media import MediaLimits
from .replay import FollowingRunner, follow_runner
from .replica_args import add_replica_args, check_replica_args, open_stores

log = logging.getLogger("telefuser.serving")
SERVICE = "video"  # the adapter kind a model's spec names for this service: a `VideoRunner` builder
DEFAULT_MODEL = "minimax_h3"
FAKE_PREFIX = "fake-"  # --fake serves "fake-<the model's name>": its name says it is not the model


def build_fake_runner(args: argparse.Namespace) -> VideoRunner:
    from .fake import FakeVideoRunner

    defaults = {
        k: v
        for k, v in (("size", args.size_default), ("seconds", args.seconds_default), ("steps", args.steps_default))
        if v is not None
    }
    return FakeVideoRunner(
        model=args.served_model_name,
        step_delay_s=args.fake_step_delay,
        defaults=defaults,
        run_log=args.fake_run_log,
        partition=args.task_partition,
        stands_in_for=getattr(args, "fake_stands_in_for", None),
    )


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve",
        help="serve batch text-to-video (+audio where the model makes it) over an OpenAI-style /v1/videos API "
        f"(models: {', '.join(names(SERVICE))})",
        description="Batch video service: POST /v1/videos, poll GET /v1/videos/{id}, fetch .../content. Rank 0 "
        "serves; other torchrun ranks follow its jobs.",
    )
    g = p.add_argument_group("service")
    add_server_args(g, port=8000)
    g.add_argument(
        "--artifacts",
        "--output-dir",
        dest="artifacts",
        default="outputs/videos",
        help="where MP4s go: a directory (with the embedded job store also its records; replicas may share one on a "
        "shared filesystem) or s3://bucket/prefix (credentials from the usual AWS variables)",
    )
    g.add_argument("--max-queue", type=positive_int, default=16, help="jobs waiting (on all replicas); more get 429")
    g.add_argument(
        "--max-seconds",
        type=positive_float,
        default=10.0,
        help="longest clip a request may ask for (the OpenAI SDK's seconds='12' needs --max-seconds 12)",
    )
    g.add_argument(
        "--max-steps", type=positive_int, default=1000, help="most num_inference_steps a request may ask for"
    )
    g.add_argument(
        "--max-body-mib",
        type=positive_float,
        default=None,
        help="largest request body (default: 1 MiB for a text-only model; with keyframes or references, 1 MiB + "
        "two images and one clip at their limits, base64-encoded)",
    )
    g.add_argument(
        "--served-model-name",
        default=None,
        help="the name /v1/models lists and a request's 'model' must match (case-insensitive); default: the "
        "model's own (MiniMax-H3 for minimax_h3, its registry name for a model that declares none; with --fake, "
        "fake-MiniMax-H3, which also accepts requests naming MiniMax-H3)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=non_negative_float,
        default=30.0,
        help="seconds to wait at shutdown for the running job to stop at its next step",
    )
    g.add_argument(
        "--fake", action="store_true", help="serve a fake model (fake-MiniMax-H3): test pattern + tone, no weights"
    )
    g.add_argument(
        "--fake-step-delay", type=non_negative_float, default=0.01, help="--fake: seconds per denoising step"
    )
    g.add_argument("--fake-run-log", type=Path, default=None, help="--fake: append a JSON line per run start and end")
    add_replica_args(p)
    lim = add_canvas_limit_args(p, "clip")
    lim.add_argument(
        "--max-frames", type=positive_int, default=None, help="frames per clip (default: those of --max-seconds)"
    )
    lim.add_argument(
        "--max-pixel-seconds",
        type=positive_float,
        default=None,
        help="generated pixels x seconds (default: the model's canvas for --max-seconds)",
    )
    lim.add_argument(
        "--max-job-memory-gib",
        type=positive_float,
        default=None,
        help="estimated memory one job may take (default: free device memory after loading)",
    )
    add_media_args(p)
    add_runtime_args(p, tp=True)
    add_model_args(p, service=SERVICE, default=DEFAULT_MODEL)
    m = p.add_argument_group(
        "requests",
        "what a request that leaves them out gets (the defaults named are MiniMax H3's; a Wan 2.2 model's are its "
        "release's canvas, length and steps)",
    )
    m.add_argument(
        "--steps-default",
        type=positive_int,
        default=None,
        help="num_inference_steps when a request omits it (default: 50; --fake 4)",
    )
    m.add_argument(
        "--size-default",
        type=canvas_size,
        default=None,
        help="size when a request omits it (default: 1344x768; --config tiny 64x32; --fake 64x64)",
    )
    m.add_argument(
        "--seconds-default",
        type=positive_float,
        default=None,
        help="seconds when a request omits it (default: 5; --config tiny and --fake 0.5)",
    )
    add_warmup_arg(m, what="two discarded requests of one DiT call each (the default size and seconds, then another)")
    p.set_defaults(func=run_serve)
    return p


def add_media_args(p: argparse.ArgumentParser) -> None:
    """The DiT partition served, the uploads a request may carry, and the LoRAs it may name."""
    g = p.add_argument_group("keyframes, references and LoRAs (PROTOCOL.md)")
    g.add_argument(
        "--task-partition",
        choices=("FL2VA", "Ref2VA"),
        default="FL2VA",
        help="MiniMax H3's DiT to serve: FL2VA runs text-only and keyframe (input_reference, last_frame) jobs, "
        "Ref2VA runs reference jobs; a job the other one runs gets 422 naming it",
    )
    g.add_argument(
        "--max-image-mib", type=positive_float, default=10.0, help="largest image file (a keyframe or reference)"
    )
    g.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=4096 * 4096,
        help="most pixels of an image, read from its header",
    )
    g.add_argument("--max-clip-mib", type=positive_float, default=32.0, help="largest video or audio reference file")
    g.add_argument(
        "--lora-dir",
        type=Path,
        default=None,
        help="the directory of LoRA files (NAME.safetensors) a request may name in 'lora'; the only place LoRAs "
        "come from (needs the DiT's blocks resident: not --offload block)",
    )
    g.add_argument("--max-loras", type=non_negative_int, default=4, help="most LoRAs one request may stack")
    g.add_argument(
        "--lora-scale-range",
        type=finite_float,
        nargs=2,
        default=(-4.0, 4.0),
        metavar=("MIN", "MAX"),
        help="the scales a request may give a LoRA",
    )


def media_options(args: argparse.Namespace) -> tuple[MediaLimits, LoraPolicy]:
    low, high = args.lora_scale_range
    if low > high:  # --max-loras is range-checked by its argparse type
        raise StartupError("--lora-scale-range MIN MAX needs MIN <= MAX")
    media = MediaLimits(
        max_image_bytes=int(args.max_image_mib * 2**20),
        max_image_pixels=args.max_image_pixels,
        max_clip_bytes=int(args.max_clip_mib * 2**20),
    )
    return media, LoraPolicy(max_loras=args.max_loras, min_scale=low, max_scale=high)


def run_serve(args: argparse.Namespace) -> int:
    check_replica_args(args)
    media_options(args)  # a bad flag ends the command before any weight loads
    spec = chosen_spec(args, service=SERVICE, command="serve")
    own_name = spec.served_name or spec.name
    if args.fake:
        args.fake_stands_in_for = own_name
    if args.served_model_name is None:
        args.served_model_name = f"{FAKE_PREFIX}{own_name}" if args.fake else own_name
    build = build_fake_runner if args.fake else spec.adapter_builder(SERVICE)
    return run_service(
        args,
        build,
        serve=lambda runner: _serve(args, runner),
        lead=FollowingRunner,
        follow=follow_runner,
        close_model=True,
    )


def _serve(args: argparse.Namespace, runner: VideoRunner) -> int:
    from .app import create_video_app

    limits = VideoLimitFlags.from_args(args)
    media, loras = media_options(args)
    job_store, artifacts = open_stores(args)  # rank 0 only: followers never touch the database or the bucket
    app = create_video_app(
        runner,
        job_store=job_store,
        artifacts=artifacts,
        worker_id=args.replica_id,
        max_seconds=args.max_seconds,
        max_steps=args.max_steps,
        max_body_bytes=int(args.max_body_mib * 2**20) if args.max_body_mib is not None else None,
        shutdown_timeout_s=args.shutdown_timeout,
        limits=limits,
        api_keys=keys_from_args(args),
        models=names(SERVICE),
        media_limits=media,
        lora_policy=loras,
    )
    check_request_defaults(app.state.service)
    model = runner.model
    if runner.metadata.get("fake"):
        also = runner.metadata["stands_in_for"]
        model += f" (a fake model: test pattern and tone, no weights; requests may also name {also})"
    describe = f"model: {model}, jobs: {job_store.location}, artifacts: {artifacts.location}"
    return serve_until_stopped(app, args, describe=describe, command="serve")


def check_request_defaults(service) -> None:
    """A request that names only a prompt must be one this service runs: otherwise every such request would get a 422
    for what the server was started with."""
    try:
        service.validate("application/json", b'{"prompt": "the start-up check of the request defaults"}')
    except RequestError as exc:
        raise StartupError(
            f"a request that leaves size, seconds and steps out would be refused: {exc.detail}; change "
            "--size-default, --seconds-default or --steps-default, or the limit named"
        ) from None


def main(argv: list[str] | None = None) -> int:
    return run_command(add_serve_parser, "python -m telefuser.serving.video.cli", argv)


if __name__ == "__main__":
    sys.exit(main())
