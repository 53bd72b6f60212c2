"""The `telefuser` command line: `info`, `plan`, `serve` and `serve-stream`.

Every subcommand's `--help` shows its defaults, a mistake on the command line or at start-up is one line with exit
status 2 (serving/common/cli_help.py, serving/common/startup.py), and `telefuser --version` names this build.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

from . import __version__
from .serving.common.cli_help import OneLineErrorParser
from .serving.common.startup import run_cli


def _info(args: argparse.Namespace) -> int:
    print(json.dumps(host_info(), indent=2))
    return 0


def host_info() -> dict:
    """Versions, GPUs, the models and the attention backends; the GPU builds (tf-kernel, SageAttention2's SM90
    kernels) only where they apply: a CUDA build of torch, or a build that is installed anyway."""
    import torch

    from .ops.attention_registry import available_names

    info = {
        "telefuser": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "models": _models(),
        "attention_impls": available_names(),
    }
    try:
        import tf_kernel

        info["tf_kernel"] = tf_kernel.capabilities()
    except ImportError as exc:
        if torch.version.cuda is not None:
            info["tf_kernel"] = f"not available: {exc} (make build-sm90)"
    if torch.version.cuda is not None:
        from .ops.attention_sage import sage_sm90_build_info

        # SageAttention2's SM90 build (sage_sm90): present, importable, and whether its launches follow torch's stream
        info["sage_sm90_build"] = sage_sm90_build_info()
    else:
        info["gpu_builds"] = "none apply: this torch is a CPU-only build (tf-kernel and sage_sm90 need CUDA torch)"
    return info


def _models() -> list[dict]:
    """Each registered model: its name (--model), what it is and which commands serve it."""
    from .models import registry

    commands = {"video": "telefuser serve", "stream": "telefuser serve-stream"}
    models = []
    for name in registry.names():
        spec = registry.get_spec(name)
        served = [command for kind, command in commands.items() if spec.serves(kind)]
        models.append({"name": name, "title": spec.title, "served_by": served})
    return models


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="telefuser",
        description="Inference for video diffusion transformers: batch text-to-video+audio jobs (serve) and "
        "interactive world-model streams (serve-stream), on CPU or Ulysses/TP across GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"telefuser {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "info", help="print versions, GPUs, models, attention backends and the GPU builds that apply here"
    )
    p.set_defaults(func=_info)
    from .memory.command import add_plan_parser

    add_plan_parser(sub)
    try:
        from .serving.stream.cli import add_serve_stream_parser
        from .serving.video.cli import add_serve_parser
    except ImportError as exc:  # a machine with torch but not the service stack: `info` must still answer
        for name in ("serve", "serve-stream"):
            missing = sub.add_parser(name, help=f"unavailable here: {exc}", add_help=False)
            missing.set_defaults(func=lambda _args, why=str(exc): _services_missing(why), takes_any_arguments=True)
        return parser
    add_serve_parser(sub)
    add_serve_stream_parser(sub)
    return parser


def _services_missing(why: str) -> int:
    raise SystemExit(f"the services need their packages ({why}); pip install 'telefuser[serve]'")


def _subcommand_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the subcommand given (its errors name it), else `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, "command", None) in action.choices:
            return action.choices[args.command]
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_any_arguments", False):
        _subcommand_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return run_cli(args.func, args, args.command)


if __name__ == "__main__":
    sys.exit(main())
