"""MiniMax H3 DiT under TP x Ulysses against the dense model in the same process (Ulysses alone, 2 and 4 ranks, is
the conformance suite's: tests/conformance/test_conformance_ranks.py).

Every rank builds the same seeded tiny model and the same inputs, runs it dense, then applies the model spec's plan
to a copy (or loads a checkpoint into a model parallelized before the read) and compares the full velocities every
rank returns. The checkpoint cases write the files from reference tensors (release names, or diffusers'
`save_pretrained`), load them dense and TP-sliced, and check that a TP rank read only its share of the bytes
(``get_slice``).

Tolerance: fp32 on CPU. Ulysses moves exact copies of rows and heads, so only the summation order of GEMMs over
fewer rows and of attention over fewer heads can differ; TP adds all-reduces of partial out_proj/fc2 sums, another
reduction order. Measured (2 layers, velocities up to ~5): max |parallel - dense| / max |dense| = 1.9e-7 (about
1e-6 absolute) for U2, U4 and TP2xU2 alike. The bound, 2e-6, is about 10x the worst measurement; a wrong head,
row or shard shows up as O(1).
"""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.models.minimax_h3 import (
    MiniMaxH3Config,
    build_random_minimax_h3_dit,
    load_minimax_h3_dit,
)
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.runtime import Runtime
from tests.minimax_h3_reference import reference_dit_from_release, release_dit_tensors, write_release_transformer
from tools.harness.ulysses_reference import recording_communicator

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

MAX_RELATIVE_ERROR = 2e-6


def _inputs(config: MiniMaxH3Config):
    g = torch.Generator().manual_seed(1)
    # 7 text + 10 audio (2 channels x 5) + 3x4x4 video rows = 65 -> 128 packed rows: padding crosses rank borders.
    video = torch.randn(2, config.latents_dim, 3, 8, 8, generator=g)
    audio = torch.randn(2, config.audio_latents_dim, 10, generator=g)
    text = torch.randn(2, 7, config.text_dim, generator=g)
    return video, audio, text, torch.tensor([250.0, 900.0]), torch.tensor([600.0, 40.0])


def _errors(dense, parallel):
    """max |parallel - dense| / max |dense| for the video and the audio velocity."""
    assert all(p.shape == d.shape and p.dtype == torch.float32 for d, p in zip(dense, parallel))
    return [((p - d).abs().max() / d.abs().max()).item() for d, p in zip(dense, parallel)]


def _parity(ctx, ulysses, tp, checkpoint_dir, layout="release"):
    mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses, tp_degree=tp))
    config = MiniMaxH3Config.tiny()
    inputs = _inputs(config)
    if checkpoint_dir is None:
        dense_model = build_random_minimax_h3_dit(config, seed=0)
        model = MINIMAX_H3.parallelize(copy.deepcopy(dense_model), mesh, communicator_factory=recording_communicator)
        read_share = None
    else:
        if ctx.rank == 0:
            _write_checkpoint(config, checkpoint_dir, layout)
        dist.barrier()
        dense_model = load_minimax_h3_dit(checkpoint_dir, device="cpu", dtype=torch.float32)
        runtime = Runtime(mesh, torch.device("cpu"), torch.float32)
        parallelize = partial(runtime.parallelize, spec=MINIMAX_H3, communicator_factory=recording_communicator)
        model = load_minimax_h3_dit(checkpoint_dir, device="cpu", dtype=torch.float32, parallelize=parallelize)
        # the parameters this rank keeps, plus the rope table the release ships (diffusers recomputes it)
        local_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        rope_bytes = model.rope.inv_freq.numel() * 4 if layout == "release" else 0
        read_share = (model.checkpoint_bytes_read, local_bytes + rope_bytes, dense_model.checkpoint_bytes_read)
    with torch.no_grad():
        dense = dense_model(*inputs)
        parallel = model(*inputs)
    calls = list(model.communicator.calls) if model.communicator is not None else []
    local_heads = model.blocks[0].attn.qkv_proj.out_features // (3 * config.attention_head_dim)
    model.close()
    assert model.communicator is None
    return _errors(dense, parallel), calls, local_heads, read_share


def _write_checkpoint(config, directory, layout):
    """Files from the reference: release-named tensors, or diffusers' save_pretrained of the model they make."""
    tensors = release_dit_tensors(config, seed=0)
    if layout == "release":
        write_release_transformer(tensors, config, Path(directory) / "transformer")
    else:
        reference = reference_dit_from_release(tensors, config, "interleaved")
        reference.save_pretrained(Path(directory) / "transformer", max_shard_size="50KB")


V_FIRST = [("scatter", "v", False), ("scatter", "q", False), ("scatter", "k", True), ("gather", None, True)]


def _check(results, config, heads_per_rank):
    """heads_per_rank: the heads each rank's fused QKV holds after TP (before the Ulysses scatter)."""
    for errors, calls, local_heads, read_share in results:
        assert max(errors) <= MAX_RELATIVE_ERROR, errors
        # One V-first group per DiT block; the text refiner is not sequence-split.
        assert calls == V_FIRST * config.num_layers, calls
        assert local_heads == heads_per_rank
        if read_share is not None:
            read, local, dense = read_share
            # a TP rank reads exactly the tensors it keeps (byte counts: data movement), about half of the file
            assert read == local and read < 0.6 * dense, read_share


def test_tp2_ulysses2_matches_dense(ranks4):
    config = MiniMaxH3Config.tiny()
    results = ranks4.run(_parity, 2, 2, None)
    _check(results, config, config.num_attention_heads // 2)


@pytest.mark.parametrize("layout", ["release", "diffusers"])
def test_tp2_ulysses2_checkpoint_loads_sliced(ranks4, tmp_path, layout):
    config = MiniMaxH3Config.tiny()
    results = ranks4.run(_parity, 2, 2, str(tmp_path / layout), layout)
    _check(results, config, config.num_attention_heads // 2)


@pytest.mark.parametrize("profile", [(2, 1), (4, 1), (2, 2)], ids=["U2", "U4", "TP2xU2"])
def test_released_head_count_splits_for_the_official_profiles(profile):
    ulysses, tp = profile
    ParallelConfig(ulysses_degree=ulysses, tp_degree=tp).check_heads(MiniMaxH3Config().num_attention_heads)
