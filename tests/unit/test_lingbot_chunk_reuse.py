"""Work a LingBot chunk does once instead of five times, or not at all, with the same results.

* The camera's share of every block (four d x d linears per block) depends on neither t nor the latents: the chunk's
  `camera_modulation` is computed once and passed to all five forwards.
* The clean-KV update (`commit_chunk`) skips the last block after its K/V and the head, whose output nobody reads.

Both are the same computations as before on the same inputs, so outputs and committed K/V are compared exactly.
"""

from __future__ import annotations

import pytest
import torch

from telefuser.models.lingbot_world_v2 import CameraModulation, LingBotWorldV2Config, build_random_lingbot_dit

TPF, GRID_HW = 6, (4, 6)


@pytest.fixture(scope="module")
def model():
    return build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=0)


def _inputs(config, frames, seed):
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, config.in_dim, frames, *GRID_HW, generator=g)
    camera = torch.randn(1, frames * TPF, config.camera_feature_dim, generator=g)
    return latents, camera


def _session(model):
    text = torch.randn(1, 5, model.config.text_dim, generator=torch.Generator().manual_seed(1))
    return model.new_window(1, text, tokens_per_frame=TPF)


def _window(session):
    return [t[:, : session.committed].clone() for kv in session.layers for t in (kv.k, kv.v)]


def test_a_precomputed_camera_modulation_gives_the_same_prediction(model):
    latents, camera = _inputs(model.config, 2, seed=3)
    modulation = model.camera_modulation(camera)
    assert isinstance(modulation, CameraModulation) and modulation.tokens == 2 * TPF
    assert len(modulation.per_block) == len(model.blocks)
    session = _session(model)
    for t in (900.0, 300.0):
        expected = model.forward_chunk(session, latents, torch.tensor([t]), camera, update_cache=False)
        got = model.forward_chunk(session, latents, torch.tensor([t]), modulation, update_cache=False)
        assert torch.equal(got, expected)
    other = model.camera_modulation(_inputs(model.config, 2, seed=4)[1])  # another camera moves the prediction
    moved = model.forward_chunk(session, latents, torch.tensor([300.0]), other, update_cache=False)
    assert (moved - expected).abs().max() > 1e-3 * expected.abs().max()


def test_a_modulation_for_another_chunk_shape_is_refused(model):
    session = _session(model)
    modulation = model.camera_modulation(_inputs(model.config, 1, seed=3)[1])
    latents, _ = _inputs(model.config, 2, seed=3)
    with pytest.raises(ValueError, match="computed for 6 tokens and 2 blocks; this chunk has 12 tokens"):
        model.forward_chunk(session, latents, torch.tensor([10.0]), modulation, update_cache=False)


def test_commit_chunk_commits_the_same_window_as_a_full_committing_forward(model):
    full, lean = _session(model), _session(model)
    for index, frames in enumerate([2, 1, 2, 2]):  # rolls past the tiny 4-frame window
        latents, camera = _inputs(model.config, frames, seed=20 + index)
        modulation = model.camera_modulation(camera)
        model.forward_chunk(full, latents, torch.zeros(1), camera, update_cache=True)
        assert model.commit_chunk(lean, latents, torch.zeros(1), modulation) is None
        assert (lean.committed, lean.frame_offset) == (full.committed, full.frame_offset)
        assert all(torch.equal(a, b) for a, b in zip(_window(lean), _window(full)))
    # and the next chunk reads the same window
    latents, camera = _inputs(model.config, 1, seed=40)
    expected = model.forward_chunk(full, latents, torch.tensor([500.0]), camera, update_cache=False)
    assert torch.equal(model.forward_chunk(lean, latents, torch.tensor([500.0]), camera, update_cache=False), expected)
