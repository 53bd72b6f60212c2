"""Feature caches that let a DiT skip its block stack on some denoising steps.

A cache is a DiT ``block_hook(hidden, run_blocks, tags) -> hidden`` with ``set_step(i)`` called before DiT call
``i`` and ``stats()`` reporting computed / skipped calls.
"""

from __future__ import annotations

from .ada_taylor_cache import AdaTaylorCache, TaylorResidual
from .calibrator import AdaTaylorCacheCalibrator, select_rows
from .params import AdaTaylorParams, params_path
from .schedule import compute_step_mask, resample_ratios


def create_feature_cache(
    kind: str, num_steps: int, *, params: AdaTaylorParams | None = None, model: str = "minimax_h3"
):
    """``"ada_taylor"`` (bundled or given params), ``"calibrator"``, or ``"none"`` (returns None)."""
    if kind == "none":
        return None
    if kind == "ada_taylor":
        return AdaTaylorCache(params or AdaTaylorParams.load(params_path(model)), num_steps)
    if kind == "calibrator":
        return AdaTaylorCacheCalibrator(num_steps)
    raise ValueError(f"unknown feature cache {kind!r}; choose ada_taylor, calibrator or none")


__all__ = [
    "AdaTaylorCache",
    "AdaTaylorCacheCalibrator",
    "AdaTaylorParams",
    "TaylorResidual",
    "compute_step_mask",
    "create_feature_cache",
    "params_path",
    "resample_ratios",
    "select_rows",
]
