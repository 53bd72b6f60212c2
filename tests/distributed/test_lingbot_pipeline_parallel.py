"""LingBot-World v2 on 2 gloo ranks: the height-sharded VAE decode equals the full decode, and a whole session
on 2 ranks (toy DiT, sharded decode) gives every rank the single-rank session's frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from telefuser.pipelines.wan.vae_parallel import split_rows

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)


def _vae():
    from telefuser.pipelines.wan.vae import WanVideoVAE

    return WanVideoVAE.random("tiny", seed=3)


def _sharded_stream_vs_full(ctx, latent_height: int):
    from telefuser.pipelines.wan.vae_parallel import HeightShardedDecoder

    vae = _vae()
    z = torch.randn(1, 16, 6, latent_height, 4, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = vae.model.decode(vae.denormalize(z)).sample
    sharding = HeightShardedDecoder(vae.model.decoder, latent_height, ctx.group)
    stream = vae.stream_decoder(sharding)
    bands = [stream.decode(z[:, :, :4]), stream.decode(z[:, :, 4:])]  # two chunks through the causal cache
    rows = [r * 8 for r in sharding.latent_rows]
    assert [b.shape[-2] for b in bands] == [rows[ctx.rank]] * 2
    got = torch.cat([sharding.exchange.gather_rows(b, rows) for b in bands], dim=2)
    return float((got - full).abs().max()), float(full.abs().mean()), tuple(got.shape)


@pytest.mark.parametrize("latent_height", [4, 5])  # even split 2+2 and uneven 3+2
def test_height_sharded_decode_equals_full_decode(ranks2, latent_height):
    results = ranks2.run(_sharded_stream_vs_full, latent_height)
    for err, scale, shape in results:
        assert shape == (1, 3, 1 + 4 * 5, 8 * latent_height, 32)
        assert scale > 0.01 and err < 1e-4, (err, scale)


def test_split_rows():
    assert split_rows(5, 2) == [3, 2] and split_rows(60, 4) == [15] * 4 and split_rows(7, 3) == [3, 2, 2]
    with pytest.raises(ValueError, match="at least one row"):
        split_rows(1, 2)


def _session_frames(ctx, parallel: bool):
    from telefuser.pipelines.lingbot_world_v2 import WorldSessionPipeline
    from telefuser.pipelines.wan.text_encoder import (
        ByteFallbackTokenizer,
        UMT5PromptEncoder,
        build_umt5_encoder,
        tiny_umt5_config,
    )
    from tests.toy_dit import ToyCausalDiT, ToyDiTConfig

    encoder = UMT5PromptEncoder(ByteFallbackTokenizer(), build_umt5_encoder(tiny_umt5_config(32)), text_len=16)
    dit = ToyCausalDiT(ToyDiTConfig(text_dim=32, text_len=16))
    pipe = WorldSessionPipeline(dit, encoder, _vae(), vae_group=ctx.group if parallel else None)
    rgb = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    with pipe.start(rgb, "a road", seed=42, resolution=(32, 32), num_frames=29) as session:
        chunks = [session.next_chunk(["W"]) for _ in range(session.total_chunks)]
    return np.concatenate([c.frames for c in chunks]), [c.measurement["frames"] for c in chunks]


def test_two_rank_session_matches_single_rank(ranks2):
    sharded = ranks2.run(_session_frames, True)
    single = ranks2.run(_session_frames, False)[0]
    for frames, per_chunk in sharded:
        assert per_chunk == [13, 16] and frames.shape == (29, 32, 32, 3) and frames.dtype == np.uint8
        assert np.array_equal(frames, sharded[0][0])  # every rank holds the same full frames
        # same video up to float reassociation: a pixel may round to the neighbouring uint8 value
        assert np.abs(frames.astype(np.int16) - single[0]).max() <= 1


def _lingbot_session_frames(ctx, parallel: bool):
    from telefuser.distributed.mesh import ParallelConfig, build_mesh
    from telefuser.pipelines.lingbot_world_v2 import build_lingbot_pipeline
    from telefuser.runtime import Runtime

    mesh = build_mesh(ParallelConfig(ulysses_degree=2)) if parallel else None
    pipe = build_lingbot_pipeline(config="tiny", runtime=Runtime(mesh, torch.device("cpu"), torch.float32), seed=0)
    rgb = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    try:
        with pipe.start(rgb, "a road", seed=42, resolution=(32, 32), num_frames=29) as session:
            return np.concatenate([session.next_chunk(["W", "J"]).frames for _ in range(session.total_chunks)])
    finally:
        pipe.close()


def test_lingbot_dit_session_on_two_ranks_matches_one(ranks2):
    """The real tiny DiT (Ulysses 2) with the sharded decode, against the same session on one rank."""
    pytest.importorskip("telefuser.models.lingbot_world_v2")
    sharded = ranks2.run(_lingbot_session_frames, True)
    single = ranks2.run(_lingbot_session_frames, False)[0]
    for frames in sharded:
        assert frames.shape == (29, 32, 32, 3)
        assert np.abs(frames.astype(np.int16) - single).max() <= 2
