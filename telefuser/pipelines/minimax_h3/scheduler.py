"""MiniMax H3 rectified-flow sampling: shifted sigma schedules and the Euler (eta=0) update.

Conventions (the public MiniMax H3 reference stage, see README.md in this folder):

* rectified flow, ``x_sigma = (1 - sigma) * x0 + sigma * noise``; the DiT predicts the velocity ``v`` and
  ``x0 = x + sigma * v``. The model-facing time is ``t = 1 - sigma`` (t = 0 is pure noise, t = 1 is clean).
* a schedule of ``num_steps`` points is ``linspace(1, 0, num_steps)`` warped by
  ``shift * s / (1 + (shift - 1) * s)``; the end points stay 1 and 0, so ``num_steps`` points give
  ``num_steps - 1`` DiT calls (50 steps -> 49 calls).
* video and audio follow their own schedule (video shift 12, audio shift 3) inside one denoising loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_VIDEO_FLOW_SHIFT = 12.0
DEFAULT_AUDIO_FLOW_SHIFT = 3.0
DEFAULT_NUM_STEPS = 50


def time_shift_sigmas(num_steps: int, shift: float) -> list[float]:
    """``num_steps`` sigma points from 1 down to 0, time-shifted; computed in fp32 like the reference."""
    if isinstance(num_steps, bool) or int(num_steps) != num_steps or num_steps < 2:
        raise ValueError(f"num_steps must be an integer >= 2 (N points give N-1 DiT calls), got {num_steps!r}")
    if not shift > 0:
        raise ValueError(f"flow shift must be > 0, got {shift!r}")
    base = torch.linspace(1.0, 0.0, int(num_steps), dtype=torch.float32)
    shifted = float(shift) * base / (1 + (float(shift) - 1) * base)
    # A huge shift can round neighbouring points to the same fp32 value; a repeated point would be a zero-length step.
    shifted = torch.unique_consecutive(shifted)
    if shifted[-1].item() > 0.0:
        shifted = torch.cat([shifted, shifted.new_zeros(1)])
    return [float(v) for v in shifted.tolist()]


def velocity_to_x0(x: torch.Tensor, velocity: torch.Tensor, sigma: float) -> torch.Tensor:
    """Clean estimate from a velocity prediction: ``x0 = x + sigma * v`` (sigma = 1 - t)."""
    return x + sigma * velocity


def euler_eta0_step(x: torch.Tensor, x0: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
    """``x_next = r * x + (1 - r) * x0`` with ``r = sigma_next / sigma``, in fp32, returned in x's dtype.

    At sigma == 0 there is nothing left to remove and x is returned unchanged.
    """
    if sigma_next < 0 or sigma < 0:
        raise ValueError(f"sigmas must be non-negative, got {sigma} -> {sigma_next}")
    if sigma == 0.0:
        return x
    ratio = sigma_next / sigma
    out = ratio * x.float() + (1.0 - ratio) * x0.float()
    return out.to(x.dtype)


@dataclass(frozen=True)
class FlowSchedule:
    """The paired video/audio schedules of one request."""

    video_sigmas: tuple[float, ...]
    audio_sigmas: tuple[float, ...]

    @classmethod
    def build(
        cls,
        num_steps: int = DEFAULT_NUM_STEPS,
        video_shift: float = DEFAULT_VIDEO_FLOW_SHIFT,
        audio_shift: float = DEFAULT_AUDIO_FLOW_SHIFT,
    ) -> FlowSchedule:
        video = tuple(time_shift_sigmas(num_steps, video_shift))
        audio = tuple(time_shift_sigmas(num_steps, audio_shift))
        if len(video) != len(audio):
            # Only possible when one shift collapses fp32 points; the loop needs one call per step for both.
            raise ValueError(
                f"video and audio schedules differ in length ({len(video)} vs {len(audio)}); "
                "choose less extreme flow shifts"
            )
        return cls(video, audio)

    @property
    def num_dit_calls(self) -> int:
        return len(self.video_sigmas) - 1

    def model_times(self, step: int) -> tuple[float, float]:
        """(t_video, t_audio) in [0, 1] for DiT call ``step``: t = 1 - sigma."""
        return 1.0 - self.video_sigmas[step], 1.0 - self.audio_sigmas[step]

    def step(
        self, step: int, video: torch.Tensor, audio: torch.Tensor, v_video: torch.Tensor, v_audio: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance both modalities by one Euler step with their own sigmas."""
        sv, sv_next = self.video_sigmas[step], self.video_sigmas[step + 1]
        sa, sa_next = self.audio_sigmas[step], self.audio_sigmas[step + 1]
        video = euler_eta0_step(video, velocity_to_x0(video.float(), v_video.float(), sv), sv, sv_next)
        audio = euler_eta0_step(audio, velocity_to_x0(audio.float(), v_audio.float(), sa), sa, sa_next)
        return video, audio
