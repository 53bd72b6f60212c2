"""Loading a MiniMax H3 transformer written in the released layout (config.json, 2 shards + index, grouped QKV)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from telefuser.models.minimax_h3 import (
    FP32_BUFFER_NAMES,
    FP32_PARAMETER_NAMES,
    RANDOM_WEIGHTS,
    CheckpointError,
    MiniMaxH3Config,
    build_random_minimax_h3_dit,
    fused_qkv_to_grouped,
    grouped_qkv_to_fused,
    load_minimax_h3_dit,
)


def write_release_checkpoint(model, root, *, drop=(), extra=None, with_root=True) -> Path:
    """Write `model` like the release: <root>/transformer/{config.json, model-0000N-of-00002.safetensors, index}."""
    config = model.config
    directory = Path(root) / "transformer" if with_root else Path(root)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"_class_name": "MiniMaxH3DiTModel", "_diffusers_version": "0.36.0", **config.to_dict()}
    payload.pop("rope_theta")  # the released config does not carry it
    (directory / "config.json").write_text(json.dumps(payload))
    tensors = {}
    for key, value in model.state_dict().items():
        if key.endswith(".attn.qkv_proj.weight"):
            value = fused_qkv_to_grouped(value, config.num_attention_heads, config.attention_head_dim)
        tensors[key] = value.detach().clone().contiguous()
    for key in drop:
        del tensors[key]
    tensors.update(extra or {})
    keys = sorted(tensors)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves, start=1):
        name = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(directory / name))
        weight_map.update({k: name for k in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def _inputs(config):
    g = torch.Generator().manual_seed(3)
    video = torch.randn(1, config.latents_dim, 2, 4, 6, generator=g)
    audio = torch.randn(1, config.audio_latents_dim, 6, generator=g)
    text = torch.randn(1, 5, config.text_dim, generator=g)
    return video, audio, text, torch.tensor([700.0]), torch.tensor([300.0])


@pytest.fixture(scope="module")
def source():
    """A mixed-precision random model, as the release stores it: bf16 blocks, fp32 patch/time/head modules."""
    return build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=5, dtype=torch.bfloat16)


def test_qkv_reorder_round_trips_and_groups_per_head():
    heads, d = 3, 2
    fused = torch.arange(3 * heads * d, dtype=torch.float32)[:, None].repeat(1, 4)  # row r holds r
    grouped = fused_qkv_to_grouped(fused, heads, d)
    # Released rows: head 0's q (rows 0,1 of Q), k (rows 6,7), v (rows 12,13), then head 1 ...
    assert grouped[:, 0].tolist()[:6] == [0, 1, 6, 7, 12, 13]
    assert torch.equal(grouped_qkv_to_fused(grouped, heads, d), fused)


def test_load_matches_source_exactly(source, tmp_path):
    write_release_checkpoint(source, tmp_path)
    for path in (tmp_path, tmp_path / "transformer"):  # the release root and the transformer dir both load
        model = load_minimax_h3_dit(path, device="cpu", dtype=torch.bfloat16)
        assert model.weights_source.startswith("checkpoint")
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            fp32 = name in FP32_PARAMETER_NAMES or name in FP32_BUFFER_NAMES
            assert tensor.dtype == (torch.float32 if fp32 else torch.bfloat16), name
            assert not tensor.requires_grad
        with torch.no_grad():
            expected, got = source(*_inputs(source.config)), model(*_inputs(source.config))
        for e, g in zip(expected, got):
            assert g.dtype == torch.float32
            assert torch.equal(e, g)


def test_load_in_another_dtype_keeps_fp32_modules(source, tmp_path):
    write_release_checkpoint(source, tmp_path)
    model = load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.float16)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert {dtypes[n] for n in FP32_PARAMETER_NAMES} == {torch.float32}
    assert {d for n, d in dtypes.items() if n not in FP32_PARAMETER_NAMES} == {torch.float16}


def test_rope_table_may_be_absent(source, tmp_path):
    write_release_checkpoint(source, tmp_path, drop=["rope.inv_freq"])
    model = load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.bfloat16)
    assert torch.equal(model.rope.inv_freq, source.rope.inv_freq)


def test_missing_key_is_named(source, tmp_path):
    write_release_checkpoint(source, tmp_path, drop=["blocks.1.mlp.fc2.weight"])
    with pytest.raises(CheckpointError, match=r"1 missing: blocks\.1\.mlp\.fc2\.weight"):
        load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.bfloat16)


def test_unexpected_key_is_named(source, tmp_path):
    write_release_checkpoint(source, tmp_path, extra={"blocks.0.attn.bogus.weight": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=r"1 unexpected: blocks\.0\.attn\.bogus\.weight"):
        load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.bfloat16)


def test_shape_mismatch_and_missing_files_are_clear(source, tmp_path):
    directory = write_release_checkpoint(source, tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["ffn_hidden_size"] = 96
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="mlp.fc1.weight has shape"):
        load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.bfloat16)
    with pytest.raises(CheckpointError, match="no MiniMax H3 transformer"):
        load_minimax_h3_dit(tmp_path / "nowhere", device="cpu", dtype=torch.bfloat16)


def test_random_builder_says_so_and_is_seeded():
    config = MiniMaxH3Config.tiny()
    a = build_random_minimax_h3_dit(config, seed=7)
    b = build_random_minimax_h3_dit(config, seed=7)
    assert a.weights_source == RANDOM_WEIGHTS == "random (no checkpoint)"
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c = build_random_minimax_h3_dit(config, seed=8)
    assert not torch.equal(a.blocks[0].attn.qkv_proj.weight, c.blocks[0].attn.qkv_proj.weight)
