"""What every opaque custom op of a compiled region shares: its outputs must be fresh tensors.

A `torch.library` custom op may not return a tensor that aliases one of its inputs (the compiler would not know the
two share memory). Kernels that can hand an input back unchanged (attention ``identity``, a one-rank exchange) go
through `fresh_output`, which copies only then.
"""

from __future__ import annotations

import torch


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def fresh_output(out: torch.Tensor, *inputs: torch.Tensor | None) -> torch.Tensor:
    """`out`, or a copy of it when it shares storage with one of `inputs`."""
    if any(t is not None and t.numel() and _storage(t) == _storage(out) for t in inputs) and out.numel():
        return out.clone()
    return out
