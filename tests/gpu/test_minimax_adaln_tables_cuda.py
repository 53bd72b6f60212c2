"""MiniMax H3 AdaLN tables on a CUDA GPU: the same bit-for-bit contract as on the CPU (tests/unit), where the
projections are cuBLAS GEMMs and the offloaded weights are streamed from pinned host memory by copies.

Needs a CUDA GPU, not tf-kernel: ``python3 -m pytest tests/gpu/test_minimax_adaln_tables_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit

CALLS = [(0.0, 0.0), (137.5, 412.25), (500.0, 803.0), (912.125, 990.5)]


def _setup(seed=0):
    model = build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=0, dtype=torch.bfloat16).cuda().eval()
    g = torch.Generator().manual_seed(seed)
    config = model.config
    latents = (
        torch.randn(1, config.latents_dim, 2, 4, 6, generator=g).cuda(),
        torch.randn(1, config.audio_latents_dim, 6, generator=g).cuda(),
        torch.randn(1, 5, config.text_dim, generator=g).cuda().bfloat16(),
    )
    return model, latents


def _times():
    return [torch.full((1,), tv, device="cuda") for tv, _ in CALLS], [
        torch.full((1,), ta, device="cuda") for _, ta in CALLS
    ]


def _outputs(model, latents, adaln=None):
    with torch.inference_mode():
        return [model(*latents, tv, ta, adaln=adaln) for tv, ta in zip(*_times())]


def _equal(a, b) -> bool:
    return all(torch.equal(va, vb) and torch.equal(aa, ab) for (va, aa), (vb, ab) in zip(a, b, strict=True))


def test_tables_equal_the_per_call_projections_and_a_wrong_table_does_not():
    model, latents = _setup()
    reference = _outputs(model, latents)
    tables = model.precompute_adaln(*_times())
    assert _equal(_outputs(model, latents, tables), reference)
    # negative control: every call looked up in the tables of the next call's timesteps
    swapped = type(tables)(batch=tables.batch, device=tables.device)
    keys = list(tables.calls)
    swapped.calls = {key: tables.calls[keys[(i + 1) % len(keys)]] for i, key in enumerate(keys)}
    wrong = _outputs(model, latents, swapped)
    assert not any(torch.equal(w[0], r[0]) for w, r in zip(wrong, reference))


def test_offloaded_projections_leave_the_gpu_and_stream_exact_tables():
    model, latents = _setup()
    reference = _outputs(model, latents)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    moved = model.offload_adaln()
    torch.cuda.synchronize()
    assert moved > 0 and before - torch.cuda.memory_allocated() >= moved  # the projection weights left the GPU
    for name, p in model.named_parameters():
        if ".adaln_proj." in name:
            assert p.device.type == "cpu" and p.is_pinned(), name
    tables = model.precompute_adaln(*_times())
    assert _equal(_outputs(model, latents, tables), reference)
    with pytest.raises(RuntimeError, match="offloaded"):
        _outputs(model, latents)
