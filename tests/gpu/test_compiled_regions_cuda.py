"""One compiled region per block on a GPU: outputs against the reference path, compiled calls and recompiles.

Needs a CUDA GPU; the FP8 cases also SM90+ and nvidia-cudnn-frontend (skipped with the reason otherwise).
``python3 -m pytest tests/gpu/test_compiled_regions_cuda.py -s`` prints every measured error.

* LingBot-World v2, bf16, FP8 (FP8 GEMMs + cuDNN FP8 attention over FP8 keys) and sage (bf16 GEMMs +
  ``sage_sm90`` over its quantized window; needs the SM90 build): the scripted session
  (tests/lingbot_session_script.py: every window length, the ring wrapping, read-only steps and commits) with its
  blocks compiled, against the same regions run eagerly (``TELEFUSER_FUSION=0``: eager chains).
* The budget of issue 24: a tiny LingBot 40 blocks deep (the official depth) makes at most 45 compiled calls per
  steady forward (41.3 measured on the H200: 40 regions and the calls outside them), bf16 and FP8, and a second whole
  session compiles nothing.
* MiniMax H3 bf16: one call with its joint blocks compiled against the reference path.

Bounds. bf16 (u = 2^-8): Inductor keeps each fused chain's intermediates in fp32 where the eager chain rounds some of
them to bf16, so values differ by about one bf16 rounding each, carried through two blocks and the head: measured on
the CPU (Inductor's C++ backend, same tiny session) 1.5e-3; bound 1e-2. FP8: on top of that, an activation whose
compiled quantization lands one e4m3 step from the eager one (0.6% of values at rounding midpoints, ops/README.md)
moves a dot product by one step of one of its terms: measured 1.6e-2 on the H200 (2026-12-02); bound 3e-2, under
e4m3's unit roundoff 2^-4. sage: the same kind of step (an INT8 key or query, or an e4m3 value, rounded from a
compiled quotient one ulp away from the eager one), same bound. Negative control, every case: the window's values written 8x too large (every attention
then averages wrong values), which must land far above both bounds. Attention is a small part of this random tiny
model's output, so milder bugs land close: on the H200 keys and values swapped measured 0.11, keys negated 0.06.
"""

from __future__ import annotations

import pytest
import torch

from telefuser.models.lingbot_world_v2 import build_random_lingbot_dit
from telefuser.ops.attention_fp8 import fp8_attention_available
from telefuser.ops.attention_sage import sage_sm90_available
from telefuser.ops.compile_stats import count_compiled
from telefuser.ops.fusion import fusion_enabled, set_fusion
from tests.lingbot_session_script import CHUNKS, STEPS, covers_the_window, run_session, session_config
from tests.numerics import relative_error

pytestmark = [pytest.mark.numerics, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]

BOUND = {"bf16": 1e-2, "fp8": 3e-2, "sage": 3e-2}
GRID_HW = (16, 24)  # 96 tokens per frame, head_dim 128: shapes cuDNN's FP8 attention takes
CALL_BUDGET = 45  # compiled-function calls per steady 40-block forward (issue 24)


def _skip_without_fp8(variant: str) -> None:
    check = {"fp8": fp8_attention_available, "sage": sage_sm90_available}.get(variant)
    if check is not None:
        ok, why = check()
        if not ok:
            pytest.skip(why)


def _lingbot(variant: str, **overrides):
    _skip_without_fp8(variant)
    config = session_config(dim=256, num_heads=2, ffn_dim=512, **overrides)
    model = build_random_lingbot_dit(config, seed=0, device="cuda", dtype=torch.bfloat16).eval()
    if variant == "fp8":
        model.quantize("fp8")
        model.attn_impl = "cudnn_fp8"
    if variant == "sage":
        model.attn_impl = "sage_sm90"
    return model


@pytest.fixture
def fusion():
    before = fusion_enabled()
    yield set_fusion
    set_fusion(before)


def _error(got, want) -> float:
    return max(relative_error(o, r) for o, r in zip(got.outputs, want.outputs, strict=True))


@pytest.mark.parametrize("variant", ["bf16", "fp8", "sage"])
def test_lingbot_regions_match_the_reference_path(variant, fusion, monkeypatch):
    model = _lingbot(variant)
    fusion(False)
    reference = run_session(model, device="cuda", grid_hw=GRID_HW)
    fusion(True)
    compiled = run_session(model, device="cuda", grid_hw=GRID_HW)
    assert covers_the_window(reference, model.config, GRID_HW)
    error = _error(compiled, reference)
    print(f"{variant}: compiled regions against the reference path: {error:.3e}")
    assert error <= BOUND[variant], error

    from telefuser.models.lingbot_world_v2.window_formats import format_for

    kind = type(format_for(model.attn_impl))  # the session's window format
    write = kind.write
    monkeypatch.setattr(kind, "write", lambda self, layer, k, v, *rest: write(self, layer, k, v * 8, *rest))
    torch._dynamo.reset()  # the regions compiled the real write in (the format object is a constant there)
    try:
        wrong = _error(run_session(model, device="cuda", grid_hw=GRID_HW), reference)
    finally:
        torch._dynamo.reset()  # no compiled code with the wrong write outlives this test
    print(f"{variant}: negative control (the window's values written 8x too large): {wrong:.3e}")
    assert wrong > 5 * BOUND[variant], wrong


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_forty_blocks_make_forty_compiled_calls_and_no_recompiles(variant, fusion):
    model = _lingbot(variant, num_layers=40)
    fusion(True)
    run_session(model, device="cuda", grid_hw=GRID_HW)  # warm-up: every window length and the commit
    with count_compiled() as session:
        run_session(model, device="cuda", grid_hw=GRID_HW)
    forwards = CHUNKS * (len(STEPS) + 1)
    per_forward = session.calls / forwards
    print(f"{variant}: {per_forward:g} compiled calls per forward, {session.compiles} compiles in the second session")
    assert session.compiles == 0, session
    assert per_forward <= CALL_BUDGET, per_forward  # 40 regions + the few compiled calls outside the blocks


def test_minimax_regions_match_the_reference_path(fusion, monkeypatch):
    from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit
    from telefuser.models.minimax_h3 import attention as attention_module

    model = build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=0, device="cuda", dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    video = torch.randn(1, model.config.latents_dim, 3, 16, 16, generator=g).cuda()
    audio = torch.randn(1, model.config.audio_latents_dim, 10, generator=g).cuda()
    text = torch.randn(1, 7, model.config.text_dim, generator=g).cuda().bfloat16()
    t_video, t_audio = torch.tensor([700.0], device="cuda"), torch.tensor([300.0], device="cuda")
    with torch.no_grad():
        fusion(False)
        reference = model(video, audio, text, t_video, t_audio)
        fusion(True)
        with count_compiled() as stats:
            compiled = model(video, audio, text, t_video, t_audio)
        error = max(relative_error(c, r) for c, r in zip(compiled, reference, strict=True))
        attend = attention_module.attend_documents
        monkeypatch.setattr(attention_module, "attend_documents", lambda q, k, v, d, impl: attend(q, v, k, d, impl))
        wrong = max(relative_error(c, r) for c, r in zip(model(video, audio, text, t_video, t_audio), reference))
    print(f"MiniMax H3 regions against the reference path: {error:.3e}; negative control (K and V swapped) {wrong:.3e}")
    assert stats.calls >= model.config.num_layers  # one per joint block (plus the refiner's and head's chains)
    assert error <= BOUND["bf16"], error
    assert wrong > 5 * BOUND["bf16"], wrong
