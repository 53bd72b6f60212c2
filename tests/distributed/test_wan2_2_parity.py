"""Wan 2.2's whole text-to-video call under Ulysses against the dense one in the same process: both experts, the
denoise loop and the height-sharded decode of the Wan 2.1 VAE. One DiT forward under Ulysses 2 and 4 (padded rows,
the V-first order, a wrong exchange as the negative control) is the conformance suite's
(tests/conformance/test_conformance_ranks.py).

Tolerance: fp32 on CPU. Ulysses moves exact copies of rows and heads, so only the summation order of GEMMs over fewer
rows and of attention over fewer heads can differ: the bound is 1e-5, LingBot's (tests/distributed/
test_lingbot_parity.py, measured 8.6e-7 there). Frames are uint8 after the decode: at most one rounding step apart.
"""

from __future__ import annotations

import pytest
import torch

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.runtime import Runtime

pytestmark = pytest.mark.numerics

MAX_RELATIVE_ERROR = 1e-5


def _relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def _pipeline_parity(ctx, ulysses):
    from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline

    dense = build_wan22_pipeline(variant="t2v-a14b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    runtime = Runtime(build_mesh(ParallelConfig(ulysses_degree=ulysses)), torch.device("cpu"), torch.float32)
    parallel = build_wan22_pipeline(variant="t2v-a14b", config="tiny", runtime=runtime)
    a, b = dense("a red fox", seed=1), parallel("a red fox", seed=1)
    frames = (a.frames.astype(int) - b.frames.astype(int)).__abs__().max()
    high, low = parallel.experts
    shared = high.communicator is not None and low.communicator is high.communicator
    for expert in parallel.experts:
        expert.close()
    return _relative(b.latents, a.latents), int(frames), parallel.vae_group is not None, shared


def test_the_text_to_video_call_under_ulysses_matches_dense(ranks2):
    for latents_error, frames_error, sharded, shared in ranks2.run(_pipeline_parity, 2):
        assert latents_error <= MAX_RELATIVE_ERROR, latents_error
        assert sharded and frames_error <= 1  # uint8 frames: one rounding step from a decode of another band order
        assert shared  # both experts exchange through one communicator (one set of copy-engine peer buffers)
