"""Comparing float results that reached the same value along different computation paths.

Exact equality is for data movement (copies, scatter/gather, weights read back) and for literally the same
computation. Two computations that differ in order -- chunked vs whole, parallel vs dense, another buffer shape,
another CPU's kernels -- agree only to rounding, and by how much depends on the host: compare them with
`relative_error` against a bound derived from the dtype's unit roundoff and the problem, and keep a negative
control that shows a real bug lands orders of magnitude above the bound. Tests doing so carry the `numerics` marker;
`make test` runs them a second time under torch's portable kernels.
"""

from __future__ import annotations

import torch

# Unit roundoff u = 2**-p of each dtype (p = significand bits): one rounding moves a value by at most u relatively.
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, in float64. Refuses an all-zero reference: never compare on zeros."""
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    expected = expected.detach().double()
    scale = expected.abs().max().item()
    assert scale > 0, "the reference is all zeros: nothing would be compared"
    return (actual.detach().double() - expected).abs().max().item() / scale
