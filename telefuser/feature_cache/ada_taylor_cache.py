"""AdaTaylorCache as a DiT block hook: skip the whole block stack on precomputed steps.

A compute step runs the blocks and keeps the residual and its derivatives; a skipped step returns the input plus a
Taylor extrapolation of the residual (or the last one, past `taylor_threshold`). The rule is in this folder's README.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .params import AdaTaylorParams
from .schedule import compute_step_mask

RunBlocks = Callable[[torch.Tensor], torch.Tensor]


class TaylorResidual:
    """Residual history at compute steps and its extrapolation to later steps."""

    def __init__(self, n_derivatives: int = 1, taylor_threshold: int = 2) -> None:
        if n_derivatives < 0 or taylor_threshold < 1:
            raise ValueError(
                f"need n_derivatives >= 0 and taylor_threshold >= 1, got {n_derivatives}, {taylor_threshold}"
            )
        self.n_derivatives = n_derivatives
        self.taylor_threshold = taylor_threshold
        self.derivatives: list[torch.Tensor] = []  # [R, dR/ds, d2R/ds2, ...] at the last compute step
        self.last_step: int | None = None

    def update(self, residual: torch.Tensor, step: int) -> None:
        previous = self.derivatives
        current = [residual.detach()]
        if self.last_step is not None and previous and previous[0].shape == residual.shape:
            window = max(1, step - self.last_step)
            for order in range(min(self.n_derivatives, len(previous))):
                current.append((current[order] - previous[order]) / window)
        self.derivatives = current
        self.last_step = step

    def approximate(self, step: int) -> torch.Tensor:
        if self.last_step is None:
            raise RuntimeError("no residual computed yet: the first step must be a compute step")
        elapsed = step - self.last_step
        if elapsed > self.taylor_threshold:
            return self.derivatives[0]
        out = self.derivatives[0]
        for order, derivative in enumerate(self.derivatives[1:], start=1):
            out = out + derivative * (elapsed**order / math.factorial(order))
        return out


class AdaTaylorCache:
    """Block hook that computes or approximates the block stack per a precomputed step schedule."""

    def __init__(
        self,
        params: AdaTaylorParams,
        num_steps: int,
        *,
        n_derivatives: int = 1,
        taylor_threshold: int = 2,
        init_step: int = 0,
    ) -> None:
        self.params = params
        self.num_steps = num_steps
        self.compute_mask = compute_step_mask(
            params.mag_ratios,
            num_steps,
            K=params.K,
            retention_ratio=params.retention_ratio,
            thresh=params.thresh,
            init_step=init_step,
        )
        self.residual = TaylorResidual(n_derivatives, taylor_threshold)
        self.step: int | None = None
        self._step_used = False
        self.computed: list[int] = []
        self.skipped: list[int] = []

    @property
    def compute_steps(self) -> list[int]:
        return [i for i, compute in enumerate(self.compute_mask) if compute]

    def set_step(self, step: int) -> None:
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step {step} is outside the schedule of {self.num_steps} DiT calls")
        self.step = step
        self._step_used = False

    def __call__(self, hidden: torch.Tensor, run_blocks: RunBlocks, tags: torch.Tensor | None = None) -> torch.Tensor:
        if self.step is None or self._step_used:
            raise RuntimeError("AdaTaylorCache: call set_step(i) before every DiT call (one block_hook call per step)")
        self._step_used = True
        if self.compute_mask[self.step]:
            out = run_blocks(hidden)
            self.residual.update(out - hidden, self.step)
            self.computed.append(self.step)
            return out
        self.skipped.append(self.step)
        return hidden + self.residual.approximate(self.step).to(hidden.dtype)

    def reset(self) -> None:
        self.residual = TaylorResidual(self.residual.n_derivatives, self.residual.taylor_threshold)
        self.step, self._step_used = None, False
        self.computed, self.skipped = [], []

    def stats(self) -> dict:
        return {"computed": len(self.computed), "skipped": len(self.skipped), "skipped_steps": list(self.skipped)}
