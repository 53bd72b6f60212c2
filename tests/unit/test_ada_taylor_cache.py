"""AdaTaylorCache: the precomputed skip schedule, Taylor vs residual reuse, and the block-hook contract."""

from __future__ import annotations

import json

import pytest
import torch

from telefuser.feature_cache import (
    AdaTaylorCache,
    AdaTaylorCacheCalibrator,
    AdaTaylorParams,
    TaylorResidual,
    compute_step_mask,
    create_feature_cache,
    params_path,
    resample_ratios,
    select_rows,
)


def test_flat_ratios_skip_at_most_k_in_a_row_after_the_retained_head():
    mask = compute_step_mask([1.0] * 20, 20, K=2, retention_ratio=0.2, thresh=0.03)
    # int(20 * 0.2) = 4: steps 0..4 computed; then (skip, skip, compute) while the error stays 0; last computed.
    assert [i for i, c in enumerate(mask) if c] == [0, 1, 2, 3, 4, 7, 10, 13, 16, 19]
    run = longest = 0
    for computed in mask:
        run = 0 if computed else run + 1
        longest = max(longest, run)
    assert longest == 2


def test_accumulated_error_forces_a_compute():
    ratios = [1.0] * 10
    ratios[5], ratios[6] = 1.02, 1.02
    mask = compute_step_mask(ratios, 10, K=5, retention_ratio=0.2, thresh=0.03)
    # step 5: err |1 - 1.02| = .02 < .03 -> skip; step 6: product 1.0404, err .02 + .0404 -> compute.
    assert mask[:8] == [True, True, True, False, False, False, True, False]
    assert mask[-1] is True


def test_init_step_and_last_step_are_always_computed():
    mask = compute_step_mask([1.0] * 12, 12, K=10, retention_ratio=0.0, thresh=1.0, init_step=6)
    assert mask[0] and mask[6] and mask[11]
    assert not any(mask[1:6]) and not any(mask[7:11])


def test_ratios_are_resampled_to_the_step_count():
    # index = round(i * 2 / 4) with round-half-to-even, like the reference's np.round: 0, 0, 1, 2, 2
    assert resample_ratios([1.0, 2.0, 3.0], 5) == [1.0, 1.0, 2.0, 3.0, 3.0]
    assert resample_ratios([1.0, 2.0, 3.0], 3) == [1.0, 2.0, 3.0]
    assert resample_ratios([1.0, 2.0, 3.0], 1) == [3.0]


def test_first_order_taylor_extrapolates_a_linear_residual_exactly():
    state = TaylorResidual(n_derivatives=1, taylor_threshold=2)
    state.update(torch.tensor([1.0, 10.0]), step=0)
    state.update(torch.tensor([2.0, 12.0]), step=1)  # dR/ds = [1, 2]
    assert state.approximate(2).tolist() == [3.0, 14.0]  # elapsed 1
    assert state.approximate(3).tolist() == [4.0, 16.0]  # elapsed 2 <= threshold: still Taylor
    assert state.approximate(4).tolist() == [2.0, 12.0]  # elapsed 3 > threshold: reuse the last residual


def test_window_divides_the_difference_and_threshold_one_reuses_earlier():
    state = TaylorResidual(n_derivatives=1, taylor_threshold=1)
    state.update(torch.tensor([0.0]), step=0)
    state.update(torch.tensor([6.0]), step=3)  # slope 6 / 3 = 2 per step
    assert state.approximate(4).item() == 8.0
    assert state.approximate(5).item() == 6.0  # elapsed 2 > 1: residual reuse
    zeroth = TaylorResidual(n_derivatives=0)
    zeroth.update(torch.tensor([5.0]), 0)
    zeroth.update(torch.tensor([7.0]), 1)
    assert zeroth.approximate(2).item() == 7.0  # order 0 is plain residual caching


def _hook_run(cache: AdaTaylorCache, steps: int):
    calls = []

    def run_blocks(h):
        calls.append(step)
        return h + (step + 1.0)  # residual R_s = s + 1: linear in the step, so first-order Taylor is exact

    outputs = []
    for step in range(steps):
        cache.set_step(step)
        outputs.append(cache(torch.zeros(3), run_blocks, None))
    return calls, outputs


def test_skipped_steps_do_not_run_the_blocks_and_are_extrapolated():
    params = AdaTaylorParams(mag_ratios=(1.0,) * 10, K=2, retention_ratio=0.2, thresh=0.03)
    cache = AdaTaylorCache(params, 10)
    calls, outputs = _hook_run(cache, 10)
    assert calls == cache.compute_steps == [0, 1, 2, 5, 8, 9]
    assert [o[0].item() for o in outputs] == [float(s + 1) for s in range(10)]
    assert cache.stats()["computed"] == 6 and cache.stats()["skipped"] == 4


def test_hook_insists_on_set_step_before_each_call():
    cache = AdaTaylorCache(AdaTaylorParams(mag_ratios=(1.0,) * 4), 4)
    with pytest.raises(RuntimeError, match="set_step"):
        cache(torch.zeros(1), lambda h: h, None)
    cache.set_step(0)
    cache(torch.zeros(1), lambda h: h, None)
    with pytest.raises(RuntimeError, match="set_step"):
        cache(torch.zeros(1), lambda h: h, None)
    with pytest.raises(ValueError):
        cache.set_step(4)


def test_calibrator_uses_only_audio_rows_and_writes_params(tmp_path):
    tags = torch.tensor([0, 0, 1, 2, 2])
    scale = {"video": [1.0, 100.0, 1.0], "audio": [1.0, 2.0, 3.0]}

    calibrator = AdaTaylorCacheCalibrator(3)
    for step in range(3):
        calibrator.set_step(step)

        def run_blocks(h, step=step):
            r = torch.ones_like(h)
            r[tags == 0] *= scale["video"][step]
            r[tags == 2] *= scale["audio"][step]
            return h + r

        calibrator(torch.zeros(5, 4), run_blocks, tags)
    assert calibrator.ratios == [1.0, 2.0, 1.5]  # video's x100 jump is ignored
    path = tmp_path / "params.json"
    params = calibrator.save(path, sigma_shift=12.0)
    assert AdaTaylorParams.load(path).mag_ratios == params.mag_ratios == (1.0, 2.0, 1.5)
    raw = json.loads(path.read_text())
    assert raw["cond_mag_ratios"] == raw["uncond_mag_ratios"] == [1.0, 2.0, 1.5] and raw["num_inference_steps"] == 3


def test_select_rows_handles_batched_hidden():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    rows = select_rows(hidden, torch.tensor([2, 0, 2]), 2)
    assert rows.shape == (4, 2)
    with pytest.raises(ValueError):
        select_rows(hidden, torch.tensor([2, 0]), 2)


def test_bundled_h3_params_follow_the_published_profile():
    params = AdaTaylorParams.load(params_path("minimax_h3"))
    assert (params.K, params.retention_ratio, params.thresh) == (2, 0.2, 0.03)
    assert len(params.mag_ratios) == params.num_inference_steps == 49
    assert "PLACEHOLDER" in params.notes["_provenance"]
    cache = create_feature_cache("ada_taylor", 49)
    assert cache.compute_steps[:10] == list(range(10)) and cache.compute_steps[-1] == 48
    assert create_feature_cache("none", 49) is None
    with pytest.raises(ValueError):
        create_feature_cache("teacache", 49)
