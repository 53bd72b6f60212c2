"""The arguments `telefuser serve` passes to `build_minimax_runner`, for the tiny random model on the CPU."""

from __future__ import annotations

import argparse


def tiny_runner_args(**overrides) -> argparse.Namespace:
    base = dict(
        config="tiny",
        checkpoint=None,
        device="cpu",
        dtype="float32",
        attn_impl="sdpa",
        ulysses_degree=1,
        tp_degree=1,
        enable_feature_cache=False,
        steps_default=3,
        size_default=None,
        seconds_default=None,
        served_model_name="MiniMax-H3",
        offload="auto",
        gpu_memory_gb=None,
        task_partition="FL2VA",
        lora_dir=None,
    )
    return argparse.Namespace(**{**base, **overrides})
