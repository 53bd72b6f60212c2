"""LingBot-World v2 causal DiT under Ulysses against the dense model in the same process, over enough chunks that the
KV window rolls, with the rank-split sequence padded (10 rows per frame over 4 ranks).

Every rank builds the same seeded tiny model and inputs, runs a dense session, then a Ulysses session on a copy with
a recording communicator, and compares every output (read-only steps and commits).

Tolerance: fp32 on CPU. Ulysses moves exact copies of rows and heads, so only the summation order of GEMMs over
fewer rows and of attention over fewer heads can differ. Measured max |parallel - dense| / max |dense| over all
outputs: 8.6e-7 for U2 and U4 alike (MEASURED); the bound, 1e-5, is about 10x that. A wrong head, row, window row
or RoPE position shows up as O(1e-2) or more.
"""

from __future__ import annotations

import copy

import pytest
import torch

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit
from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from tools.harness.ulysses_reference import recording_communicator

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

MEASURED = {"U2": 8.6e-7, "U4": 8.6e-7}  # worst over the 8 outputs, every rank
MAX_RELATIVE_ERROR = 1e-5
GRID_HW = (4, 10)  # 2 x 5 = 10 tokens per latent frame: chunks of 10 or 20 rows, padded to 12/20 over 4 ranks
TPF = 10
CHUNK_FRAMES = (2, 1, 2, 1)  # 6 frames through a 4-frame window (1 sink): chunks 2 and 3 evict
V_FIRST = [("scatter", "v", False), ("scatter", "q", False), ("scatter", "k", True), ("gather", None, True)]


def _steps(config):
    g = torch.Generator().manual_seed(11)
    steps = []
    for frames in CHUNK_FRAMES:
        noisy = torch.randn(2, config.in_dim, frames, *GRID_HW, generator=g)
        clean = torch.randn(2, config.in_dim, frames, *GRID_HW, generator=g)
        camera = torch.randn(2, frames * TPF, config.camera_feature_dim, generator=g)
        steps.append((noisy, torch.tensor([750.0, 500.0]), camera, False))
        steps.append((clean, torch.zeros(2), camera, True))
    return steps


def _generate(model, config, text):
    session = model.new_window(2, text, tokens_per_frame=TPF)
    outputs = [model.forward_chunk(session, x, t, cam, update_cache=commit) for x, t, cam, commit in _steps(config)]
    evicted = session.committed == session.capacity and session.frame_offset > config.local_attn_size
    local_heads = session.layers[0].k.shape[2]
    session.close()
    return outputs, evicted, local_heads


def _parity(ctx, ulysses):
    mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses))
    config = LingBotWorldV2Config.tiny()
    dense_model = build_random_lingbot_dit(config, seed=0)
    text = torch.randn(2, 5, config.text_dim, generator=torch.Generator().manual_seed(2))
    dense, rolled, _ = _generate(dense_model, config, text)
    model = LINGBOT_WORLD_V2.parallelize(copy.deepcopy(dense_model), mesh, communicator_factory=recording_communicator)
    parallel, _, local_heads = _generate(model, config, text)
    calls = list(model.communicator.calls)
    model.close()
    assert model.communicator is None
    errors = [((p - d).abs().max() / d.abs().max()).item() for d, p in zip(dense, parallel)]
    shapes_match = all(p.shape == d.shape and p.dtype == torch.float32 for d, p in zip(dense, parallel))
    return max(errors), calls, local_heads, rolled, shapes_match


def test_ulysses_matches_dense_over_a_rolling_window(ranks):
    config = LingBotWorldV2Config.tiny()
    results = ranks.run(_parity, ranks.world_size)
    forwards = 2 * len(CHUNK_FRAMES)
    for error, calls, local_heads, rolled, shapes_match in results:
        assert shapes_match and rolled
        assert error <= MAX_RELATIVE_ERROR, error
        # One V -> Q -> K group and one gather per block per forward; the session's text K/V need no exchange.
        assert calls == V_FIRST * config.num_layers * forwards, calls[:8]
        assert local_heads == config.num_heads // ranks.world_size


