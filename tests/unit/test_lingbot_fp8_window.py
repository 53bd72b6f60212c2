"""LingBot-World v2 sessions that keep their keys in FP8 (for ``cudnn_fp8`` attention), on the CPU.

* The static key scale: a bound no key can exceed after the RMSNorm and RoPE (property test), and a tight one.
* Data movement, exact: the FP8-key format casts each chunk's keys once, with the layer's scale, into the slots the
  plan names; V is copied as it is; the running max |V| is the max over every row given.
* The wiring inside the model, with the cuDNN kernel emulated (the window's e4m3 keys dequantized, then SDPA): a tiny
  session against the same session in fp32, within e4m3 rounding of K, with a negative control. The kernel itself is
  tested against bf16 on the GPU (tests/gpu/test_lingbot_fp8_window_cuda.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from telefuser.models.lingbot_world_v2 import KVWindow, LingBotWorldV2Config, WindowError, build_random_lingbot_dit
from telefuser.models.lingbot_world_v2 import window_formats
from telefuser.models.lingbot_world_v2.window_formats import (
    FP8_KEY_WINDOW,
    KEY_BOUND_MARGIN,
    PLAIN_WINDOW,
    Fp8KeyLayer,
    key_scale,
)
from telefuser.models.wan import attention as wan_attention_module
from telefuser.models.wan.norms import RMSNorm
from telefuser.models.wan.rope import apply_rope, chunk_rope
from telefuser.ops.attention import attention
from telefuser.ops.attention_fp8 import FP8, FP8_MAX, cast_fp8
from tests.lingbot_session_script import GRID_HW, TOKENS_PER_FRAME, session_under_impl
from tests.numerics import relative_error


# -- the static key scale ---------------------------------------------------------------------------------------------
def _keys(norm: RMSNorm, x: torch.Tensor, heads: int, frame_offset: int = 0) -> torch.Tensor:
    """What CausalSelfAttention stores: RMSNorm over all heads, then RoPE per head (rows = 1 frame of 2x3)."""
    b, s, dim = x.shape
    k = norm(x).view(b, s, heads, dim // heads)
    cos, sin = chunk_rope(frame_offset, 1, 2, 3, dim // heads)
    return apply_rope(k, cos[:s], sin[:s])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    kind=st.sampled_from(["gaussian", "one-hot", "spiky", "huge"]),
    outlier=st.floats(1.0, 50.0),
)
def test_no_key_exceeds_the_bound(seed, dtype, kind, outlier):
    dim, heads = 64, 4
    g = torch.Generator().manual_seed(seed)
    norm = RMSNorm(dim)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=g))
        norm.weight[int(torch.randint(dim, (1,), generator=g))] *= outlier  # one outlier channel in the weight
    x = torch.randn(1, 6, dim, generator=g)
    if kind == "one-hot":
        x = torch.zeros_like(x).scatter_(2, torch.randint(dim, (1, 6, 1), generator=g), 3.0)
    elif kind == "spiky":
        x[..., int(torch.randint(dim, (1,), generator=g))] *= 1e3
    elif kind == "huge":
        x = x * 1e4
    norm = norm.to(dtype)
    k = _keys(norm, x.to(dtype), heads, frame_offset=int(torch.randint(100, (1,), generator=g)))
    scaled = k.detach().float() * key_scale(norm, dim)
    assert float(scaled.abs().max()) <= FP8_MAX


def test_the_bound_is_reached_by_a_one_hot_row():
    # so the scale wastes nothing: the largest key a layer can make lands within the margin of 448
    dim, heads = 64, 4
    norm = RMSNorm(dim)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, dim))
    x = torch.zeros(1, 6, dim)
    x[0, 0, dim - 1] = 5.0  # the channel of the largest weight; row 0 sits at position 0 (no rotation)
    k = _keys(norm, x, heads)
    top = float((k.float() * key_scale(norm, dim)).abs().max())
    assert FP8_MAX / KEY_BOUND_MARGIN * 0.999 <= top <= FP8_MAX
    assert math.isclose(float(k.abs().max()), math.sqrt(dim) * 2.0, rel_tol=1e-5)


# -- the window's data movement ---------------------------------------------------------------------------------------
HEADS, HEAD_DIM, BATCH, LAYERS, TPF = 2, 8, 2, 2, 3


def _fp8_window(scales, window_format=FP8_KEY_WINDOW) -> KVWindow:
    return KVWindow(
        batch=BATCH,
        num_layers=LAYERS,
        tokens_per_frame=TPF,
        local_attn_size=4,
        sink_size=1,
        local_heads=HEADS,
        head_dim=HEAD_DIM,
        ulysses_degree=1,
        cross_kv=[],
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        window_format=window_format,
        key_scales=scales,
    )


def test_keys_are_cast_once_into_their_slots_and_v_range_covers_every_row():
    scales = [torch.tensor([3.0]), torch.tensor([0.25])]
    session = _fp8_window(scales)
    layers = session.layers
    assert session.format is FP8_KEY_WINDOW and layers[0].k.dtype == FP8 and layers[0].v.dtype == torch.bfloat16
    g = torch.Generator().manual_seed(0)
    seen_max = [0.0] * LAYERS
    for index, frames in enumerate([1, 2, 3, 2, 1, 3, 2]):
        for commit in (False, False, True):
            plan = session.plan(frames)
            for layer in range(LAYERS):
                shape = (BATCH, plan.new_rows, HEADS, HEAD_DIM)
                k = (torch.randn(shape, generator=g) * (index + 1)).bfloat16()
                v = (torch.randn(shape, generator=g) * (7 - index)).bfloat16()
                cache = layers[layer]
                FP8_KEY_WINDOW.write(cache, k, v, plan.slot_rows("cpu"), plan.kept == 0)
                session.note_written(plan, commit=commit)
                expected = cast_fp8.reference(k, scales[layer])
                for row, first, rows in plan.slots:  # exact: the cast chunk rows, in the plan's slots
                    assert torch.equal(
                        cache.k[:, row : row + rows].view(torch.uint8),
                        expected[:, first : first + rows].view(torch.uint8),
                    )
                    assert torch.equal(cache.v[:, row : row + rows], v[:, first : first + rows])
                seen_max[layer] = max(seen_max[layer], float(v.float().abs().max()))
                assert float(cache.value_amax) == seen_max[layer]  # exact: a max of bf16 values
                assert torch.equal(cache.key_descale, scales[layer].reciprocal())
            if commit:
                session.advance(plan, frames)
    # every V row the window now holds lies within the running bound
    for layer in layers:
        assert float(layer.v.float().abs().max()) <= float(layer.value_amax)


def test_a_bf16_session_has_no_fp8_scales_and_a_scale_per_layer_is_required():
    with pytest.raises(WindowError, match="2 layers"):
        _fp8_window([torch.tensor([1.0])])
    with pytest.raises(WindowError, match="Fp8KeyWindow.. needs key scales"):
        _fp8_window(None)
    with pytest.raises(WindowError, match="PlainWindow.. takes no key scales"):
        _fp8_window([torch.tensor([1.0])] * LAYERS, PLAIN_WINDOW)
    plain = _fp8_window(None, PLAIN_WINDOW)
    assert plain.layers[0].k.dtype == torch.bfloat16
    assert not isinstance(plain.layers[0], Fp8KeyLayer) and not hasattr(plain.layers[0], "key_descale")


# -- inside the model, the kernel emulated ----------------------------------------------------------------------------


def _emulated_kernel(descale_factor: float = 1.0):
    def fp8_attention_known_scales(q, k8, descale_k, v, amax_v, *, kv_rows):
        k8, v = k8[:, : int(kv_rows)], v[:, : int(kv_rows)]  # whole window buffers: their first kv_rows rows
        assert k8.dtype == FP8 and float(v.float().abs().max()) <= float(amax_v)
        keys = (k8.float() * descale_k * descale_factor).to(q.dtype)
        return attention(q, keys, v)

    return fp8_attention_known_scales


# e4m3 keeps 3 mantissa bits: each key is rounded by at most 2^-4 relatively. Through the scores' softmax, two blocks
# and the head of a random tiny model that measured 4.2e-3 (max relative error over a 6-chunk session, fp32 model);
# 1e-2 leaves a margin of 2.4. Negative control: keys read back with twice their descale (a scale applied twice, or
# not at all, is worse) land far above.
BOUND = 1e-2


@pytest.mark.numerics
def test_a_session_with_fp8_keys_matches_fp32_within_key_rounding(monkeypatch):
    model = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=0)
    reference_session, reference = session_under_impl(model, "sdpa")
    # cross-attention (per-call FP8 in the model) runs plain SDPA here: only the window's keys are under test
    monkeypatch.setattr(window_formats, "attention", lambda q, k, v, impl, kv_rows: attention(q, k, v, kv_rows=kv_rows))
    monkeypatch.setattr(wan_attention_module, "attention", lambda q, k, v, impl: attention(q, k, v))  # cross-attention
    monkeypatch.setattr(window_formats, "fp8_attention_known_scales", _emulated_kernel())
    session, ours = session_under_impl(model, "cudnn_fp8")
    assert session.format is FP8_KEY_WINDOW and reference_session.format is PLAIN_WINDOW
    error = max(relative_error(o, r) for o, r in zip(ours, reference, strict=True))
    print(f"fp8 keys against fp32: max relative error {error:.3e}")
    assert 0 < error <= BOUND, error
    monkeypatch.setattr(window_formats, "fp8_attention_known_scales", _emulated_kernel(descale_factor=2.0))
    _, wrong = session_under_impl(model, "cudnn_fp8")
    wrong_error = max(relative_error(o, r) for o, r in zip(wrong, reference, strict=True))
    print(f"negative control: {wrong_error:.3e}")
    assert wrong_error > 5 * BOUND, wrong_error


def test_a_session_with_fp8_keys_refuses_another_attention():
    model = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=0)
    text = torch.randn(1, 5, model.config.text_dim)
    model.attn_impl = "cudnn_fp8"
    session = model.new_window(1, text, tokens_per_frame=TOKENS_PER_FRAME)
    model.attn_impl = "sdpa"
    assert session.format is FP8_KEY_WINDOW
    latents = torch.randn(1, model.config.in_dim, 1, *GRID_HW)
    with pytest.raises(
        WindowError,
        match=r"^the KV window is kept in the 'fp8_keys' format, which attention cudnn_fp8 reads; the model now "
        r"runs 'sdpa': make a new window$",
    ):
        model.forward_chunk(session, latents, torch.tensor([500.0]), None, update_cache=False)
