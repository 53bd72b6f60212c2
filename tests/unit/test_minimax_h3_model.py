"""MiniMax H3 DiT on CPU: config, packing, shapes, partial RoPE, per-modality AdaLN, padding and the block hook."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from telefuser.models.minimax_h3 import (
    FP32_PARAMETER_NAMES,
    MiniMaxH3Config,
    MiniMaxH3ConfigError,
    build_random_minimax_h3_dit,
)
from telefuser.models.minimax_h3 import attention as attention_module
from telefuser.models.minimax_h3.attention import AttentionContext
from telefuser.models.minimax_h3.modulation import table_rows, timestep_rows
from telefuser.models.minimax_h3.packing import (
    TAG_AUDIO,
    TAG_PAD,
    TAG_TEXT,
    TAG_VIDEO,
    pack_layout,
    patchify_video,
    unpatchify_video,
)

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

TEXT_ROWS, AUDIO_ROWS, VIDEO_THW = 5, 6, (2, 4, 6)  # 5 + 6 + 2*2*3 = 23 valid rows -> 64 packed rows


@pytest.fixture(scope="module")
def model():
    return build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=0)


def _inputs(config, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(batch, config.latents_dim, *VIDEO_THW, generator=g)
    audio = torch.randn(batch, config.audio_latents_dim, AUDIO_ROWS, generator=g)
    text = torch.randn(batch, TEXT_ROWS, config.text_dim, generator=g)
    return video, audio, text, torch.linspace(100.0, 900.0, batch), torch.linspace(800.0, 50.0, batch)


def _run(model, inputs, **kwargs):
    with torch.no_grad():
        return model(*inputs, **kwargs)


# -- config -----------------------------------------------------------------------------------------------------
def test_defaults_are_the_released_architecture():
    c = MiniMaxH3Config()
    assert (c.hidden_size, c.num_layers, c.token_refiner_num_layers) == (5376, 50, 2)
    assert (c.num_attention_heads, c.attention_head_dim, c.inner_dim, c.ffn_hidden_size) == (56, 128, 7168, 14336)
    assert (c.latents_dim, c.audio_latents_dim, c.patch_size, c.video_patch_dim) == (24, 32, (1, 2, 2), 96)
    assert (c.text_dim, c.timestep_input_dim, c.time_embed_hidden_size, c.time_embed_dim) == (5120, 256, 5376, 2688)
    assert (c.adaln_out_features, c.final_adaln_out_features) == (18 * 5376, 2 * 5376)
    assert (c.rope_inv_freq_len, c.rotary_dim, c.norm_eps) == (16, 96, 1e-5)
    tiny = MiniMaxH3Config.tiny()
    assert tiny.rotary_dim <= tiny.attention_head_dim and tiny.inner_dim != tiny.hidden_size


def test_from_json_ignores_unknown_keys_and_names_missing_ones(tmp_path, caplog):
    payload = {"_class_name": "MiniMaxH3DiTModel", **MiniMaxH3Config().to_dict(), "image_model": "minimax_h3"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(payload))
    with caplog.at_level(logging.INFO, logger="telefuser.models.minimax_h3.config"):
        assert MiniMaxH3Config.from_json(path) == MiniMaxH3Config()
    assert "image_model" in caplog.text and "_class_name" not in caplog.text
    del payload["hidden_size"], payload["text_dim"]
    path.write_text(json.dumps(payload))
    with pytest.raises(MiniMaxH3ConfigError, match="missing required MiniMax H3 keys: hidden_size, text_dim"):
        MiniMaxH3Config.from_json(path)
    with pytest.raises(MiniMaxH3ConfigError, match="adaln_out_features"):
        MiniMaxH3Config(adaln_out_features=123)
    with pytest.raises(MiniMaxH3ConfigError, match="rotary"):
        MiniMaxH3Config.tiny(rope_inv_freq_len=3)


# -- packing ----------------------------------------------------------------------------------------------------
def test_packed_layout_follows_the_release():
    layout = pack_layout(
        text_rows=3, video_latent_thw=(6, 4, 8), audio_rows=8, audio_channels=2, patch_size=(1, 2, 2), multiple_of=3
    )
    assert (layout.used, layout.seq_len) == (3 + 8 + 6 * 8, 192)  # lcm(64, Ulysses 3)
    tags = layout.tags.tolist()
    assert tags == [TAG_TEXT] * 3 + [TAG_AUDIO] * 8 + [TAG_VIDEO] * 48 + [TAG_PAD] * (192 - 59)
    assert layout.documents == [(0, 59), (59, 192)]
    pos = layout.positions
    assert pos[:3].tolist() == [[0, 0, 0], [1, 0, 0], [2, 0, 0]]
    frame_t = pos[layout.video][::8, 0]  # one value per latent frame: spans 5/3 x (1, 4, 4, 4, 4)
    expected = [3 + 5 / 3 * s for s in (0, 1, 5, 9, 13, 17)]
    assert frame_t.tolist() == pytest.approx(expected)
    # Spatial grid normalised by sqrt(H*W)=sqrt(32), scaled by 32: h in [(1-4/r)/2, ...), w likewise.
    r = math.sqrt(32)
    h0, w0 = (1 - 4 / r) / 2 * 32, (1 - 8 / r) / 2 * 32
    assert pos[layout.video][0, 1:].tolist() == pytest.approx([h0, w0])
    assert pos[layout.video][1, 2].item() == pytest.approx(w0 + 8 / r / 4 * 32)
    audio = pos[layout.audio]
    assert audio[:, 0].tolist() == [3, 4, 5, 6, 3, 4, 5, 6]  # channel-major, each channel restarts at L
    assert audio[:4, 2].unique().tolist() == pytest.approx([w0])  # channel 0 on the first w column
    assert audio[4:, 2].unique().item() == pytest.approx(pos[layout.video][3, 2].item())  # channel 1 on the last
    assert (audio[:, 1] == 0).all() and (pos[layout.used :] == 0).all()


def test_adaln_rows_pick_modality_and_its_timestep():
    layout = pack_layout(
        text_rows=2, video_latent_thw=(1, 2, 2), audio_rows=2, audio_channels=2, patch_size=(1, 2, 2), alignment=8
    )
    timesteps = timestep_rows(layout.timestep_slots, batch=2)
    rows = table_rows(layout.tags, timesteps)
    # conditioning rows: [video t item0, video t item1, audio t item0, audio t item1]; table row = t_row*3 + tag.
    # packed: text, text, audio, audio, video, pad x3. Text and padding use the video timestep.
    assert timesteps.tolist() == [[0, 0, 2, 2, 0, 0, 0, 0], [1, 1, 3, 3, 1, 1, 1, 1]]
    assert rows.tolist() == [[1, 1, 8, 8, 0, 0, 0, 0], [4, 4, 11, 11, 3, 3, 3, 3]]


def test_patchify_order_and_round_trip():
    video = torch.randn(2, 3, 2, 4, 6)
    tokens = patchify_video(video, (1, 2, 2))
    assert tokens.shape == (2, 2 * 2 * 3, 12)
    # token (t=1, h=1, w=2), features ordered (c, ph, pw)
    assert torch.equal(tokens[0, 1 * 6 + 1 * 3 + 2], video[0, :, 1, 2:4, 4:6].reshape(-1))
    assert torch.equal(unpatchify_video(tokens, (3, 2, 4, 6), (1, 2, 2)), video)


# -- forward ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_shapes_and_dtypes(dtype):
    config = MiniMaxH3Config.tiny()
    model = build_random_minimax_h3_dit(config, seed=0, dtype=dtype)
    inputs = _inputs(config, batch=2)
    video, audio = _run(model, inputs)
    assert video.shape == inputs[0].shape and audio.shape == inputs[1].shape
    assert video.dtype == audio.dtype == torch.float32
    assert torch.isfinite(video).all() and torch.isfinite(audio).all()
    for name, p in model.named_parameters():
        assert p.dtype == (torch.float32 if name in FP32_PARAMETER_NAMES else dtype), name
    # Batch items are independent: item 1 alone gives the same result.
    single = _run(model, tuple(x[1:] for x in inputs))
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    assert torch.allclose(single[0], video[1:], atol=tol) and torch.allclose(single[1], audio[1:], atol=tol)


def test_inputs_are_validated(model):
    video, audio, text, tv, ta = _inputs(model.config)
    with pytest.raises(ValueError, match="video must be"):
        model(video[:, :4], audio, text, tv, ta)
    with pytest.raises(ValueError, match=r"timesteps must lie in \[0, 1000\]"):
        model(video, audio, text, tv, ta + 2000)


def test_rope_rotates_only_the_leading_channels(model, monkeypatch):
    config = model.config
    rot = config.rotary_dim  # 12 of 16 here; 96 of 128 in the release
    seen = []
    monkeypatch.setattr(
        attention_module, "attend_documents", lambda q, k, v, docs, impl: seen.append((q, k)) or v.contiguous()
    )
    attn = model.blocks[0].attn
    x = torch.randn(1, 10, config.hidden_size)
    positions = torch.rand(10, 3) * 20
    with torch.no_grad():
        for pos in (positions, positions + torch.tensor([3.0, 1.5, -2.0])):
            attn(x, AttentionContext(rope=model.rope(pos)))
    (q0, k0), (q1, k1) = seen
    for a, b in ((q0, q1), (k0, k1)):
        assert torch.equal(a[..., rot:], b[..., rot:])  # pass-through channels: position-independent
        assert (a[..., :rot] - b[..., :rot]).abs().amax(dim=(0, 1, 2)).min() > 1e-4  # every rotary channel moves
    # Angle layout: [t freqs | h freqs | w freqs] twice; a pure time offset touches only t's channels.
    n = config.rope_inv_freq_len
    cos, _ = model.rope(torch.tensor([[5.0, 0.0, 0.0]]))
    moved = (cos[0] != 1).nonzero().flatten().tolist()
    assert moved == list(range(n)) + list(range(3 * n, 4 * n))


def _perturb_last_block_mlp_modulation(model, modality):
    """Shift the last block's MLP shift/scale/gate of one modality (0 video, 1 text, 2 audio)."""
    hidden = model.config.hidden_size
    linear = model.blocks[-1].adaln_proj.linear
    rows = slice(modality * 6 * hidden + 3 * hidden, (modality + 1) * 6 * hidden)
    with torch.no_grad():
        linear.weight[rows] += 0.5
        linear.bias[rows] += 0.5


