"""Loading a LingBot-World v2 transformer: the official layout (config.json + transformers/ shards) read back exactly,
and what a diffusers-format directory cannot map refused by name. Faithfulness to diffusers' reference model (files
written from *its* tensors) is in test_lingbot_faithfulness.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import save_file

from telefuser.models.checkpoint_io import RANDOM_WEIGHTS
from telefuser.models.lingbot_world_v2 import (
    CheckpointError,
    LingBotConfigError,
    LingBotWorldV2Config,
    build_random_lingbot_dit,
    load_lingbot_dit,
)
from telefuser.models.wan.checkpoint import keeps_fp32
from tests.lingbot_checkpoints import diffusers_transformer_config
from tests.numerics import UNIT_ROUNDOFF, relative_error

INDEX = "diffusion_pytorch_model.safetensors.index.json"


def write_official_checkpoint(model, root, *, drop=(), extra=None, config_in_weights_dir=False, shards=3) -> Path:
    """<root>/config.json + <root>/transformers/{model-0000N-of-0000M.safetensors, index}, as released."""
    root = Path(root)
    weights = root / "transformers"
    weights.mkdir(parents=True, exist_ok=True)
    payload = {"_class_name": "WanModelFast", "_diffusers_version": "0.35.1", **model.config.to_dict()}
    for runtime_only in ("control_type", "rope_theta"):
        payload.pop(runtime_only)
    payload.update(local_attn_size=-1, sink_size=0)  # the training config; the loader applies the v2 window
    (weights if config_in_weights_dir else root).joinpath("config.json").write_text(json.dumps(payload))
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    for key in drop:
        del tensors[key]
    tensors.update(extra or {})
    keys = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i::shards]
        save_file({k: tensors[k] for k in part}, str(weights / name))
        weight_map.update({k: name for k in part})
    (weights / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weights


@pytest.fixture(scope="module")
def source():
    """Mixed precision as a real load gives it: bf16 blocks, fp32 time embedding, modulation and head."""
    return build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=5, dtype=torch.bfloat16)


def _run(model):
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    session = model.new_window(1, torch.randn(1, 3, cfg.text_dim, generator=g), tokens_per_frame=6)
    latents = torch.randn(1, cfg.in_dim, 2, 4, 6, generator=g)
    camera = torch.randn(1, 12, cfg.camera_feature_dim, generator=g)
    return model.forward_chunk(session, latents, torch.tensor([500.0]), camera, update_cache=True)


def test_weights_read_back_exactly_from_the_root_or_the_weights_dir(source, tmp_path):
    weights = write_official_checkpoint(source, tmp_path)
    expected = source.state_dict()
    for path in (tmp_path, weights):
        model = load_lingbot_dit(path, device="cpu", dtype=torch.bfloat16)
        assert model.weights_source == f"checkpoint {weights}"
        loaded = model.state_dict()
        assert loaded.keys() == expected.keys()
        for key, value in expected.items():
            assert loaded[key].dtype == (torch.float32 if keeps_fp32(key) else torch.bfloat16), key
            assert torch.equal(loaded[key], value), key
        assert (model.config.local_attn_size, model.config.sink_size) == (18, 6)  # the v2 window, not config.json's


# A loaded model computes what its source computes, but not bit for bit: safetensors hands back tensors at other
# addresses and the window override gives the KV buffers other shapes, so the CPU kernels may sum in another order
# (measured 1.5e-7 to 2.4e-7 relative on AVX-512, AVX2 and portable kernels). The bf16 blocks round their outputs
# at u = 2**-8; a bound of 2u allows a flipped rounding. Wrong weights land near 1.5, about 190x above it.
OUTPUT_BOUND = 2 * UNIT_ROUNDOFF[torch.bfloat16]


@pytest.mark.numerics
def test_a_loaded_model_computes_what_its_source_computes(source, tmp_path):
    write_official_checkpoint(source, tmp_path)
    model = load_lingbot_dit(tmp_path, device="cpu", dtype=torch.bfloat16, local_attn_size=4, sink_size=1)
    assert (model.config.local_attn_size, model.config.sink_size) == (4, 1)  # the override wins
    expected = _run(source)
    assert relative_error(_run(model), expected) <= OUTPUT_BOUND
    other = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=6, dtype=torch.bfloat16)
    assert relative_error(_run(other), expected) > 100 * OUTPUT_BOUND  # the negative control: other weights


def test_config_next_to_the_shards_and_a_fp32_load(source, tmp_path):
    write_official_checkpoint(source, tmp_path, config_in_weights_dir=True, shards=1)
    model = load_lingbot_dit(tmp_path, device="cpu", dtype=torch.float32)
    assert model.blocks[0].self_attn.q.weight.dtype == torch.float32
    assert torch.equal(model.blocks[0].self_attn.q.weight, source.blocks[0].self_attn.q.weight.float())


def test_a_seven_channel_control_projection_is_refused(source, tmp_path):
    dim = source.config.dim
    write_official_checkpoint(source, tmp_path, extra={"patch_embedding_wancamctrl.weight": torch.zeros(dim, 7 * 256)})
    with pytest.raises(CheckpointError, match=r"reads 7 control channels \(a 7-channel 'act' checkpoint\).*1536"):
        load_lingbot_dit(tmp_path, device="cpu")


def test_missing_and_unexpected_keys_are_named(source, tmp_path):
    write_official_checkpoint(
        source, tmp_path, drop=["blocks.1.cam_scale_layer.weight"], extra={"blocks.0.img_emb.weight": torch.zeros(2)}
    )
    with pytest.raises(
        CheckpointError,
        match=r"1 missing: blocks.1.cam_scale_layer.weight; "
        r"1 unexpected: blocks.0.img_emb.weight",
    ):
        load_lingbot_dit(tmp_path, device="cpu")


def test_a_config_that_does_not_match_the_weights_is_refused(source, tmp_path):
    weights = write_official_checkpoint(source, tmp_path)
    payload = json.loads((tmp_path / "config.json").read_text())
    payload["in_dim"] = 32
    (tmp_path / "config.json").write_text(json.dumps(payload))
    with pytest.raises(
        CheckpointError,
        match=r"patch_embedding.weight has shape \(64, 36, 1, 2, 2\), the config "
        r"expects \(64, 32, 1, 2, 2\)",
    ):
        load_lingbot_dit(weights, device="cpu")


def test_missing_files_are_refused(source, tmp_path):
    with pytest.raises(CheckpointError, match="no LingBot transformer weights"):
        load_lingbot_dit(tmp_path / "nowhere", device="cpu")
    empty = tmp_path / "no_config"
    write_official_checkpoint(source, empty)
    (empty / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_lingbot_dit(empty, device="cpu")


# -- what a diffusers-format directory cannot map is refused by name ---------------------------------------------------
def _diffusers_names(model) -> dict:
    """Our tensors under diffusers' Wan names (diffusers' converter), the camera layers under their own."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return convert_wan_transformer_to_diffusers(state)