@pytest.mark.parametrize("degree", [2, 4, 8])
def test_the_v2_head_count_splits_for_the_ulysses_profiles(degree):
    ParallelConfig(ulysses_degree=degree).check_heads(LingBotWorldV2Config().num_heads)


# -- a session that keeps its keys in FP8 (cudnn_fp8), the kernel emulated on the CPU --------------------------------
# Each rank casts its heads' keys with the same per-layer scale, so Ulysses moves the same e4m3 keys as the dense
# model holds, except where a key that differs by summation order (8.6e-7, above) sits at an e4m3 rounding midpoint
# and rounds the other way: one step (2^-4 .. 2^-3 relatively) on that element. Measured: 4.3e-7 (U2) and 8.5e-7
# (U4), no key rounding the other way; flipping one random key element by one step in every attention call of a
# session measured 2.6e-4 .. 6.3e-4. The bound covers that worst case on any host; the negative control (the parallel
# run reads its keys at twice their descale) must land 10x above it.
MAX_RELATIVE_ERROR_FP8 = 1e-3


def _emulated_fp8_attention(descale_factor: float = 1.0):
    from telefuser.ops.attention import attention

    def fp8_attention_known_scales(q, k8, descale_k, v, amax_v, *, kv_rows):
        k8, v = k8[:, : int(kv_rows)], v[:, : int(kv_rows)]  # whole window buffers: their first kv_rows rows
        assert float(v.abs().max()) <= float(amax_v)
        return attention(q, (k8.float() * descale_k * descale_factor).to(q.dtype), v)

    return fp8_attention_known_scales


def _fp8_key_parity(ctx, ulysses, descale_factor=1.0):
    from telefuser.models.lingbot_world_v2 import window_formats
    from telefuser.models.lingbot_world_v2.window_formats import FP8_KEY_WINDOW
    from telefuser.models.wan import attention as wan_attention_module
    from telefuser.ops.attention import attention

    saved = window_formats.attention, window_formats.fp8_attention_known_scales, wan_attention_module.attention
    # cross-attention runs plain SDPA (it is per-call FP8 in the model, not the window under test)
    window_formats.attention = lambda q, k, v, impl, kv_rows=None: attention(q, k, v, kv_rows=kv_rows)
    wan_attention_module.attention = window_formats.attention
    window_formats.fp8_attention_known_scales = _emulated_fp8_attention()
    try:  # the pool's processes outlive the test: the module is restored whatever happens
        mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses))
        config = LingBotWorldV2Config.tiny()
        dense_model = build_random_lingbot_dit(config, seed=0)
        dense_model.attn_impl = "cudnn_fp8"  # set directly: there is no GPU to check it against
        text = torch.randn(2, 5, config.text_dim, generator=torch.Generator().manual_seed(2))
        dense, _, _ = _generate(dense_model, config, text)
        model = LINGBOT_WORLD_V2.parallelize(
            copy.deepcopy(dense_model), mesh, communicator_factory=recording_communicator
        )
        session = model.new_window(2, text, tokens_per_frame=TPF)
        fp8_keys = session.format is FP8_KEY_WINDOW and session.layers[0].k.dtype == torch.float8_e4m3fn
        session.close()
        window_formats.fp8_attention_known_scales = _emulated_fp8_attention(descale_factor)
        parallel, _, _ = _generate(model, config, text)
        model.close()
    finally:
        window_formats.attention, window_formats.fp8_attention_known_scales, wan_attention_module.attention = saved
    errors = [((p - d).abs().max() / d.abs().max()).item() for d, p in zip(dense, parallel)]
    return max(errors), fp8_keys


def test_ulysses_matches_dense_with_fp8_keys(ranks):
    for error, fp8_keys in ranks.run(_fp8_key_parity, ranks.world_size):
        assert fp8_keys
        assert error <= MAX_RELATIVE_ERROR_FP8, error
    for error, _ in ranks.run(_fp8_key_parity, ranks.world_size, descale_factor=2.0):  # negative control
        assert error > 10 * MAX_RELATIVE_ERROR_FP8, error
