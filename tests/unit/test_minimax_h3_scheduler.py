"""MiniMax H3 sampling: the paired diffusers `MiniMaxH3Scheduler`s against the published formulas and known numbers."""

from __future__ import annotations

import pytest
import torch

from telefuser.pipelines.minimax_h3.scheduler import FlowSchedule, make_scheduler

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

FP32_U = 2.0**-24


def published_sigmas(steps: int, shift: float) -> torch.Tensor:
    """The released schedule, written from the SGLang/TeleFuser formula: linspace(1, 0, N) in fp32, shifted."""
    base = torch.linspace(1.0, 0.0, steps, dtype=torch.float32)
    return torch.unique_consecutive(shift * base / (1 + (shift - 1) * base))


@pytest.mark.parametrize("steps", [2, 3, 10, 50])
@pytest.mark.parametrize("shift", [1.0, 3.0, 12.0])
def test_schedule_is_the_published_one(steps, shift):
    sigmas = make_scheduler(steps, shift).sigmas
    # the same fp32 operations in the same order as diffusers' set_timesteps: bit-identical
    assert torch.equal(sigmas, published_sigmas(steps, shift))
    assert len(sigmas) == steps and sigmas[0] == 1.0 and sigmas[-1] == 0.0
    assert bool((sigmas[1:] < sigmas[:-1]).all())


def test_known_values_and_shift_effect():
    assert make_scheduler(3, 3.0).sigmas.tolist() == pytest.approx([1.0, 0.75, 0.0])  # 3 * 0.5 / (1 + 2 * 0.5)
    assert make_scheduler(5, 1.0).sigmas.tolist() == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])  # plain linspace
    schedule = FlowSchedule.build(50, 12.0, 3.0)
    video, audio = schedule.video_sigmas, schedule.audio_sigmas
    assert all(v > a for v, a in zip(video[1:-1], audio[1:-1]))  # a larger shift stays longer at high noise
    s = 1 - 1 / 49
    assert video[1] == pytest.approx(12 * s / (1 + 11 * s), rel=4 * FP32_U)


@pytest.mark.parametrize("steps, shift", [(1, 3.0), (0, 3.0), (2.5, 3.0), (True, 3.0), (10, 0.0), (10, -1.0)])
def test_bad_schedule_arguments(steps, shift):
    with pytest.raises(ValueError):
        make_scheduler(steps, shift)


def test_schedules_of_different_lengths_are_refused():
    # a huge shift collapses neighbouring fp32 points near sigma = 1; diffusers' loop would zip them silently
    assert len(make_scheduler(50, 1e9).sigmas) < 50
    with pytest.raises(ValueError, match="differ in length"):
        FlowSchedule.build(50, 1e9, 3.0)


def test_paired_step_on_known_numbers():
    schedule = FlowSchedule.build(3, 3.0, 1.0)  # video sigmas 1, .75, 0; audio 1, .5, 0
    assert schedule.num_dit_calls == 2
    t_video, t_audio = schedule.model_times(1)
    assert (t_video.item(), t_audio.item()) == (0.25, 0.5)  # t = 1 - sigma
    assert schedule.model_times(0)[0].item() == 0.0
    video, audio = torch.full((1, 24, 2, 1, 1), 2.0), torch.full((1, 32, 4), 2.0)
    video, audio = schedule.step(0, video, audio, torch.ones_like(video), torch.ones_like(audio))
    # x0 = x + (1 - t) v = 3; x_next = r x + (1 - r) x0 with r = .75 (video), .5 (audio): exact in binary
    assert torch.equal(video, torch.full_like(video, 0.75 * 2 + 0.25 * 3))
    assert torch.equal(audio, torch.full_like(audio, 0.5 * 2 + 0.5 * 3))
    video, audio = schedule.step(1, video, audio, torch.ones_like(video), torch.ones_like(audio))
    assert torch.equal(video, torch.full_like(video, 2.25 + 0.75))  # the last step lands on x0 (r = 0)
    with pytest.raises(RuntimeError, match="out of order"):
        FlowSchedule.build(3, 3.0, 1.0).step(1, video, audio, video, audio)


def test_step_keeps_reduced_precision_dtype_and_computes_in_fp32():
    schedule = FlowSchedule.build(3, 3.0, 3.0)
    x = torch.full((4,), 1.0, dtype=torch.bfloat16)
    video, _ = schedule.step(0, x, x.clone(), -torch.ones_like(x), -torch.ones_like(x))
    assert video.dtype == torch.bfloat16
    # x0 = 1 - 1 = 0, r = .75: 0.75, representable in bf16
    assert torch.equal(video, torch.full_like(x, 0.75))


@pytest.mark.parametrize("steps", [2, 3, 7])
def test_n_steps_make_n_minus_one_dit_calls(steps):
    from tests.unit.test_minimax_h3_pipeline import StubDiT, make_pipeline

    dit = StubDiT()
    make_pipeline(dit, decode=False)("rain on a tin roof", duration=0.9, resolution=32, aspect_ratio="1:1", steps=steps)
    assert len(dit.calls) == steps - 1
    schedule = FlowSchedule.build(steps, 12.0, 3.0)
    expected = [(1000 * (1 - v), 1000 * (1 - a)) for v, a in zip(schedule.video_sigmas[:-1], schedule.audio_sigmas)]
    got = [t for call in dit.calls for t in call]
    # the DiT sees fp32(fp32(1 - sigma) * 1000): within a few fp32 roundings of 1000 (1 - sigma) near 1000
    assert got == pytest.approx([t for call in expected for t in call], abs=1000 * 4 * FP32_U)
