"""Wan 2.2's whole text-to-video call under Ulysses against the dense one in the same process: both experts, the
denoise loop and the height-sharded decode of the Wan 2.1 VAE; TI2V-5B's DiT with per-token timesteps (the image
condition's) under Ulysses 2 and 4, and its whole text+image call under Ulysses 2. One DiT forward with one timestep
per sample under Ulysses 2 and 4 (padded rows, the V-first order, a wrong exchange as the negative control) is the
conformance suite's (tests/conformance/test_conformance_ranks.py).

Tolerance: fp32 on CPU. Ulysses moves exact copies of rows and heads, so only the summation order of GEMMs over fewer
rows and of attention over fewer heads can differ: the bound is 1e-5, LingBot's (tests/distributed/
test_lingbot_parity.py, measured 8.6e-7 there). Frames are uint8 after the decode: at most one rounding step apart.
Negative controls of the per-token forward, each 1000x above the bound: a wrong exchange (the gathered heads rolled
by one, as the conformance suite's), and the timesteps not split as the tokens (every rank reading the first rank's).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.runtime import Runtime
from tools.harness.ulysses_reference import misrouting_communicator

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


# -- TI2V-5B: per-token timesteps and the image condition ----------------------------------------------------------
GRID = (3, 2, 3)  # latent tokens: 3 frames of 2 x 3 = 18 rows, split 9 + 9 (U2) or 5 x 4 with 2 padding rows (U4)


def _per_token_inputs(model):
    """Latents, per-token timesteps (frame 0's tokens at 0, the others at each sample's t; the first frame's 6 rows
    straddle a rank boundary under U4) and the prompt's K/V."""
    g = torch.Generator().manual_seed(3)
    latents = torch.randn(2, model.config.in_dim, GRID[0], 2 * GRID[1], 2 * GRID[2], generator=g)
    mask = torch.ones(GRID)
    mask[0] = 0
    t = mask.flatten()[None] * torch.tensor([[937.0], [312.0]])
    text = torch.randn(2, 7, model.config.text_dim, generator=g)
    return latents, t, model.text_kv(text)


def _first_rank_timesteps(embed):
    """`Wan22DiT._embed_time` with every rank's rows reading the first rank's timesteps (not split as the tokens)."""
    return lambda self, t, rows, padded: embed(self, t, slice(0, rows.stop - rows.start), padded)


def _per_token_parity(ctx, degree):
    from telefuser.models.wan2_2.checkpoint import build_random_wan22_dit
    from telefuser.models.wan2_2.config import release
    from telefuser.models.wan2_2.dit import Wan22DiT
    from telefuser.models.wan2_2.spec import WAN22_TI2V_5B

    mesh = build_mesh(ParallelConfig(ulysses_degree=degree))
    dense = build_random_wan22_dit(release("ti2v-5b", "tiny").dit, seed=0)
    latents, t, text = _per_token_inputs(dense)
    expected = dense(latents, t, text)
    errors = {}
    for name, factory in (("ulysses", None), ("wrong exchange", misrouting_communicator), ("t unsplit", None)):
        model = WAN22_TI2V_5B.parallelize(copy.deepcopy(dense), mesh, communicator_factory=factory)
        embed = Wan22DiT._embed_time
        if name == "t unsplit":
            Wan22DiT._embed_time = _first_rank_timesteps(embed)
        try:
            errors[name] = _relative(model(latents, t, text), expected)
        finally:
            Wan22DiT._embed_time = embed
            model.close()
    return errors


def test_per_token_timesteps_under_ulysses_match_dense(ranks):
    for errors in ranks.run(_per_token_parity, ranks.world_size):
        shown = ", ".join(f"{name} {error:.2e}" for name, error in errors.items())
        print(f"TI2V-5B DiT, per-token timesteps, U{ranks.world_size}: {shown}")
        assert errors["ulysses"] <= MAX_RELATIVE_ERROR, errors
        assert errors["wrong exchange"] > 1000 * MAX_RELATIVE_ERROR, errors
        assert errors["t unsplit"] > 1000 * MAX_RELATIVE_ERROR, errors


def _text_image_parity(ctx):
    from PIL import Image

    from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8))
    dense = build_wan22_pipeline(variant="ti2v-5b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    runtime = Runtime(build_mesh(ParallelConfig(ulysses_degree=2)), torch.device("cpu"), torch.float32)
    parallel = build_wan22_pipeline(variant="ti2v-5b", config="tiny", runtime=runtime)
    a, b = dense("a red fox", image=image, seed=1), parallel("a red fox", image=image, seed=1)
    parallel.experts[0].close()
    frames = int(np.abs(a.frames.astype(int) - b.frames.astype(int)).max())
    return _relative(b.latents, a.latents), frames, torch.equal(a.latents[:, :, :1], b.latents[:, :, :1])


def test_the_text_image_to_video_call_under_ulysses_matches_dense(ranks2):
    for latents_error, frames_error, same_condition in ranks2.run(_text_image_parity):
        print(f"TI2V-5B text+image call, U2: latents max rel {latents_error:.2e}, frames {frames_error}")
        assert latents_error <= MAX_RELATIVE_ERROR, latents_error
        assert frames_error <= 1  # uint8 frames of one decode (Wan 2.2's VAE decodes whole on each rank)
        assert same_condition  # the image's latent frame: encoded alike on every rank, copied in, bit for bit
