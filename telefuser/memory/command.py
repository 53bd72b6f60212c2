"""`telefuser plan`: a model's memory plan for a request, before anything loads and without a GPU.

    telefuser plan --model minimax_h3 --config official --gpu-memory-gb 80
    telefuser plan --model lingbot_world_v2 --config official --quantization fp8 --gpu-memory-gb 48 --sessions 2

It prints each offload tier's table (weights resident and streamed, what the request holds, each stage, the peak)
and the tier `--offload auto` would choose for that budget, or the refusal an entry point would give.
"""

from __future__ import annotations

import argparse
import sys

from ..arg_types import int_at_least, positive_float, positive_int
from ..models import registry
from ..runtime import DTYPE_NAMES


def add_plan_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="print a model's memory plan for a request and a GPU budget (loads nothing, needs no GPU)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    names = registry.names()
    p.add_argument("--model", choices=names, required=True, help="the registered model")
    p.add_argument("--ulysses-degree", type=positive_int, default=1, help="Ulysses degree of the launch (default 1)")
    p.add_argument("--tp-degree", type=positive_int, default=1, help="tensor-parallel degree of the launch (default 1)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="bfloat16", help="model dtype (default bfloat16)")
    request = p.add_argument_group("the request (each model reads its own; the model's defaults for the rest)")
    request.add_argument("--duration", type=positive_float, help="MiniMax H3: seconds")
    # --size too: Wan 2.2's entry points and its refusals name the canvas that way
    request.add_argument("--resolution", "--size", help="MiniMax H3: short edge or WxH; LingBot, Wan 2.2: WxH")
    request.add_argument("--aspect-ratio", help="MiniMax H3: e.g. 16:9")
    request.add_argument("--steps", type=int_at_least(2), help="MiniMax H3: sigma points (steps - 1 DiT calls)")
    request.add_argument(
        "--num-frames", type=positive_int, help="LingBot: frames of a session; Wan 2.2: frames of the clip"
    )
    request.add_argument("--fps", type=positive_int, help="LingBot: frames per second")
    request.add_argument("--sessions", type=positive_int, dest="max_sessions", help="LingBot: sessions held at once")
    added: set[str] = set()
    for name in names:
        spec = registry.get_spec(name)
        group = p.add_argument_group(f"{name} flags")
        for flag in spec.flags:
            if not added & set(flag.names):
                flag.add_to(group, default=argparse.SUPPRESS)
                added.update(flag.names)
    p.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    import torch

    from ..distributed.mesh import ParallelConfig
    from .plan import GIB, HEADROOM, TIERS, MemoryPlanError, choose, plan_tier

    spec = registry.get_spec(args.model)
    for flag in spec.flags:  # the chosen model's defaults where not given
        if flag.dest not in vars(args):
            setattr(args, flag.dest, flag.default)
    try:
        parallel = ParallelConfig(ulysses_degree=args.ulysses_degree, tp_degree=args.tp_degree)
        dtype = getattr(torch, args.dtype)
        request = spec.request_from_args(args)
        workload = spec.memory_workload(args, parallel, dtype, request)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gb = spec.option(args, "gpu_memory_gb")
    budget = None if gb is None else int(gb * GIB * HEADROOM)
    source = "no budget: pass --gpu-memory-gb N to check a card" if gb is None else f"{HEADROOM:g} x {gb:g} GiB"
    print(f"{workload.title}, {workload.weight_bytes / GIB:.1f} GiB of weights on each rank\n")
    for tier in TIERS:
        if tier in workload.refused_tiers:
            print(f"--offload {tier}: refused: {workload.refused_tiers[tier]}\n")
            continue
        print(plan_tier(workload, tier, budget, source).table() + "\n")
    if budget is None:
        return 0
    try:
        alternatives = ()
        if spec.memory_alternatives:
            from ..models.spec import resolve

            alternatives = resolve(spec.memory_alternatives)(args, parallel, dtype, request)
        chosen = choose(
            workload, budget, tier=spec.option(args, "offload"), budget_source=source, alternatives=alternatives
        )
    except MemoryPlanError as exc:
        print(f"refused: {exc}")
        return 1
    print(f"chosen: {chosen.summary()}")
    return 0