def _write_diffusers_dir(root: Path, tensors: dict, config: dict) -> Path:
    weights = root / "transformer"
    weights.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights / "diffusion_pytorch_model.safetensors"))
    (weights / "config.json").write_text(json.dumps(config))
    (root / "model_index.json").write_text("{}")
    return weights


def test_the_diffusers_config_maps_onto_the_original_keys():
    cfg = LingBotWorldV2Config.tiny()
    mapped = LingBotWorldV2Config.from_dict(diffusers_transformer_config(cfg, out_channels=None))
    assert mapped == LingBotWorldV2Config(
        **{**cfg.to_dict(), "text_len": 512, "local_attn_size": 18, "sink_size": 6, "out_dim": cfg.in_dim}
    )  # out_channels or in_channels
    official = LingBotWorldV2Config.from_dict(diffusers_transformer_config(LingBotWorldV2Config()))
    assert official == LingBotWorldV2Config()


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"image_dim": 1280}, r"image_dim=1280: a CLIP image branch .* LingBot-World v2 has none"),
        ({"added_kv_proj_dim": 64}, r"image key/value projections"),
        ({"pos_embed_seq_len": 514}, r"learned position embedding"),
        ({"qk_norm": "rms_norm"}, r"qk_norm='rms_norm'; LingBot-World v2 normalises Q and K over all heads"),
        ({"dim": 64}, r"mixes diffusers-format keys with original ones \(dim\)"),
    ],
)
def test_a_diffusers_config_that_cannot_map_is_refused(overrides, match):
    with pytest.raises(LingBotConfigError, match=match):
        LingBotWorldV2Config.from_dict(diffusers_transformer_config(LingBotWorldV2Config.tiny(), **overrides))
    with pytest.raises(LingBotConfigError, match="diffusers-format transformer config missing required keys: ffn_dim"):
        LingBotWorldV2Config.from_dict(
            {"in_channels": 36, "num_attention_heads": 4, "attention_head_dim": 16, "num_layers": 2}
        )


