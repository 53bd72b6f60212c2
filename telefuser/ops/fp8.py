"""FP8 (e4m3) GEMMs for a DiT's projection and FFN linears: an opt-in trade of accuracy for speed.

Per-output-channel weight scales, dynamic per-row activation scales, `torch._scaled_mm` with fp32 accumulation.
The scheme, the measured speed and the expected error are in this folder's README.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .fusion import cuda_fused

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_TINY = 1e-12  # an all-zero row keeps a finite scale (its quantized values are zeros either way)
QUANTIZATIONS = ("none", "fp8")


@cuda_fused
def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x ``[M, K]`` -> (e4m3 values ``[M, K]``, fp32 scales ``[M, 1]``) with ``x ~= values * scales``."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=_TINY) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Float8Linear(nn.Module):
    """A frozen `nn.Linear` whose weight is stored in e4m3 with per-output-channel scales; inference only."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        out_features, in_features = linear.weight.shape
        if in_features % 16 or out_features % 16:
            raise ValueError(f"FP8 GEMMs need both dimensions divisible by 16, got {out_features}x{in_features}")
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = linear.weight.dtype
        weight, scale = quantize_rows(linear.weight.detach())
        self.register_buffer("weight", weight)  # [out, in] row-major: weight.t() is the column-major mat2
        self.register_buffer("weight_scale", scale.t().contiguous())  # [1, out]
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().to(self.compute_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        values, scale = quantize_rows(rows)
        out = torch._scaled_mm(
            values,
            self.weight.t(),
            scale_a=scale,
            scale_b=self.weight_scale,
            bias=self.bias,
            out_dtype=self.compute_dtype,
        )
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 (weight per channel, "
            f"activations per row), computes in {self.compute_dtype}"
        )


def quantize_blocks(model: nn.Module, quantization: str, linears: tuple[str, ...]) -> list[str]:
    """A DiT's quantization: ``"fp8"`` applies `Float8Linear` to the linears named `linears` inside every
    ``blocks.<i>`` (in place, noted in ``model.weights_source``); ``"none"`` does nothing. Returns the names."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be 'none' or 'fp8', got {quantization!r}")
    if quantization == "none":
        return []
    names = quantize_linears(model, lambda name, _: is_block_linear(name, linears))
    model.weights_source = f"{getattr(model, 'weights_source', '')}, fp8 GEMMs"
    return names


def is_block_linear(module: str, linears: tuple[str, ...]) -> bool:
    """Whether the module named `module` is one of `linears` inside a ``blocks.<i>`` (what `quantize_blocks` takes)."""
    parts = module.split(".", 2)
    return len(parts) == 3 and parts[0] == "blocks" and parts[2] in linears


def linear_dtype(layer: nn.Module) -> torch.dtype:
    """The dtype a linear takes and gives: its weight's, or a quantized linear's activation dtype."""
    return layer.compute_dtype if isinstance(layer, Float8Linear) else layer.weight.dtype


def quantize_linears(model: nn.Module, select: Callable[[str, nn.Linear], bool]) -> list[str]:
    """Replace every `nn.Linear` of `model` for which ``select(name, linear)`` holds by a `Float8Linear`, in place,
    keeping its forward hooks (a TP split's collective). Returns the replaced names. Linears whose shape an FP8
    GEMM cannot take are refused by name."""
    chosen = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and select(name, module)
    ]
    for name, linear in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        try:
            quantized = Float8Linear(linear)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        for hook in linear._forward_hooks.values():  # e.g. a tensor-parallel collective on the output
            quantized.register_forward_hook(hook)
        setattr(parent, child, quantized)
    return [name for name, _ in chosen]
