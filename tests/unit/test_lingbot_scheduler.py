"""LingBot-World v2 schedule: the reference's timesteps, its two sigma lookups, x0 and re-noise on known numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from telefuser.pipelines.lingbot_world_v2.scheduler import (
    DenoisingSchedule,
    flow_to_x0,
    flow_unipc_tables,
    renoise,
)

SIGMA_MAX = float(np.float32(0.999))  # the shift-1 training schedule's first sigma, held in float32


def shifted(k: int, shift: float = 10.0) -> float:
    """The k-th of 1000 sigmas, by hand: linspace(sigma_max, 0, 1001)[k], shifted, rounded to float32."""
    s = SIGMA_MAX * (1 - k / 1000)
    return float(np.float32(shift * s / (1 + (shift - 1) * s)))


def test_tables_follow_the_reference_recipe():
    timesteps, sigmas = flow_unipc_tables(1000, 10.0)
    assert timesteps.dtype == torch.int64 and timesteps.shape == (1000,)
    assert sigmas.dtype == torch.float32 and sigmas.shape == (1001,) and float(sigmas[-1]) == 0.0
    assert timesteps[:9].tolist() == [999] * 9 and int(timesteps[9]) == 998  # truncation repeats 999 nine times
    assert timesteps[-1].item() == 9
    for k in (0, 1, 248, 249, 250, 500, 750, 999):
        assert float(sigmas[k]) == pytest.approx(shifted(k), rel=1e-7, abs=0)
        assert int(timesteps[k]) == int(shifted_float64(k) * 1000)


def shifted_float64(k: int) -> float:
    s = SIGMA_MAX * (1 - k / 1000)
    return 10.0 * s / (1 + 9.0 * s)


def test_four_steps_at_indices_0_250_500_750():
    schedule = DenoisingSchedule.build()
    assert schedule.timesteps == (999, 967, 908, 768)
    assert schedule.num_steps == 4
    # x0 uses the first index holding the timestep: 999 -> 0, 967 -> 248, 908 -> 500, 768 -> 750.
    assert schedule.x0_sigmas == pytest.approx([shifted(0), shifted(248), shifted(500), shifted(750)], rel=1e-7)
    assert schedule.x0_sigmas == pytest.approx([0.9998999238, 0.9679493904, 0.9089254737, 0.7689939141], abs=1e-9)
    # re-noising uses the second index when the timestep repeats: 967 -> 249, 908 -> 501, 768 -> 751.
    assert schedule.renoise_sigmas == pytest.approx([shifted(249), shifted(501), shifted(751)], rel=1e-7)
    assert schedule.renoise_sigmas == pytest.approx([0.9677833915, 0.9085941315, 0.7680441737], abs=1e-9)


def test_other_indices_and_bad_indices():
    one = DenoisingSchedule.build(indices=(0,))
    assert one.timesteps == (999,) and one.renoise_sigmas == ()
    with pytest.raises(ValueError, match="outside"):
        DenoisingSchedule.build(indices=(0, 1000))
    with pytest.raises(ValueError, match="at least one"):
        DenoisingSchedule.build(indices=())
    with pytest.raises(ValueError, match="shift"):
        flow_unipc_tables(1000, 0.0)


def test_x0_and_renoise_on_known_numbers():
    x_t = torch.tensor([1.0, -2.0, 0.5])
    flow = torch.tensor([0.5, 1.0, -1.5])
    x0 = flow_to_x0(flow, x_t, 0.8)  # x0 = x_t - sigma * flow
    assert x0.dtype == torch.float32
    assert x0.tolist() == pytest.approx([0.6, -2.8, 1.7], abs=1e-6)
    noise = torch.tensor([2.0, 0.0, -1.0])
    out = renoise(x0, noise, 0.25)  # (1 - sigma) x0 + sigma noise
    assert out.dtype == torch.float32
    assert out.tolist() == pytest.approx([0.95, -2.1, 1.025], abs=1e-6)


def test_a_full_chunk_on_known_numbers():
    """Flow = x_t - c (a model that always predicts x0 = c): every step lands on x0 = (1 - s) x_t + s c."""
    schedule = DenoisingSchedule.build()
    c = 0.3
    x = torch.tensor([1.0])
    noise = torch.tensor([-0.5])
    expected = 1.0
    for step in range(schedule.num_steps):
        x0 = flow_to_x0(x - c, x, schedule.x0_sigmas[step])
        expected_x0 = (1 - schedule.x0_sigmas[step]) * expected + schedule.x0_sigmas[step] * c
        assert x0.item() == pytest.approx(expected_x0, abs=1e-6)
        if step < schedule.num_steps - 1:
            x = renoise(x0, noise, schedule.renoise_sigmas[step])
            expected = (1 - schedule.renoise_sigmas[step]) * expected_x0 + schedule.renoise_sigmas[step] * -0.5
            assert x.item() == pytest.approx(expected, abs=1e-6)
