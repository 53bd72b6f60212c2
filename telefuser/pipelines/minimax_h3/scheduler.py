"""MiniMax H3 sampling: two diffusers ``MiniMaxH3Scheduler`` instances (video shift 12, audio shift 3) stepped in one
denoising loop.

The released rectified-flow Euler sampler is used as is (its maths is in this folder's README); `FlowSchedule` only
refuses a shift that gives the two modalities schedules of different lengths, which diffusers' loop would silently
truncate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import MiniMaxH3Scheduler

DEFAULT_VIDEO_FLOW_SHIFT = 12.0
DEFAULT_AUDIO_FLOW_SHIFT = 3.0
DEFAULT_NUM_STEPS = 50


def make_scheduler(num_steps: int, shift: float) -> MiniMaxH3Scheduler:
    """A ``MiniMaxH3Scheduler`` with its ``num_steps``-point schedule set (built on the CPU, in float32)."""
    if isinstance(num_steps, bool) or int(num_steps) != num_steps or num_steps < 2:
        raise ValueError(f"num_steps must be an integer >= 2 (N points give N-1 DiT calls), got {num_steps!r}")
    if not shift > 0:
        raise ValueError(f"flow shift must be > 0, got {shift!r}")
    scheduler = MiniMaxH3Scheduler(shift=float(shift))
    scheduler.set_timesteps(int(num_steps))
    return scheduler


@dataclass
class FlowSchedule:
    """The paired video/audio schedules of one request (fresh schedulers: they count their own steps)."""

    video: MiniMaxH3Scheduler
    audio: MiniMaxH3Scheduler

    @classmethod
    def build(
        cls,
        num_steps: int = DEFAULT_NUM_STEPS,
        video_shift: float = DEFAULT_VIDEO_FLOW_SHIFT,
        audio_shift: float = DEFAULT_AUDIO_FLOW_SHIFT,
    ) -> FlowSchedule:
        video, audio = make_scheduler(num_steps, video_shift), make_scheduler(num_steps, audio_shift)
        if len(video.sigmas) != len(audio.sigmas):
            raise ValueError(
                f"video and audio schedules differ in length ({len(video.sigmas)} vs {len(audio.sigmas)}); "
                "choose less extreme flow shifts"
            )
        return cls(video, audio)

    @property
    def num_dit_calls(self) -> int:
        return len(self.video.timesteps)

    @property
    def video_sigmas(self) -> tuple[float, ...]:
        return tuple(self.video.sigmas.tolist())

    @property
    def audio_sigmas(self) -> tuple[float, ...]:
        return tuple(self.audio.sigmas.tolist())

    def model_times(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(t_video, t_audio), float32 scalars in [0, 1], for DiT call ``step``: t = 1 - sigma."""
        return self.video.timesteps[step], self.audio.timesteps[step]

    def step(
        self, step: int, video: torch.Tensor, audio: torch.Tensor, v_video: torch.Tensor, v_audio: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance both modalities by one Euler step with their own schedule. Steps run in order, once each."""
        for scheduler in (self.video, self.audio):
            if (scheduler.step_index or 0) != step:
                raise RuntimeError(f"step {step} out of order: the schedule is at step {scheduler.step_index or 0}")
        t_video, t_audio = self.model_times(step)
        video = self.video.step(v_video.float(), t_video, video, return_dict=False)[0]
        audio = self.audio.step(v_audio.float(), t_audio, audio, return_dict=False)[0]
        return video, audio
