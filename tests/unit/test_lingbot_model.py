"""LingBot-World v2 causal DiT on CPU: config, shapes, the rolling KV window, RoPE offsets, and the chunked forward
against an independent dense computation over all frames with an explicit block-causal (and windowed) mask."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from telefuser.models.lingbot_world_v2 import (
    LingBotConfigError,
    LingBotWorldV2Config,
    WindowError,
    build_random_lingbot_dit,
)
from telefuser.models.wan.checkpoint import keeps_fp32
from telefuser.models.wan.embeddings import patchify, sinusoidal_embedding, unpatchify
from telefuser.models.wan.rope import apply_rope, chunk_rope, rope_axis_pairs

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

GRID_HW = (4, 6)  # latent h, w -> 2 x 3 = 6 tokens per frame
TPF = 6
TOL = 1e-5  # fp32: chunked vs dense differ only in summation order (measured 6.8e-7 and 9.1e-7)


@pytest.fixture(scope="module")
def config():
    return LingBotWorldV2Config.tiny()


@pytest.fixture(scope="module")
def model(config):
    return build_random_lingbot_dit(config, seed=0)


def _text(config, batch=1, rows=5, seed=1):
    return torch.randn(batch, rows, config.text_dim, generator=torch.Generator().manual_seed(seed))


def _chunk(config, frames, seed, batch=1):
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, config.in_dim, frames, *GRID_HW, generator=g)
    camera = torch.randn(batch, frames * TPF, config.camera_feature_dim, generator=g)
    return latents, camera


# -- config ---------------------------------------------------------------------------------------------------------
def test_defaults_are_the_v2_architecture():
    c = LingBotWorldV2Config()
    assert (c.dim, c.num_heads, c.head_dim, c.num_layers, c.ffn_dim) == (5120, 40, 128, 40, 13824)
    assert (c.in_dim, c.out_dim, c.text_dim, c.freq_dim, c.text_len) == (36, 16, 4096, 256, 512)
    assert c.patch_size == (1, 2, 2)
    assert (c.local_attn_size, c.sink_size, c.camera_feature_dim) == (18, 6, 6 * 64 * 4)
    assert rope_axis_pairs(c.head_dim) == (22, 21, 21)


def test_from_json_reads_the_official_keys_and_refuses_an_incomplete_config(tmp_path, config):
    official = {
        "_class_name": "WanModelFast",
        "_diffusers_version": "0.35.1",
        "model_type": "i2v",
        "patch_size": [1, 2, 2],
        "text_len": 512,
        "in_dim": 36,
        "dim": 5120,
        "ffn_dim": 13824,
        "freq_dim": 256,
        "text_dim": 4096,
        "out_dim": 16,
        "num_heads": 40,
        "num_layers": 40,
        "local_attn_size": 18,
        "sink_size": 6,
        "qk_norm": True,
        "cross_attn_norm": True,
        "eps": 1e-6,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(official))
    assert LingBotWorldV2Config.from_json(path) == LingBotWorldV2Config()
    path.write_text(json.dumps({"in_channels": 36, "num_attention_heads": 40, "attention_head_dim": 128}))
    with pytest.raises(LingBotConfigError, match="diffusers-format"):
        LingBotWorldV2Config.from_json(path)
    path.write_text(json.dumps({"dim": 64}))
    with pytest.raises(LingBotConfigError, match="missing required LingBot keys: in_dim, ffn_dim, num_heads"):
        LingBotWorldV2Config.from_json(path)
    with pytest.raises(LingBotConfigError, match="sink_size"):
        LingBotWorldV2Config.tiny(sink_size=4)
    with pytest.raises(LingBotConfigError, match="control_type"):
        LingBotWorldV2Config.tiny(control_type="act")


def test_fp32_policy_names_the_released_fp32_regions(model):
    fp32 = {name for name, _ in model.named_parameters() if keeps_fp32(name)}
    assert "time_projection.1.weight" in fp32 and "head.head.weight" in fp32 and "blocks.1.modulation" in fp32
    assert "blocks.0.self_attn.q.weight" not in fp32 and "patch_embedding.weight" not in fp32


# -- shapes and inputs ----------------------------------------------------------------------------------------------
def test_shapes_dtypes_and_camera_forms(model, config):
    batch = 2
    session = model.new_window(batch, _text(config, batch), tokens_per_frame=TPF)
    latents, camera = _chunk(config, 2, seed=3, batch=batch)
    t = torch.tensor([700.0, 20.0])
    out = model.forward_chunk(session, latents, t, camera, update_cache=False)
    assert out.shape == (batch, config.out_dim, 2, *GRID_HW) and out.dtype == torch.float32
    # The latent-grid form [B, 6*64, F, h, w] gives the same result as its patchified tokens.
    grid = torch.randn(batch, 384, 2, *GRID_HW, generator=torch.Generator().manual_seed(9))
    tokens = patchify(grid, config.patch_size)
    assert tokens.shape == camera.shape
    out_tokens = model.forward_chunk(session, latents, t, tokens, update_cache=False)
    out_grid = model.forward_chunk(session, latents, t, grid, update_cache=False)
    assert torch.equal(out_tokens, out_grid)
    without = model.forward_chunk(session, latents, t, None, update_cache=False)
    assert not torch.allclose(without, out)
    # Batch items are independent.
    single = model.new_window(1, _text(config, batch)[1:], tokens_per_frame=TPF)
    alone = model.forward_chunk(single, latents[1:], t[1:], camera[1:], update_cache=False)
    torch.testing.assert_close(alone, out[1:], rtol=0, atol=1e-5)


def test_bad_inputs_are_refused(model, config):
    session = model.new_window(1, _text(config), tokens_per_frame=TPF)
    latents, camera = _chunk(config, 1, seed=4)
    t = torch.tensor([10.0])
    with pytest.raises(ValueError, match="tokens per frame"):
        model.forward_chunk(session, latents[..., :4], t, None, update_cache=False)
    with pytest.raises(ValueError, match=r"t must lie in \[0, 1000\]"):
        model.forward_chunk(session, latents, torch.tensor([1001.0]), camera, update_cache=False)
    with pytest.raises(ValueError, match="camera must be"):
        model.forward_chunk(session, latents, t, camera[:, :3], update_cache=False)
    with pytest.raises(ValueError, match=r"latents must be \[B=1, 36"):
        model.forward_chunk(session, latents[:, :16], t, camera, update_cache=False)
    too_long, _ = _chunk(config, config.local_attn_size - config.sink_size + 1, seed=5)
    with pytest.raises(WindowError, match="does not fit the window"):
        model.forward_chunk(session, too_long, t, None, update_cache=False)
    with pytest.raises(ValueError, match="more than text_len"):
        model.new_window(1, _text(config, rows=config.text_len + 1), tokens_per_frame=TPF)
    session.close()
    with pytest.raises(WindowError, match="closed"):
        model.forward_chunk(session, latents, t, camera, update_cache=False)


def test_timestep_sinusoid_is_wans():
    t = torch.tensor([0.0, 250.0, 999.0])
    emb = sinusoidal_embedding(8, t)
    freqs = 10000.0 ** (-torch.arange(4, dtype=torch.float64) / 4)
    angles = t.double()[:, None] * freqs
    torch.testing.assert_close(emb, torch.cat([angles.cos(), angles.sin()], 1).float())


# -- the rolling window ---------------------------------------------------------------------------------------------
def _layer_buffers(session):
    return [t for kv in session.layers for t in (kv.k, kv.v)]


def test_cache_rolls_in_place_keeps_the_sink_and_reads_leave_the_kept_rows_untouched(model, config):
    session = model.new_window(1, _text(config), tokens_per_frame=TPF)
    pointers = [t.data_ptr() for t in _layer_buffers(session)]
    assert session.capacity == config.local_attn_size * TPF and session.sink_rows == config.sink_size * TPF
    sink = None
    for index, frames in enumerate([2, 1, 2, 1, 2]):
        latents, camera = _chunk(config, frames, seed=10 + index)
        before = [t.clone() for t in _layer_buffers(session)]
        state = (session.committed, session.frame_offset, session.ring_head)
        plan = session.plan(frames)
        model.forward_chunk(session, latents, torch.tensor([600.0]), camera, update_cache=False)
        untouched = torch.ones(session.capacity, dtype=torch.bool)  # every row but the chunk's own slots
        for row, _, rows in plan.slots:
            untouched[row : row + rows] = False
        assert all(torch.equal(a[:, untouched], b[:, untouched]) for a, b in zip(before, _layer_buffers(session)))
        assert (session.committed, session.frame_offset, session.ring_head) == state
        model.forward_chunk(session, latents, torch.tensor([0.0]), camera, update_cache=True)
        assert [t.data_ptr() for t in _layer_buffers(session)] == pointers  # no reallocation, ever
        if sink is None:
            sink = [t[:, : session.sink_rows].clone() for t in _layer_buffers(session)]
        assert all(torch.equal(s, t[:, : session.sink_rows]) for s, t in zip(sink, _layer_buffers(session)))
    # 8 frames committed into a 4-frame window: it rolled, and stays full.
    assert session.frame_offset == 8 and session.committed == session.capacity


# -- chunked == dense with an explicit mask ---------------------------------------------------------------------------
def _wan_rope_complex(x, frames, h, w, theta=10000.0):
    """Wan's rope_params + causal_rope_apply, written with complex numbers, positions 0..frames-1."""
    d = x.shape[-1]
    c = d // 2

    def table(n, dim):
        return torch.polar(
            torch.ones(n, dim // 2, dtype=torch.float64),
            torch.outer(
                torch.arange(n, dtype=torch.float64),
                1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim),
            ),
        )

    ft, ht, wt = table(frames, 2 * (c - 2 * (c // 3))), table(h, 2 * (c // 3)), table(w, 2 * (c // 3))
    freqs = torch.cat(
        [
            ft[:, None, None].expand(frames, h, w, -1),
            ht[None, :, None].expand(frames, h, w, -1),
            wt[None, None].expand(frames, h, w, -1),
        ],
        dim=-1,
    ).reshape(frames * h * w, 1, -1)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(-2).to(x.dtype)


def _visible(chunk_rows, capacity, sink_rows):
    """Boolean [S, S] mask: chunk i sees the sink, the newest committed rows that fit its window, and itself."""
    total = sum(chunk_rows)
    mask = torch.zeros(total, total, dtype=torch.bool)
    start, committed = 0, 0
    for n in chunk_rows:
        evicted = max(0, committed + n - capacity)
        head = min(sink_rows, committed)
        newest = committed - evicted - head
        rows = slice(start, start + n)
        mask[rows, :head] = True
        mask[rows, start - newest : start] = True
        mask[rows, rows] = True
        committed, start = committed - evicted + n, start + n
    return mask


def _dense_reference(model, text, latents, camera, t, chunk_rows):
    """The whole DiT over all frames at once, written out from its parameters, with an explicit attention mask."""
    cfg, m = model.config, model
    heads, hd = cfg.num_heads, cfg.head_dim
    lin = lambda layer, x: F.linear(x, layer.weight.float(), layer.bias.float())  # noqa: E731
    rms = lambda norm, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * norm.weight  # noqa: E731
    ln = lambda x: F.layer_norm(x, (cfg.dim,), eps=cfg.eps)  # noqa: E731
    b, _, frames, h, w = latents.shape
    hp, wp = h // 2, w // 2
    x = patchify(latents, cfg.patch_size) @ m.patch_embedding.weight.flatten(1).T + m.patch_embedding.bias
    e = lin(m.time_embedding[2], F.silu(lin(m.time_embedding[0], sinusoidal_embedding(cfg.freq_dim, t))))
    e0 = lin(m.time_projection[1], F.silu(e)).view(b, 6, cfg.dim)
    cam = lin(m.patch_embedding_wancamctrl, camera)
    cam = cam + lin(m.c2ws_hidden_states_layer2, F.silu(lin(m.c2ws_hidden_states_layer1, cam)))
    ctx = F.pad(text, (0, 0, 0, cfg.text_len - text.shape[1]))
    ctx = lin(m.text_embedding[2], F.gelu(lin(m.text_embedding[0], ctx), approximate="tanh"))
    mask = _visible(chunk_rows, cfg.local_attn_size * hp * wp, cfg.sink_size * hp * wp)
    split = lambda y: y.view(b, -1, heads, hd)  # noqa: E731
    sdpa = lambda q, k, v, mask=None: (
        F.scaled_dot_product_attention(  # noqa: E731
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
        )
        .transpose(1, 2)
        .flatten(2)
    )
    for blk in m.blocks:
        sm, scm, gm, sf, scf, gf = (blk.modulation + e0[:, None]).unbind(2)
        y = ln(x) * (1 + scm) + sm
        sa = blk.self_attn
        q = _wan_rope_complex(split(rms(sa.norm_q, lin(sa.q, y))), frames, hp, wp)
        k = _wan_rope_complex(split(rms(sa.norm_k, lin(sa.k, y))), frames, hp, wp)
        x = x + lin(sa.o, sdpa(q, k, split(lin(sa.v, y)), mask)) * gm
        c = lin(blk.cam_injector_layer2, F.silu(lin(blk.cam_injector_layer1, cam))) + cam
        x = (1 + lin(blk.cam_scale_layer, c)) * x + lin(blk.cam_shift_layer, c)
        ca = blk.cross_attn
        xn = F.layer_norm(x, (cfg.dim,), blk.norm3.weight, blk.norm3.bias, cfg.eps)
        q = split(rms(ca.norm_q, lin(ca.q, xn)))
        x = x + lin(ca.o, sdpa(q, split(rms(ca.norm_k, lin(ca.k, ctx))), split(lin(ca.v, ctx))))
        x = x + lin(blk.ffn[2], F.gelu(lin(blk.ffn[0], ln(x) * (1 + scf) + sf), approximate="tanh")) * gf
        del sa, ca
    shift, scale = (m.head.modulation + e[:, None]).unbind(1)
    out = lin(m.head.head, ln(x) * (1 + scale[:, None]) + shift[:, None])
    return unpatchify(out, (frames, hp, wp), cfg.patch_size)


@pytest.mark.parametrize("chunk_frames", [[1, 2, 1], [2, 1, 2, 1, 2]], ids=["no-roll", "rolling"])
def test_chunked_generation_equals_dense_masked_attention(model, config, chunk_frames):
    """Each chunk: a read-only step at another t on other latents (must not matter), then the commit at t_ref.
    The commit outputs equal one dense pass over all frames with the block-causal (sink + window) mask."""
    text, t_ref = _text(config), torch.tensor([300.0])
    session = model.new_window(1, text, tokens_per_frame=TPF)
    chunks = [_chunk(config, f, seed=100 + i) for i, f in enumerate(chunk_frames)]
    outputs, rolled = [], False
    for i, (latents, camera) in enumerate(chunks):
        noise, other_cam = _chunk(config, latents.shape[2], seed=200 + i)
        model.forward_chunk(session, noise, torch.tensor([900.0]), other_cam, update_cache=False)
        read_only = model.forward_chunk(session, latents, t_ref, camera, update_cache=False)
        rolled |= session.plan(latents.shape[2]).evicted > 0
        outputs.append(model.forward_chunk(session, latents, t_ref, camera, update_cache=True))
        assert torch.equal(read_only, outputs[-1])  # reading and committing attend to the same keys
    assert rolled == (sum(chunk_frames) > config.local_attn_size)
    dense = _dense_reference(
        model,
        text,
        torch.cat([c[0] for c in chunks], 2),
        torch.cat([c[1] for c in chunks], 1),
        t_ref,
        [f * TPF for f in chunk_frames],
    )
    chunked = torch.cat(outputs, dim=2)
    err = ((chunked - dense).abs().max() / dense.abs().max()).item()
    assert err < TOL, err


# -- RoPE -------------------------------------------------------------------------------------------------------------
def test_rope_offset_rows_equal_the_dense_positions_and_the_complex_convention():
    head_dim, frames, h, w = 16, 3, 2, 3
    cos_all, sin_all = chunk_rope(0, 5 + frames, h, w, head_dim)
    cos, sin = chunk_rope(5, frames, h, w, head_dim)
    # The same float64 angles, but cos/sin over tensors of other lengths may take other vector paths (one float64
    # ulp apart), which the float32 result hides except on a rounding tie: allow one float32 ulp of a value <= 1.
    for offset, dense in ((cos, cos_all), (sin, sin_all)):
        torch.testing.assert_close(offset, dense[5 * h * w :], rtol=0, atol=2.0**-24)
    x = torch.randn(1, (5 + frames) * h * w, 2, head_dim, dtype=torch.float64)
    ours = apply_rope(x, cos_all, sin_all)
    torch.testing.assert_close(ours, _wan_rope_complex(x, 5 + frames, h, w), rtol=0, atol=1e-6)


def test_frame_offset_changes_the_chunk_relative_to_the_cache(model, config):
    """Within one chunk RoPE is relative (an offset alone changes nothing); against cached keys it matters."""
    text = _text(config)
    first, second = _chunk(config, 1, seed=7), _chunk(config, 1, seed=8)
    t = torch.tensor([400.0])

    def second_chunk_output(offset_after_first):
        session = model.new_window(1, text, tokens_per_frame=TPF)
        model.forward_chunk(session, *first[:1], t, first[1], update_cache=True)
        session.frame_offset = offset_after_first
        return model.forward_chunk(session, second[0], t, second[1], update_cache=False)

    right, collided = second_chunk_output(1), second_chunk_output(0)
    assert (right - collided).abs().max() > 1e-3
    fresh = model.new_window(1, text, tokens_per_frame=TPF)
    alone = model.forward_chunk(fresh, second[0], t, second[1], update_cache=False)
    fresh.frame_offset = 9
    shifted = model.forward_chunk(fresh, second[0], t, second[1], update_cache=False)
    torch.testing.assert_close(alone, shifted, rtol=0, atol=1e-4)