def test_a_wan_image_branch_a_camera_less_wan_and_mixed_names_are_refused(source, tmp_path):
    cfg = source.config
    tensors = _diffusers_names(source)
    image = {
        "condition_embedder.image_embedder.norm1.weight": torch.ones(4),
        "blocks.0.attn2.add_k_proj.weight": torch.ones(cfg.dim, 4),
    }
    _write_diffusers_dir(tmp_path / "i2v", {**tensors, **image}, diffusers_transformer_config(cfg))
    with pytest.raises(
        CheckpointError,
        match=r"has a CLIP image branch \(blocks.0.attn2.add_k_proj.weight, "
        r"condition_embedder.image_embedder.norm1.weight\): a Wan 2.1 I2V",
    ):
        load_lingbot_dit(tmp_path / "i2v", device="cpu")
    plain = {k: v for k, v in tensors.items() if "cam" not in k and "c2ws" not in k}
    _write_diffusers_dir(tmp_path / "plain", plain, diffusers_transformer_config(cfg))
    with pytest.raises(CheckpointError, match=r"has no camera layers .*a plain Wan transformer"):
        load_lingbot_dit(tmp_path / "plain", device="cpu")
    mixed = {**tensors, "blocks.0.self_attn.q.weight": torch.ones(cfg.dim, cfg.dim)}
    _write_diffusers_dir(tmp_path / "mixed", mixed, diffusers_transformer_config(cfg))
    with pytest.raises(
        CheckpointError,
        match=r"mixes diffusers' Wan tensor names .* with the original ones "
        r"\(blocks.0.self_attn.q.weight\)",
    ):
        load_lingbot_dit(tmp_path / "mixed", device="cpu")
    write_official_checkpoint(source, tmp_path / "orig", extra={"condition_embedder.time_proj.weight": torch.ones(2)})
    with pytest.raises(CheckpointError, match=r"mixes diffusers' Wan tensor names \(condition_embedder.time_proj"):
        load_lingbot_dit(tmp_path / "orig", device="cpu")


def test_a_diffusers_directory_names_its_missing_and_unknown_tensors(source, tmp_path):
    tensors = _diffusers_names(source)
    del tensors["blocks.1.attn2.norm_k.weight"]
    tensors["blocks.0.cam_plucker_proj.weight"] = torch.ones(2)  # another project's name for a camera layer
    _write_diffusers_dir(tmp_path, tensors, diffusers_transformer_config(source.config))
    with pytest.raises(
        CheckpointError,
        match=r"1 missing: blocks.1.attn2.norm_k.weight; "
        r"1 unexpected: blocks.0.cam_plucker_proj.weight",
    ):
        load_lingbot_dit(tmp_path, device="cpu")


def test_a_bf16_load_of_a_diffusers_directory_keeps_the_fp32_regions(source, tmp_path):
    _write_diffusers_dir(tmp_path, _diffusers_names(source), diffusers_transformer_config(source.config))
    model = load_lingbot_dit(tmp_path, device="cpu", dtype=torch.bfloat16)
    expected = source.state_dict()
    for key, value in model.state_dict().items():
        assert value.dtype == (torch.float32 if keeps_fp32(key) else torch.bfloat16), key
        assert torch.equal(value, expected[key]), key  # the source is bf16/fp32 already: read back exactly


def test_random_weights_say_so(caplog):  # seeded alike on every rank: the conformance suite (tests/conformance)
    with caplog.at_level(logging.WARNING, logger="telefuser.models.lingbot_world_v2.checkpoint"):
        a = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=3)
    assert a.weights_source == RANDOM_WEIGHTS == "random (no checkpoint)"
    assert "random weights" in caplog.text
