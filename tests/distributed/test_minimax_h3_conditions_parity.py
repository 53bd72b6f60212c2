"""MiniMax H3 DiT with Ref2VA / FL2VA condition rows under Ulysses (and TP x Ulysses) against the dense model.

The packed sequence is cut into contiguous rank rows; with condition rows between the text and the generated audio,
the cuts fall inside a condition segment (U4: row 32 is inside the image reference's rows), so each rank must embed
exactly its part of each segment from the right offset of the condition values. Every rank builds the same seeded
tiny model and inputs, runs it dense and parallel, and compares the velocities and the AdaLN table path.

Tolerance as in test_minimax_h3_parity.py, 2e-6 relative (measured 1.7e-7 to 2.8e-7 for U2, U4 and TP2xU2): Ulysses
moves exact copies of rows and heads, so only reduction orders differ. The negative control, video condition rows
embedded from a neighbour's offset, measures 9e-3 to 1.5e-2.
"""

from __future__ import annotations

import copy

import pytest
import torch

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit
from telefuser.models.minimax_h3.packing import Conditions, ReferenceGeometry, keyframe_layout, reference_layout
from telefuser.models.minimax_h3.spec import MINIMAX_H3

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

MAX_RELATIVE_ERROR = 2e-6
TEXT_ROWS = 30  # 30 text rows: the U4 cut at row 32 falls inside the first reference's rows
PATCH = (1, 2, 2)


def _conditions(config: MiniMaxH3Config, kind: str) -> Conditions:
    g = torch.Generator().manual_seed(5)
    if kind == "ref2va":
        layout = reference_layout(
            [
                ReferenceGeometry("image", (1, 4, 4)),
                ReferenceGeometry("audio", None, 3),
                ReferenceGeometry("video", (2, 4, 4), 2),
            ],
            text_rows=TEXT_ROWS,
            video_latent_thw=(3, 8, 8),
            patch_size=PATCH,
            audio_channels=2,
        )
    else:
        layout = keyframe_layout(("first", "last"), text_rows=TEXT_ROWS, video_latent_thw=(3, 8, 8), patch_size=PATCH)
    video = torch.randn(1, layout.video_rows, config.video_patch_dim, generator=g)
    audio = torch.randn(1, config.audio_latents_dim, layout.audio_rows, generator=g)
    tags = torch.ones(TEXT_ROWS, dtype=torch.long)
    tags[3:9] = 0  # a vision block's rows
    return Conditions(layout, video, audio, text_tags=tags)


def _parity(ctx, ulysses, tp, kind):
    mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses, tp_degree=tp))
    config = MiniMaxH3Config.tiny()
    g = torch.Generator().manual_seed(1)
    video = torch.randn(1, config.latents_dim, 3, 8, 8, generator=g)
    audio = torch.randn(1, config.audio_latents_dim, 10, generator=g)
    text = torch.randn(1, TEXT_ROWS, config.text_dim, generator=g)
    tv, ta = torch.tensor([250.0]), torch.tensor([600.0])
    conditions = _conditions(config, kind)
    dense_model = build_random_minimax_h3_dit(config, seed=0)
    model = MINIMAX_H3.parallelize(copy.deepcopy(dense_model), mesh)
    with torch.no_grad():
        dense = dense_model(video, audio, text, tv, ta, conditions=conditions)
        parallel = model(video, audio, text, tv, ta, conditions=conditions)
        tables = model.precompute_adaln([tv], [ta], conditions=conditions)
        tabled = model(video, audio, text, tv, ta, conditions=conditions, adaln=tables)
        shuffled = model(video, audio, text, tv, ta, conditions=_shuffled(conditions))
    model.close()
    errors = [((p - d).abs().max() / d.abs().max()).item() for d, p in zip(dense, parallel)]
    exact_tables = all(torch.equal(a, b) for a, b in zip(parallel, tabled))
    control = max(((p - d).abs().max() / d.abs().max()).item() for d, p in zip(dense, shuffled))
    return errors, exact_tables, control


def _shuffled(conditions: Conditions) -> Conditions:
    """Negative control: the video condition rows rolled by one (a row embedded from a neighbour's offset)."""
    return Conditions(
        conditions.layout, conditions.video.roll(1, dims=1), conditions.audio, text_tags=conditions.text_tags
    )


@pytest.mark.parametrize("kind", ["ref2va", "fl2va"])
def test_ulysses_with_conditions_matches_dense(ranks, kind):
    for errors, exact_tables, control in ranks.run(_parity, ranks.world_size, 1, kind):
        assert max(errors) <= MAX_RELATIVE_ERROR, errors
        assert exact_tables  # the table path is the same computation as the projections
        assert control > 1000 * MAX_RELATIVE_ERROR, control


def test_tp2_ulysses2_with_conditions_matches_dense(ranks4):
    for errors, exact_tables, control in ranks4.run(_parity, 2, 2, "ref2va"):
        assert max(errors) <= MAX_RELATIVE_ERROR, errors
        assert exact_tables and control > 1000 * MAX_RELATIVE_ERROR
