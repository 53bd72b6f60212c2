"""The V-first attention layer under Ulysses against dense execution."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from examples.ulysses_attention.attention_layer import UlyssesSelfAttention
from telefuser.ops.rotary import rope_frequencies
from tools.harness.ulysses_reference import recording_communicator

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)


def _layer_parity(ctx, seq_len):
    w, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)
    layer = UlyssesSelfAttention(dim=48, num_heads=2 * w, head_dim=16).eval()
    x = torch.randn(1, seq_len, 48)
    cos, sin = rope_frequencies(torch.arange(seq_len), 8)  # partial rotary: 8 of 16 channels
    rows = slice(r * seq_len // w, (r + 1) * seq_len // w)
    with torch.no_grad():
        dense = layer(x, cos, sin)
        layer.communicator = comm = recording_communicator(ctx.group)
        local = layer(x[:, rows], cos[rows], sin[rows])
    comm.close()
    parts = [torch.empty_like(local) for _ in range(w)]
    dist.all_gather(parts, local)
    err = (torch.cat(parts, dim=1) - dense).abs().max().item()
    return err, comm.calls


def test_layer_matches_dense_and_submits_v_first(ranks):
    for err, calls in ranks.run(_layer_parity, 24):
        # fp32 on CPU: the same per-head math on the same rows; only summation order may differ.
        assert err <= 1e-5, err
        assert calls == [
            ("scatter", "v", False),
            ("scatter", "q", False),
            ("scatter", "k", True),
            ("gather", None, True),
        ]
