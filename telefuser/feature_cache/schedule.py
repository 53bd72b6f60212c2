"""Which denoising steps AdaTaylorCache computes, decided once from calibrated magnitude ratios.

Steps are skipped while the accumulated ratio error stays under `thresh` and at most `K` in a row; the first share
of steps, the last and the initial one always run. The walk is described in this folder's README.
"""

from __future__ import annotations

from collections.abc import Sequence


def resample_ratios(ratios: Sequence[float], length: int) -> list[float]:
    """Nearest-index resampling of a calibrated list onto another step count (endpoints kept)."""
    if not ratios:
        raise ValueError("mag_ratios must not be empty")
    if length == len(ratios):
        return [float(r) for r in ratios]
    if length == 1:
        return [float(ratios[-1])]
    scale = (len(ratios) - 1) / (length - 1)
    return [float(ratios[int(round(i * scale))]) for i in range(length)]


def compute_step_mask(
    mag_ratios: Sequence[float],
    num_steps: int,
    *,
    K: int,
    retention_ratio: float,
    thresh: float,
    init_step: int = 0,
) -> list[bool]:
    """One flag per step: True = run the blocks, False = approximate from the cache."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be positive, got {num_steps}")
    if K < 0 or not 0.0 <= retention_ratio <= 1.0 or thresh < 0:
        raise ValueError(f"invalid cache parameters K={K}, retention_ratio={retention_ratio}, thresh={thresh}")
    ratios = resample_ratios(mag_ratios, num_steps)
    start_step = int(num_steps * retention_ratio)
    compute = [False] * num_steps
    err, skipped, product = 0.0, 0, 1.0
    for step in range(num_steps):
        if step <= start_step or step == num_steps - 1 or step == init_step:
            compute[step] = True
            err, skipped, product = 0.0, 0, 1.0
            continue
        product *= ratios[step]
        skipped += 1
        err += abs(1.0 - product)
        if err < thresh and skipped <= K:
            continue
        compute[step] = True
        err, skipped, product = 0.0, 0, 1.0
    return compute
