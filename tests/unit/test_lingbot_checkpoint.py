"""Loading a LingBot-World v2 transformer written in the official layout (config.json + transformers/ shards)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from telefuser.models.lingbot_world_v2 import (
    RANDOM_WEIGHTS,
    CheckpointError,
    LingBotWorldV2Config,
    build_random_lingbot_dit,
    keeps_fp32,
    load_lingbot_dit,
)
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
    session = model.new_session(1, torch.randn(1, 3, cfg.text_dim, generator=g), tokens_per_frame=6)
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
    write_official_checkpoint(source, tmp_path, drop=["blocks.1.cam_scale_layer.weight"],
                              extra={"blocks.0.img_emb.weight": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=r"1 missing: blocks.1.cam_scale_layer.weight; "
                                              r"1 unexpected: blocks.0.img_emb.weight"):
        load_lingbot_dit(tmp_path, device="cpu")


def test_a_config_that_does_not_match_the_weights_is_refused(source, tmp_path):
    weights = write_official_checkpoint(source, tmp_path)
    payload = json.loads((tmp_path / "config.json").read_text())
    payload["in_dim"] = 32
    (tmp_path / "config.json").write_text(json.dumps(payload))
    with pytest.raises(CheckpointError, match=r"patch_embedding.weight has shape \(64, 36, 1, 2, 2\), the config "
                                              r"expects \(64, 32, 1, 2, 2\)"):
        load_lingbot_dit(weights, device="cpu")


def test_diffusers_format_and_missing_files_are_refused(source, tmp_path):
    write_official_checkpoint(source, tmp_path, extra={"condition_embedder.time_proj.weight": torch.zeros(2)})
    with pytest.raises(CheckpointError, match="diffusers-format transformer"):
        load_lingbot_dit(tmp_path, device="cpu")
    with pytest.raises(CheckpointError, match="no LingBot transformer weights"):
        load_lingbot_dit(tmp_path / "nowhere", device="cpu")
    empty = tmp_path / "no_config"
    write_official_checkpoint(source, empty)
    (empty / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_lingbot_dit(empty, device="cpu")


def test_random_weights_say_so(caplog):
    with caplog.at_level(logging.WARNING, logger="telefuser.models.lingbot_world_v2.checkpoint"):
        a = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=3)
    b = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=3)
    assert a.weights_source == RANDOM_WEIGHTS == "random (no checkpoint)"
    assert "random weights" in caplog.text
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
