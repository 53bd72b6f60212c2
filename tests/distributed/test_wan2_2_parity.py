"""Wan 2.2's DiT and its whole denoise loop under Ulysses against the dense model in the same process, with the
rank-split sequence padded (18 rows over 4 ranks); the height-sharded decode of the Wan 2.1 VAE included.

Tolerance: fp32 on CPU. Ulysses moves exact copies of rows and heads, so only the summation order of GEMMs over fewer
rows and of attention over fewer heads can differ: the bound is 1e-5, LingBot's (tests/distributed/
test_lingbot_parity.py, measured 8.6e-7 there). The negative control (each rank's rows embedded at the dense row
positions of rank 0, i.e. RoPE for the wrong rows) lands at O(1e-1).
"""

from __future__ import annotations

import copy

import pytest
import torch

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.models.wan2_2.spec import WAN22_T2V_A14B
from telefuser.runtime import Runtime
from tests.ulysses_reference import recording_communicator

pytestmark = pytest.mark.numerics

MAX_RELATIVE_ERROR = 1e-5
V_FIRST = [("scatter", "v", False), ("scatter", "q", False), ("scatter", "k", True), ("gather", None, True)]


def _relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _dit_parity(ctx, ulysses):
    from telefuser.models.wan2_2.checkpoint import build_random_wan22_dit
    from telefuser.models.wan2_2.config import Wan22Config

    mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses))
    g = torch.Generator().manual_seed(3)
    latents = torch.randn(2, 16, 2, 6, 6, generator=g)  # 2 frames of 3 x 3 tokens: 18 rows
    t, text = torch.tensor([900.0, 400.0]), torch.randn(2, 7, 32, generator=g)
    dense_model = build_random_wan22_dit(Wan22Config.tiny(), seed=0)
    dense = dense_model(latents, t, dense_model.text_kv(text))
    model = WAN22_T2V_A14B.parallelize(copy.deepcopy(dense_model), mesh, communicator_factory=recording_communicator)
    parallel = model(latents, t, model.text_kv(text))
    calls = list(model.communicator.calls)
    cos, sin = model._rope((2, 3, 3), "cpu")
    model._rope_cache = (((2, 3, 3), "cpu"), (cos.roll(1, 0), sin.roll(1, 0)))  # RoPE of the wrong rows
    wrong = model(latents, t, model.text_kv(text))
    model.close()
    return _relative(parallel, dense), _relative(wrong, dense), calls


def test_one_forward_under_ulysses_matches_dense(ranks):
    for error, wrong, calls in ranks.run(_dit_parity, ranks.world_size):
        assert error <= MAX_RELATIVE_ERROR, error
        assert wrong > 1000 * MAX_RELATIVE_ERROR, wrong
        assert calls == V_FIRST * 2  # one V -> Q -> K group and one gather per block; the prompt K/V need none


def _pipeline_parity(ctx, ulysses):
    from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline

    dense = build_wan22_pipeline(variant="t2v-a14b", config="tiny", dtype=torch.float32)
    runtime = Runtime(build_mesh(ParallelConfig(ulysses_degree=ulysses)), torch.device("cpu"), torch.float32)
    parallel = build_wan22_pipeline(variant="t2v-a14b", config="tiny", runtime=runtime)
    a, b = dense("a red fox", seed=1), parallel("a red fox", seed=1)
    frames = (a.frames.astype(int) - b.frames.astype(int)).__abs__().max()
    for expert in parallel.experts:
        expert.close()
    return _relative(b.latents, a.latents), int(frames), parallel.vae_group is not None


def test_the_text_to_video_call_under_ulysses_matches_dense(ranks2):
    for latents_error, frames_error, sharded in ranks2.run(_pipeline_parity, 2):
        assert latents_error <= MAX_RELATIVE_ERROR, latents_error
        assert sharded and frames_error <= 1  # uint8 frames: one rounding step from a decode of another band order
