"""Steady LingBot chunks as CUDA graphs: replays bit-identical to eager over whole sessions, on pooled buffers.

Needs a CUDA GPU; the FP8 case also SM90+ and nvidia-cudnn-frontend, the sage case SageAttention2's SM90 build
(skipped with the reason otherwise).

* Model level, bf16, FP8 (FP8 GEMMs + cuDNN FP8 attention over FP8 keys) and sage (``sage_sm90`` over its quantized
  window: every write requantizes the blocks it touched, from device data only): the scripted session
  (tests/lingbot_session_script.py: 4 window lengths, the window filling mid-chunk, the ring wrapping, read-only steps
  and commits) run eagerly (compiled regions, no graphs), then twice with graphs: the first session captures each
  (kind, window length) at its first call, the second, a new session on the same pooled buffers, only replays. Every
  output, every layer's window K/V after the last commit and the FP8 running max |V| equal the eager session's bit
  for bit (`torch.equal` on the bytes): a replay runs the eager call's kernels on the same data.
* Negative control: a replay whose ring slots are not refreshed (the slots baked in, as Python ints would be) writes
  the chunk's K/V over the wrong rows and differs.
* Pipeline level: after `warm_up`, a whole session (VAE and camera included) captures nothing, replays every DiT
  forward, and produces the frames and latents of a pipeline without graphs, exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from telefuser.models.lingbot_world_v2 import build_random_lingbot_dit
from telefuser.models.lingbot_world_v2.graphs import ChunkGraphs
from telefuser.ops.attention_fp8 import fp8_attention_available
from telefuser.ops.attention_sage import sage_sm90_available
from tests.lingbot_session_script import (
    CHUNKS,
    STEPS,
    covers_the_window,
    exactly_equal,
    run_session,
    session_config,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

GRID_HW = (16, 24)  # 96 tokens per frame, head_dim 128: shapes cuDNN's FP8 attention takes
WINDOW_LENGTHS = 4  # 3, 6, 9 frames of keys, then the full 10


def _lingbot(variant: str):
    check = {"fp8": fp8_attention_available, "sage": sage_sm90_available}.get(variant)
    if check is not None:
        ok, why = check()
        if not ok:
            pytest.skip(why)
    config = session_config(dim=256, num_heads=2, ffn_dim=512)
    model = build_random_lingbot_dit(config, seed=0, device="cuda", dtype=torch.bfloat16).eval()
    if variant == "fp8":
        model.quantize("fp8")
        model.attn_impl = "cudnn_fp8"
    if variant == "sage":
        model.attn_impl = "sage_sm90"
    return model


@pytest.mark.parametrize("variant", ["bf16", "fp8", "sage"])
def test_replayed_sessions_equal_the_eager_session_bit_for_bit(variant, monkeypatch):
    model = _lingbot(variant)
    eager = run_session(model, device="cuda", grid_hw=GRID_HW)
    assert covers_the_window(eager, model.config, GRID_HW)
    model.enable_cuda_graphs()
    graphs = model.graphs
    capturing = run_session(model, device="cuda", grid_hw=GRID_HW)
    captures, replays = graphs.captures, graphs.replays
    replaying = run_session(model, device="cuda", grid_hw=GRID_HW)
    forwards = CHUNKS * (len(STEPS) + 1)
    assert captures == 2 * WINDOW_LENGTHS  # read-only step and commit, per window length
    assert graphs.captures == captures and graphs.replays - replays == forwards  # the new session only replays
    assert graphs.entries == 1  # ... on the first session's buffers
    assert exactly_equal(capturing, eager), "a session that captured its graphs differs from the eager one"
    assert exactly_equal(replaying, eager), "a replayed session differs from the eager one"

    copy_in = ChunkGraphs._copy_in  # negative control: the ring slots baked in at capture

    def stale_slots(static, data, camera_source):
        copy_in(static, data._replace(slots=static.data.slots), camera_source)

    monkeypatch.setattr(ChunkGraphs, "_copy_in", staticmethod(stale_slots))
    stale = run_session(model, device="cuda", grid_hw=GRID_HW)
    assert not exactly_equal(stale, eager), "replays with stale ring slots went unnoticed"


def test_warm_up_captures_what_a_session_replays_and_frames_match_eager():
    from telefuser.pipelines.lingbot_world_v2 import build_lingbot_pipeline
    from telefuser.runtime import Runtime

    image = np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    request = dict(seed=3, resolution="128x96", num_frames=77, keep_latents=True)
    results = {}
    for graphs in (False, True):
        pipe = build_lingbot_pipeline(
            config="tiny", runtime=Runtime.one_rank("cuda", torch.bfloat16), cuda_graphs=graphs
        )
        pipe.warm_up(resolution="128x96")
        captured = pipe.dit.graphs.captures if graphs else None
        with pipe.start(image, "a red barn", **request) as session:
            replays = pipe.dit.graphs.replays if graphs else None
            chunks = [session.next_chunk(("w",) if i % 2 else ()) for i in range(session.total_chunks)]
            if graphs:
                forwards = session.total_chunks * (pipe.schedule.num_steps + 1)
                assert pipe.dit.graphs.captures == captured, "the session captured a graph the warm-up missed"
                assert pipe.dit.graphs.replays - replays == forwards
        results[graphs] = chunks
        pipe.close()
    for eager, replayed in zip(results[False], results[True], strict=True):
        assert torch.equal(eager.latents, replayed.latents)
        assert np.array_equal(eager.frames, replayed.frames)
