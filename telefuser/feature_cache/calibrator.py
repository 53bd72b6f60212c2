"""Record the per-step magnitude ratios AdaTaylorCache needs, as a DiT block hook.

Every step is computed; the ratio of consecutive block-stack residuals is averaged over the rows of one modality
(MiniMax H3's audio) and agreed across sequence-parallel ranks (this folder's README).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from .params import AdaTaylorParams

AUDIO_TAG = 2


def select_rows(x: torch.Tensor, tags: torch.Tensor | None, modality: int | None) -> torch.Tensor:
    """Rows of `x` ([..., D]) whose tag equals `modality`; all rows when either is None."""
    if tags is None or modality is None:
        return x.reshape(-1, x.shape[-1])
    tags = tags.to(x.device)
    if tuple(x.shape[:-1]) == tuple(tags.shape):
        return x[tags == modality]
    if x.ndim == 3 and tags.ndim == 1 and x.shape[1] == tags.shape[0]:
        return x[:, tags == modality].reshape(-1, x.shape[-1])
    raise ValueError(f"tags of shape {tuple(tags.shape)} do not index the rows of hidden {tuple(x.shape)}")


class AdaTaylorCacheCalibrator:
    def __init__(
        self, num_steps: int, *, modality: int | None = AUDIO_TAG, group: dist.ProcessGroup | None = None
    ) -> None:
        self.num_steps = num_steps
        self.modality = modality
        self.group = group
        self.step: int | None = None
        self.ratios: list[float] = [1.0]  # step 0 has no predecessor
        self._previous: torch.Tensor | None = None

    def set_step(self, step: int) -> None:
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step {step} is outside the schedule of {self.num_steps} DiT calls")
        self.step = step

    def __call__(self, hidden: torch.Tensor, run_blocks, tags: torch.Tensor | None = None) -> torch.Tensor:
        out = run_blocks(hidden)
        residual = select_rows((out - hidden).float(), tags, self.modality)
        if self._previous is not None:
            if self._previous.shape != residual.shape:
                raise RuntimeError("calibration rows changed shape between steps")
            ratio = residual.norm(dim=-1) / self._previous.norm(dim=-1).clamp_min(1e-12)
            totals = torch.stack([ratio.sum(), torch.tensor(float(ratio.numel()), device=ratio.device)])
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(totals, group=self.group)
            self.ratios.append(round(float(totals[0] / totals[1].clamp_min(1.0)), 5))
        self._previous = residual.detach()
        return out

    @property
    def finished(self) -> bool:
        return len(self.ratios) >= self.num_steps

    def params(self, *, K: int = 2, retention_ratio: float = 0.2, thresh: float = 0.03, sigma_shift=None, notes=None):
        if not self.finished:
            raise RuntimeError(f"calibration saw {len(self.ratios)} of {self.num_steps} steps")
        return AdaTaylorParams(
            mag_ratios=tuple(self.ratios),
            K=K,
            retention_ratio=retention_ratio,
            thresh=thresh,
            sigma_shift=sigma_shift,
            num_inference_steps=self.num_steps,
            notes=dict(notes or {}),
        )

    def save(self, path: str | Path, **kwargs) -> AdaTaylorParams:
        params = self.params(**kwargs)
        params.save(path)
        return params

    def stats(self) -> dict:
        return {"computed": len(self.ratios), "skipped": 0}
