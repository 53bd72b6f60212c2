"""MiniMax H3 AdaLN tables: `precompute_adaln` + `forward(adaln=...)` equal the per-call projections bit for bit.

The tables are the same ``adaln_proj(cond)`` calls forward makes (same modules, shapes, dtype), so the comparison
is torch.equal, not a tolerance; a negative control shows that a wrong table would be caught.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from telefuser.memory.plan import Placement
from telefuser.models.minimax_h3 import (
    AdaLNTables,
    MiniMaxH3Config,
    adaln_table_bytes,
    build_random_minimax_h3_dit,
)
from telefuser.models.minimax_h3 import dit as dit_module

TEXT_ROWS, AUDIO_ROWS, VIDEO_THW = 5, 6, (2, 4, 6)
# (t_video, t_audio) per call, video and audio different, as a request's schedule would give them
CALLS = [(0.0, 0.0), (137.5, 412.25), (500.0, 803.0), (912.125, 990.5)]


def _latents(config, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(batch, config.latents_dim, *VIDEO_THW, generator=g)
    audio = torch.randn(batch, config.audio_latents_dim, AUDIO_ROWS, generator=g)
    text = torch.randn(batch, TEXT_ROWS, config.text_dim, generator=g)
    return video, audio, text


def _times(calls, batch=1):
    return [torch.full((batch,), tv) for tv, _ in calls], [torch.full((batch,), ta) for _, ta in calls]


def _model(dtype):
    return build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=0, dtype=dtype)


def _outputs(model, latents, calls, adaln=None, batch=1):
    outs = []
    with torch.no_grad():
        for tv, ta in zip(*_times(calls, batch)):
            outs.append(model(*latents, tv, ta, adaln=adaln))
    return outs


def _assert_equal(a, b):
    for (va, aa), (vb, ab) in zip(a, b, strict=True):
        assert torch.equal(va, vb) and torch.equal(aa, ab)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_forward_with_tables_equals_forward_without_exactly(dtype):
    model = _model(dtype)
    latents = _latents(model.config)
    reference = _outputs(model, latents, CALLS)
    tables = model.precompute_adaln(*_times(CALLS))
    assert isinstance(tables, AdaLNTables) and len(tables) == len(CALLS)
    _assert_equal(_outputs(model, latents, CALLS, tables), reference)
    # the tables are exactly what the projections return per call
    cond = model._adaln_cond(torch.tensor([CALLS[1][0], CALLS[1][1]]))
    blocks, final = tables.lookup(torch.tensor([CALLS[1][0]]), torch.tensor([CALLS[1][1]]), torch.device("cpu"))
    with torch.no_grad():
        for block, table in zip(model.blocks, blocks, strict=True):
            assert all(torch.equal(a, b) for a, b in zip(block.adaln_proj(cond), table, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(model.final_layer.adaln_proj(cond), final, strict=True))
    # memory: what adaln_table_bytes says, per call 2 rows x (layers x 18 + 2) x hidden
    assert tables.nbytes == adaln_table_bytes(model.config, len(CALLS), dtype_bytes=dtype.itemsize)


def test_batched_calls_and_repeated_timesteps():
    model = _model(torch.float32)
    latents = _latents(model.config, batch=2)
    calls = [(100.0, 700.0), (100.0, 700.0), (650.0, 30.0)]
    tables = model.precompute_adaln(*_times(calls, batch=2))
    assert len(tables) == 2  # a repeated call shares its tables
    _assert_equal(_outputs(model, latents, calls, tables, batch=2), _outputs(model, latents, calls, batch=2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_offloaded_projections_stream_exact_tables(dtype, monkeypatch):
    model = _model(dtype)
    latents = _latents(model.config)
    reference = _outputs(model, latents, CALLS)
    weights = {name: p.detach().clone() for name, p in model.named_parameters() if ".adaln_proj." in name}
    moved = model.offload_adaln()
    assert moved == sum(w.numel() * w.element_size() for w in weights.values())
    for name, p in model.named_parameters():
        if ".adaln_proj." in name:
            assert p.device.type == "cpu" and torch.equal(p, weights[name])
            assert p.is_pinned() == torch.cuda.is_available()
    streamed = []
    monkeypatch.setattr(dit_module, "functional_call", lambda *a: streamed.append(1) or functional_call(*a))
    tables = model.precompute_adaln(*_times(CALLS))
    assert len(streamed) == len(CALLS) * (model.config.num_layers + 1)  # every projection went through the copy
    _assert_equal(_outputs(model, latents, CALLS, tables), reference)
    with pytest.raises(RuntimeError, match="offloaded"):
        _outputs(model, latents, CALLS[:1])


def test_missing_timesteps_and_mismatched_batch_are_refused():
    model = _model(torch.float32)
    video, audio, text = _latents(model.config)
    tables = model.precompute_adaln(*_times(CALLS))
    with torch.no_grad(), pytest.raises(ValueError, match=r"no AdaLN table for timesteps t_video=\[137.5\], t_audio"):
        model(video, audio, text, torch.tensor([137.5]), torch.tensor([412.0]), adaln=tables)
    with torch.no_grad(), pytest.raises(ValueError, match="batch 1"):
        video2, audio2, text2 = _latents(model.config, batch=2)
        model(video2, audio2, text2, torch.tensor([0.0, 0.0]), torch.tensor([0.0, 0.0]), adaln=tables)
    with pytest.raises(ValueError, match="one B"):
        model.precompute_adaln([torch.tensor([1.0]), torch.tensor([1.0, 2.0])], [torch.tensor([1.0])] * 2)
    with pytest.raises(ValueError, match=r"\[0, 1000\]"):
        model.precompute_adaln([torch.tensor([1200.0])], [torch.tensor([1.0])])
    tables.clear()
    with torch.no_grad(), pytest.raises(ValueError, match="hold 0 calls"):
        model(video, audio, text, torch.tensor([0.0]), torch.tensor([0.0]), adaln=tables)


def test_tables_of_other_timesteps_give_a_clearly_different_output():
    # the negative control: the exactness tests above would catch a table of the wrong call
    model = _model(torch.float32)
    latents = _latents(model.config)
    right = _outputs(model, latents, CALLS[1:2])[0]
    tables = model.precompute_adaln(*_times(CALLS[2:3]))
    tables.calls[tuple(torch.tensor(CALLS[1]).tolist())] = tables.calls.popitem()[1]  # call 2's tables under key 1
    wrong = _outputs(model, latents, CALLS[1:2], tables)[0]
    for r, w in zip(right, wrong, strict=True):
        assert not torch.equal(r, w)
        assert ((r - w).abs().max() / r.abs().max()).item() > 1e-3


# -- the pipeline ---------------------------------------------------------------------------------------------------
class _NoDecode(torch.nn.Module):
    """Latents are what is compared: skip the VAEs."""

    def forward(self, latents):
        return torch.zeros(latents.shape[0], 3, 1, 16, 16) if latents.dim() == 5 else torch.zeros(1, 2, 800)


def _pipeline(**kwargs):
    from telefuser.pipelines.minimax_h3 import build_minimax_h3_pipeline
    from telefuser.runtime import Runtime

    pipe = build_minimax_h3_pipeline(
        config="tiny", runtime=Runtime.one_rank("cpu", torch.float32), show_progress=False, **kwargs
    )
    if kwargs.get("placement") is None:
        assert not pipe.adaln_tables  # opt-in: off by default
        pipe.adaln_tables = True
    pipe.video_decoder = pipe.audio_decoder = _NoDecode()
    made = []
    precompute = pipe.dit.precompute_adaln
    pipe.dit.precompute_adaln = lambda tv, ta: made.append(precompute(tv, ta)) or made[-1]
    return pipe, made


REQUEST = {"duration": 0.9, "resolution": 32, "aspect_ratio": "16:9", "steps": 5, "seed": 3}
# the model tier's AdaLN placement alone: every projection in host memory, streamed for the tables
ADALN_OFFLOADED = Placement("model", {"dit": 2, "adaln": 0, "text_encoder": 2, "vae": 0}, frozenset({"adaln"}))


def test_pipeline_latents_with_tables_equal_those_without_also_offloaded():
    pipe, made = _pipeline()
    with_tables = pipe("a fox in snow", **REQUEST)
    assert len(made) == 1 and len(made[0]) == 0  # one set per request, all 4 calls, dropped at its end
    pipe.adaln_tables = False
    without = pipe("a fox in snow", **REQUEST)
    assert len(made) == 1
    offloaded, made_offloaded = _pipeline(placement=ADALN_OFFLOADED)
    assert offloaded.adaln_tables  # turned on by the offload, which needs them
    assert offloaded.dit.adaln_offloaded and "AdaLN projections 0/2 resident" in offloaded.weights["dit"]
    streamed = offloaded("a fox in snow", **REQUEST)
    assert len(made_offloaded) == 1
    for result in (with_tables, streamed):
        assert torch.equal(result.video_latents, without.video_latents)
        assert torch.equal(result.audio_latents, without.audio_latents)
    assert with_tables.metrics()["timings"]["adaln_tables_s"] > 0
    offloaded.adaln_tables = False
    with pytest.raises(RuntimeError, match="offloaded"):
        offloaded("a fox in snow", **REQUEST)


def test_pipeline_drops_the_tables_when_a_request_is_cancelled():
    from telefuser.pipelines.hooks import GenerationCancelled, StepHooks

    pipe, made = _pipeline()
    sizes = []
    with pytest.raises(GenerationCancelled):
        pipe("a fox", **REQUEST, hooks=StepHooks(cancelled=lambda: sizes.append(len(made[-1])) or len(sizes) > 2))
    assert sizes == [4, 4, 4] and len(made[0]) == 0
