"""LingBot-World v2 sessions with ``cudnn_fp8`` attention on a GPU: the FP8-key window against bf16 SDPA and against
FP8 attention over a bf16 window (quantized whole per call).

Needs a CUDA GPU of SM90+ and nvidia-cudnn-frontend, not tf-kernel:
``python3 -m pytest tests/gpu/test_lingbot_fp8_window_cuda.py``.

Bounds: FP8 attention on random data measures cosine ~0.998 and relative L2 ~6e-2 per call against bf16
(tests/gpu/test_attention_fp8_cuda.py holds each call to relative L2 <= 0.1, cosine >= 0.995). Here every attention
call of a session is checked that way against bf16 SDPA on the same queries, the window's keys (dequantized: their
e4m3 rounding is the CPU test's subject) and values; and the session's outputs against a bf16 session. Negative
control: a V bound 10x too low (a bound that is not one clips V) fails the per-call check. It cannot fail the
session-level one: a small random model's outputs barely depend on its attention (that control moved them by 3%).

These checks hook the FP8-key window's attention call (`window_formats.fp8_attention_known_scales`, once per layer), so
the module runs with fusion off (the block regions run eagerly); the compiled regions are held to the eager ones in
tests/gpu/test_compiled_regions_cuda.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
cudnn = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend (import name cudnn) is not installed")

from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit
from telefuser.models.lingbot_world_v2.window_formats import FP8_KEY_WINDOW
from telefuser.ops.attention_fp8 import FP8, fp8_attention_available
from telefuser.ops.fusion import fusion_enabled, set_fusion

GRID_HW = (16, 24)  # 96 tokens per frame: a 384-row window
TPF = GRID_HW[0] * GRID_HW[1] // 4
MIN_COSINE, MAX_REL_L2 = 0.99, 0.1


@pytest.fixture(autouse=True, scope="module")
def _usable():
    ok, why = fp8_attention_available()
    if not ok:
        pytest.skip(why)


@pytest.fixture(autouse=True, scope="module")
def _reference_path():
    before = fusion_enabled()
    set_fusion(False)
    yield
    set_fusion(before)


@pytest.fixture(scope="module")
def model():
    config = LingBotWorldV2Config.tiny(dim=256, num_heads=2, ffn_dim=512)  # head_dim 128, as the official model
    return build_random_lingbot_dit(config, seed=0, device="cuda", dtype=torch.bfloat16).eval()


def _session(model, *, session_impl: str, call_impl: str):
    text = torch.randn(1, 5, model.config.text_dim, generator=torch.Generator().manual_seed(1)).cuda().bfloat16()
    model.attn_impl = session_impl
    session = model.new_window(1, text, tokens_per_frame=TPF)
    model.attn_impl = call_impl
    outputs = []
    try:
        for index, frames in enumerate([1, 2, 3, 2, 1, 3]):
            g = torch.Generator().manual_seed(100 + index)
            camera = torch.randn(1, frames * TPF, model.config.camera_feature_dim, generator=g).cuda().bfloat16()
            modulation = model.camera_modulation(camera)
            for t, commit in ((900.0, False), (500.0, False), (0.0, True)):
                latents = torch.randn(1, model.config.in_dim, frames, *GRID_HW, generator=g).cuda()
                t = torch.tensor([t], device="cuda")
                outputs.append(model.forward_chunk(session, latents, t, modulation, update_cache=commit))
    finally:
        model.attn_impl = "sdpa"
    return session, torch.cat([o.flatten() for o in outputs])


def _metrics(a, b) -> tuple[float, float]:
    a, b = a.double(), b.double()
    return F.cosine_similarity(a, b, dim=0).item(), ((a - b).norm() / b.norm()).item()


def _checked_calls(monkeypatch, value_bound_factor: float = 1.0):
    """Record every window attention call's (cosine, relative L2) against bf16 SDPA on the same inputs; the kernel is
    handed the window's running max |V| times `value_bound_factor`."""
    from telefuser.models.lingbot_world_v2 import window_formats
    from telefuser.ops.attention import attention
    from telefuser.ops.attention_fp8 import fp8_attention_known_scales as real

    calls = []

    def checked(q, k8, descale_k, v, amax_v, *, kv_rows):
        out = real(q, k8, descale_k, v, amax_v * value_bound_factor, kv_rows=kv_rows)
        rows = int(kv_rows)  # whole window buffers: their first kv_rows rows are attended
        keys = (k8[:, :rows].float() * descale_k).to(q.dtype)
        calls.append(_metrics(out.flatten(), attention(q, keys, v[:, :rows]).flatten()))
        return out

    monkeypatch.setattr(window_formats, "fp8_attention_known_scales", checked)
    return calls


def test_fp8_key_window_matches_bf16_per_call_and_over_a_session(model, monkeypatch):
    _, bf16 = _session(model, session_impl="sdpa", call_impl="sdpa")
    _, per_call = _session(model, session_impl="sdpa", call_impl="cudnn_fp8")
    calls = _checked_calls(monkeypatch)
    session, fp8_window = _session(model, session_impl="cudnn_fp8", call_impl="cudnn_fp8")
    assert session.format is FP8_KEY_WINDOW and session.layers[0].k.dtype == FP8
    assert len(calls) == 18 * model.config.num_layers  # 6 chunks x 3 full forwards (forward_chunk, not commit_chunk)
    worst_cos, worst_rel = min(c for c, _ in calls), max(r for _, r in calls)
    (cos_bf16, rel_bf16), (cos_call, rel_call) = _metrics(fp8_window, bf16), _metrics(fp8_window, per_call)
    print(
        f"per call: worst cosine {worst_cos:.5f}, worst rel. L2 {worst_rel:.4f}; session: cosine {cos_bf16:.5f} / "
        f"rel. L2 {rel_bf16:.4f} vs bf16, {cos_call:.5f} / {rel_call:.4f} vs per-call FP8 over a bf16 window"
    )
    assert worst_cos >= 0.995 and worst_rel <= MAX_REL_L2
    assert cos_bf16 >= MIN_COSINE and rel_bf16 <= MAX_REL_L2
    assert cos_call >= MIN_COSINE and rel_call <= MAX_REL_L2
    clipped = _checked_calls(monkeypatch, value_bound_factor=0.1)
    _session(model, session_impl="cudnn_fp8", call_impl="cudnn_fp8")
    clipped_rel = max(r for _, r in clipped)
    print(f"negative control (V bound 10x too low): worst per-call relative L2 {clipped_rel:.4f}")
    assert clipped_rel > 3 * MAX_REL_L2
