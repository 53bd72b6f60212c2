"""LingBot-World v2 sessions with ``cudnn_fp8`` attention on a GPU: the FP8-key window against bf16 SDPA and against
FP8 attention over a bf16 window (quantized whole per call).

Needs a CUDA GPU of SM90+ and nvidia-cudnn-frontend, not tf-kernel:
``python3 -m pytest --noconftest tests/gpu/test_lingbot_fp8_window_cuda.py``.

Bound: FP8 attention on random data measures cosine ~0.998 and relative L2 ~6e-2 per call against bf16
(tests/gpu/test_attention_fp8_cuda.py, whose per-call bound is relative L2 <= 0.1); a session's outputs are held to
that bound and cosine >= 0.99. Negative control: a V bound 10x too low (a bound that is not one clips V) lands far
above it. (A wrong key scale is not a usable control here: a small random model's attention is nearly uniform, so even
keys read at twice their scale move its outputs by only 3%, as an fp32 CPU emulation measured.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
cudnn = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend (import name cudnn) is not installed")

from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit
from telefuser.ops.attention_fp8 import FP8, fp8_attention_available

GRID_HW = (16, 24)  # 96 tokens per frame: a 384-row window
TPF = GRID_HW[0] * GRID_HW[1] // 4
MIN_COSINE, MAX_REL_L2 = 0.99, 0.1


@pytest.fixture(autouse=True, scope="module")
def _usable():
    ok, why = fp8_attention_available()
    if not ok:
        pytest.skip(why)


@pytest.fixture(scope="module")
def model():
    config = LingBotWorldV2Config.tiny(dim=256, num_heads=2, ffn_dim=512)  # head_dim 128, as the official model
    return build_random_lingbot_dit(config, seed=0, device="cuda", dtype=torch.bfloat16).eval()


def _session(model, *, session_impl: str, call_impl: str, value_bound_factor: float = 1.0):
    text = torch.randn(1, 5, model.config.text_dim, generator=torch.Generator().manual_seed(1)).cuda().bfloat16()
    model.attn_impl = session_impl
    session = model.new_session(1, text, tokens_per_frame=TPF)
    if value_bound_factor != 1.0:
        scales = session.fp8_scales
        session.fp8_scales = lambda layer: (scales(layer)[0], scales(layer)[1] * value_bound_factor)
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


def test_fp8_key_window_matches_bf16_and_the_per_call_quantization(model):
    _, bf16 = _session(model, session_impl="sdpa", call_impl="sdpa")
    session, fp8_window = _session(model, session_impl="cudnn_fp8", call_impl="cudnn_fp8")
    assert session.fp8_keys and session.self_kv[0].k.dtype == FP8
    _, per_call = _session(model, session_impl="sdpa", call_impl="cudnn_fp8")
    (cos_bf16, rel_bf16), (cos_call, rel_call) = _metrics(fp8_window, bf16), _metrics(fp8_window, per_call)
    print(
        f"fp8-key window: cosine {cos_bf16:.5f} / rel. L2 {rel_bf16:.4f} vs bf16, {cos_call:.5f} / {rel_call:.4f} vs "
        f"per-call FP8; per-call FP8 vs bf16: {_metrics(per_call, bf16)}"
    )
    assert cos_bf16 >= MIN_COSINE and rel_bf16 <= MAX_REL_L2
    assert cos_call >= MIN_COSINE and rel_call <= MAX_REL_L2
    _, clipped = _session(model, session_impl="cudnn_fp8", call_impl="cudnn_fp8", value_bound_factor=0.1)
    cos_wrong, rel_wrong = _metrics(clipped, bf16)
    print(f"negative control (V bound 10x too low): cosine {cos_wrong:.5f}, relative L2 {rel_wrong:.4f}")
    assert rel_wrong > 3 * MAX_REL_L2