@pytest.mark.parametrize("modality,changes", [(0, "video"), (1, None), (2, "audio")], ids=["video", "text", "audio"])
def test_adaln_modulates_each_modality_with_its_own_rows(modality, changes):
    # The last block's MLP half and the final layer act per token, so a modality's MLP modulation reaches only that
    # modality's outputs: text's reaches neither output, video's only video, audio's only audio.
    config = MiniMaxH3Config.tiny()
    base = build_random_minimax_h3_dit(config, seed=1)
    perturbed = build_random_minimax_h3_dit(config, seed=1)
    _perturb_last_block_mlp_modulation(perturbed, modality)
    inputs = _inputs(config)
    (v0, a0), (v1, a1) = _run(base, inputs), _run(perturbed, inputs)
    assert torch.equal(v0, v1) == (changes != "video")
    assert torch.equal(a0, a1) == (changes != "audio")


def test_padding_never_reaches_valid_rows(model):
    inputs = _inputs(model.config)
    reference = _run(model, inputs)
    for alignment in (1, 100):  # no padding, and 77 padding rows instead of 41
        model.sequence_alignment = alignment
        try:
            out = _run(model, inputs)
        finally:
            model.sequence_alignment = 64
        for a, b in zip(reference, out):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)

    def scramble_padding(hidden, run_blocks, tags):
        hidden = hidden.clone()
        hidden[:, tags == TAG_PAD] = 1e3 * torch.randn_like(hidden[:, tags == TAG_PAD])
        return run_blocks(hidden)

    for a, b in zip(reference, _run(model, inputs, block_hook=scramble_padding)):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_block_hook_sees_the_stack_input_and_its_result_is_used(model):
    inputs = _inputs(model.config, batch=2)
    seen = {}

    def observe(hidden, run_blocks, tags):
        seen.update(shape=tuple(hidden.shape), tags=tags.tolist())
        return run_blocks(hidden)

    reference = _run(model, inputs)
    observed = _run(model, inputs, block_hook=observe)
    assert all(torch.equal(a, b) for a, b in zip(reference, observed))
    assert seen["shape"] == (2, 64, model.config.hidden_size)
    counts = {tag: seen["tags"].count(tag) for tag in (TAG_TEXT, TAG_AUDIO, TAG_VIDEO, TAG_PAD)}
    assert counts == {TAG_TEXT: TEXT_ROWS, TAG_AUDIO: AUDIO_ROWS, TAG_VIDEO: 12, TAG_PAD: 64 - 23}

    skipped = _run(model, inputs, block_hook=lambda hidden, run_blocks, tags: hidden)
    assert not torch.allclose(skipped[0], reference[0])
