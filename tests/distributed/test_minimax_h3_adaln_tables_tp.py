"""MiniMax H3 AdaLN tables under TP2 (gloo, CPU): the projections are sliced by output and all-gathered
(tp.MINIMAX_H3_TP_PLAN), so `precompute_adaln` runs the same sliced modules with the same gather and every rank's
tables, and velocities, equal the per-call ones bit for bit; also with the rank's slices offloaded."""

from __future__ import annotations

import torch

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit
from telefuser.models.minimax_h3.spec import MINIMAX_H3

CALLS = [(0.0, 0.0), (250.0, 610.5), (875.25, 990.0)]


def _tp2_exactness(ctx):
    mesh = build_mesh(ParallelConfig(ulysses_degree=1, tp_degree=2))
    config = MiniMaxH3Config.tiny()
    model = MINIMAX_H3.parallelize(build_random_minimax_h3_dit(config, seed=0), mesh)
    g = torch.Generator().manual_seed(1)
    video = torch.randn(1, config.latents_dim, 2, 4, 6, generator=g)
    audio = torch.randn(1, config.audio_latents_dim, 6, generator=g)
    text = torch.randn(1, 5, config.text_dim, generator=g)
    times = [torch.tensor([tv]) for tv, _ in CALLS], [torch.tensor([ta]) for _, ta in CALLS]
    sliced = model.blocks[0].adaln_proj.linear.out_features
    with torch.no_grad():
        reference = [model(video, audio, text, tv, ta) for tv, ta in zip(*times)]
        tables = model.precompute_adaln(*times)
        cached = [model(video, audio, text, tv, ta, adaln=tables) for tv, ta in zip(*times)]
        model.offload_adaln()  # the rank's slices (already on the CPU here): streamed through functional_call
        streamed_tables = model.precompute_adaln(*times)
        streamed = [model(video, audio, text, tv, ta, adaln=streamed_tables) for tv, ta in zip(*times)]
    model.close()
    equal = [
        torch.equal(a, b)
        for outputs in (cached, streamed)
        for ref, got in zip(reference, outputs, strict=True)
        for a, b in zip(ref, got, strict=True)
    ]
    full_width = tables.calls[next(iter(tables.calls))][0][0][0].shape[-1]
    return sliced, full_width, equal, tables.nbytes


def test_tp2_tables_are_exact_on_every_rank(ranks2):
    config = MiniMaxH3Config.tiny()
    results = ranks2.run(_tp2_exactness)
    for sliced, full_width, equal, nbytes in results:
        assert sliced == config.adaln_out_features // 2  # each rank holds half the projection...
        assert full_width == config.hidden_size  # ...and its tables are the gathered, full ones
        assert len(equal) == 2 * len(CALLS) * 2 and all(equal)
        assert nbytes == results[0][3]
