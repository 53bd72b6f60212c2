"""Achieved TFLOP/s that count the same work whichever kernel runs it, against both ceilings of the GPU.

FlopCounterMode misses attention kernels outside aten (flash-attn-4, SageAttention), so attention is counted by
formula and the rest as dispatched; on torch SDPA the counter cross-checks the formula. Ceilings: the lent H200's
measured bf16 matmul rate (786) and the datasheet's dense bf16 figure (989 TFLOP/s).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

H200_MEASURED_MATMUL_TFLOPS = 786.0  # bf16 8192^3 on the lent H200
H200_DATASHEET_BF16_TFLOPS = 989.0  # H200 SXM, dense bf16 (1979 with sparsity)
NO_ATTENTION_IMPLS = ("identity",)  # returns Q: attends nothing


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)  # torch's own formula for the CUDA SDPA ops


def flop_counter() -> FlopCounterMode:
    """FlopCounterMode that also counts torch's CPU SDPA op (the one it has no formula for)."""
    cpu_sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    return FlopCounterMode(display=False, custom_mapping={cpu_sdpa: _cpu_sdpa_flops})


def dispatched_attention_flops(counter: FlopCounterMode) -> int:
    """What the counter attributed to attention ops (0 for kernels outside aten)."""
    return sum(flops for op, flops in counter.get_flop_counts().get("Global", {}).items() if "attention" in str(op))


def counted_flops(counter: FlopCounterMode) -> int:
    """Everything the counter saw except attention: the matmuls and convolutions."""
    return counter.get_total_flops() - dispatched_attention_flops(counter)


def attention_flops(batch: int, heads: int, query_rows: int, key_rows: int, head_dim: int) -> int:
    """Softmax attention by formula: Q·K^T and P·V, 2·Sq·Sk·D multiply-adds each, per batch item and head."""
    return 4 * batch * heads * query_rows * key_rows * head_dim


def ceilings(device_name: str | None) -> dict[str, float] | None:
    """The two ceilings of a GPU this project has numbers for (the H200), else None."""
    if device_name and "H200" in device_name:
        return {"measured_matmul": H200_MEASURED_MATMUL_TFLOPS, "datasheet_bf16_dense": H200_DATASHEET_BF16_TFLOPS}
    return None


def rate(flops: float, seconds: float, device_name: str | None) -> dict:
    """Achieved TFLOP/s and its fraction of both ceilings (None where the device has no numbers here, e.g. CPU)."""
    tflops = flops / seconds / 1e12
    known = ceilings(device_name)
    return {
        "achieved_tflops": tflops,
        "of_measured_matmul_ceiling": tflops / known["measured_matmul"] if known else None,
        "of_datasheet_bf16_dense": tflops / known["datasheet_bf16_dense"] if known else None,
    }


def describe(report: dict) -> str:
    """``'412.3 TFLOP/s (52% of the measured 786, 42% of the datasheet 989)'``, or the rate alone."""
    text = f"{report['achieved_tflops']:.1f} TFLOP/s"
    if report["of_measured_matmul_ceiling"] is None:
        return text
    return (
        f"{text} ({report['of_measured_matmul_ceiling']:.0%} of the measured {H200_MEASURED_MATMUL_TFLOPS:.0f}, "
        f"{report['of_datasheet_bf16_dense']:.0%} of the datasheet {H200_DATASHEET_BF16_TFLOPS:.0f})"
    )
