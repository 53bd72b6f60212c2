"""MiniMax H3 rectified-flow schedule and Euler step, checked on known numbers."""

from __future__ import annotations

import pytest
import torch

from telefuser.pipelines.minimax_h3.scheduler import (
    FlowSchedule,
    euler_eta0_step,
    time_shift_sigmas,
    velocity_to_x0,
)

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)


@pytest.mark.parametrize("steps", [2, 3, 10, 50])
@pytest.mark.parametrize("shift", [1.0, 3.0, 12.0])
def test_schedule_runs_from_one_to_zero_strictly_decreasing(steps, shift):
    sigmas = time_shift_sigmas(steps, shift)
    assert len(sigmas) == steps
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0
    assert all(a > b for a, b in zip(sigmas, sigmas[1:]))


def test_known_values_and_shift_effect():
    assert time_shift_sigmas(3, 3.0) == pytest.approx([1.0, 0.75, 0.0])  # 3 * 0.5 / (1 + 2 * 0.5)
    assert time_shift_sigmas(5, 1.0) == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])  # shift 1 = plain linspace
    video, audio = time_shift_sigmas(50, 12.0), time_shift_sigmas(50, 3.0)
    # A larger shift keeps more of the schedule at high noise: every interior point lies higher.
    assert all(v > a for v, a in zip(video[1:-1], audio[1:-1]))
    s = 1 - 1 / 49
    assert video[1] == pytest.approx(12 * s / (1 + 11 * s), rel=1e-6)


@pytest.mark.parametrize("steps, shift", [(1, 3.0), (0, 3.0), (2.5, 3.0), (10, 0.0), (10, -1.0)])
def test_bad_schedule_arguments(steps, shift):
    with pytest.raises(ValueError):
        time_shift_sigmas(steps, shift)


def test_euler_step_on_known_numbers():
    x, v = torch.tensor([2.0]), torch.tensor([1.0])
    x0 = velocity_to_x0(x, v, 0.5)
    assert x0.item() == 2.5  # x0 = x + sigma * v
    assert euler_eta0_step(x, x0, 0.5, 0.25).item() == pytest.approx(2.25)  # 0.5 * 2 + 0.5 * 2.5
    assert euler_eta0_step(x, x0, 0.5, 0.0).item() == 2.5  # the last step lands on x0
    assert euler_eta0_step(x, x0, 0.0, 0.0).item() == 2.0  # nothing left to remove


def test_step_keeps_reduced_precision_dtype_and_computes_in_fp32():
    x = torch.full((4,), 1.0, dtype=torch.bfloat16)
    out = euler_eta0_step(x, torch.zeros(4, dtype=torch.bfloat16), 0.3, 0.1)
    assert out.dtype == torch.bfloat16
    assert out.float().allclose(torch.full((4,), 1 / 3), atol=1e-2)


def test_paired_schedule_counts_calls_and_steps_modalities_separately():
    schedule = FlowSchedule.build(50, 12.0, 3.0)
    assert schedule.num_dit_calls == 49
    t_video, t_audio = schedule.model_times(1)
    assert t_video == pytest.approx(1 - schedule.video_sigmas[1])
    assert t_audio == pytest.approx(1 - schedule.audio_sigmas[1])
    assert schedule.model_times(0) == (0.0, 0.0)

    small = FlowSchedule.build(3, 3.0, 1.0)  # video sigmas 1, .75, 0; audio 1, .5, 0
    video, audio = torch.ones(1, 24, 2, 1, 1), torch.ones(1, 32, 4)
    v_video, v_audio = torch.ones_like(video), torch.ones_like(audio)
    video, audio = small.step(0, video, audio, v_video, v_audio)
    assert torch.allclose(video, torch.full_like(video, 0.75 + 0.25 * 2.0))  # x0 = 2, r = .75
    assert torch.allclose(audio, torch.full_like(audio, 0.5 + 0.5 * 2.0))  # x0 = 2, r = .5


@pytest.mark.parametrize("steps", [2, 3, 7])
def test_n_steps_make_n_minus_one_dit_calls(steps):
    from tests.unit.test_minimax_h3_pipeline import StubDiT, make_pipeline

    dit = StubDiT()
    make_pipeline(dit)("rain on a tin roof", duration=0.2, resolution=32, aspect_ratio="1:1", steps=steps)
    assert len(dit.calls) == steps - 1
    schedule = FlowSchedule.build(steps, 12.0, 3.0)
    pairs = zip(schedule.video_sigmas[:-1], schedule.audio_sigmas[:-1])
    expected = [(1000 * (1 - v), 1000 * (1 - a)) for v, a in pairs]
    assert [t for call in dit.calls for t in call] == pytest.approx([t for call in expected for t in call])
