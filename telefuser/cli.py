"""The `telefuser` command line."""

from __future__ import annotations

import argparse
import json
import platform
import sys


def _info(args: argparse.Namespace) -> int:
    import torch

    from . import __version__
    from .ops.attention import available_attention_impls
    from .ops.attention_sage import sage_sm90_build_info

    info = {
        "telefuser": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "attention_impls": available_attention_impls(),
        # SageAttention2's SM90 build (sage_sm90): present, importable, and whether its launches follow torch's stream
        "sage_sm90_build": sage_sm90_build_info(),
    }
    try:
        import tf_kernel

        info["tf_kernel"] = tf_kernel.capabilities()
    except ImportError as exc:
        info["tf_kernel"] = f"not available: {exc}"
    print(json.dumps(info, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="telefuser", description="Ulysses sequence-parallel DiT inference.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="print versions, GPUs, attention backends and tf-kernel capabilities")
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
    print(f"error: the services need their packages (pip install 'telefuser[serve]'): {why}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
