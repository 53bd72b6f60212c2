"""A LingBot-World v2 checkpoint in the diffusers layout (model_index.json, vae/, text_encoder/, tokenizer/,
transformer/) builds the whole pipeline: each part is written by its own library's save_pretrained (the DiT as the
release ships it: original tensor names under a diffusers config) and read back exactly, and a session runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit
from telefuser.pipelines.lingbot_world_v2 import build_lingbot_pipeline, resolve_checkpoint
from telefuser.pipelines.wan.text_encoder import build_umt5_encoder, tiny_umt5_config
from telefuser.pipelines.wan.vae import WanVideoVAE
from telefuser.runtime import Runtime
from tests.lingbot_checkpoints import diffusers_transformer_config

TOKENIZER = Path(__file__).resolve().parents[2] / "tools" / "aiperf" / "fixtures" / "tokenizer"
CONFIG = LingBotWorldV2Config.tiny_session()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("lingbot_diffusers")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "LingBotWorldPipeline"}))
    vae = WanVideoVAE.random("tiny", seed=3).model
    vae.save_pretrained(str(root / "vae"))
    encoder = build_umt5_encoder(tiny_umt5_config(CONFIG.text_dim), seed=4)
    encoder.save_pretrained(str(root / "text_encoder"))
    shutil.copytree(TOKENIZER, root / "tokenizer")
    dit = build_random_lingbot_dit(CONFIG, seed=5)
    (root / "transformer").mkdir()
    save_file(
        {k: v.contiguous() for k, v in dit.state_dict().items()},
        str(root / "transformer" / "diffusion_pytorch_model.safetensors"),
    )
    (root / "transformer" / "config.json").write_text(
        json.dumps(
            diffusers_transformer_config(CONFIG, local_attn_size=CONFIG.local_attn_size, sink_size=CONFIG.sink_size)
        )
    )
    return root, {"vae": vae.state_dict(), "text_encoder": encoder.state_dict(), "dit": dit.state_dict()}


def _equal_states(got: dict, expected: dict) -> bool:
    return got.keys() == expected.keys() and all(torch.equal(got[k].float(), v.float()) for k, v in expected.items())


def test_every_part_loads_from_its_folder_and_a_session_runs(checkpoint):
    root, states = checkpoint
    paths = resolve_checkpoint(root)
    assert {k: p.name for k, p in paths.items()} == {
        "vae": "vae",
        "text_encoder": "text_encoder",
        "tokenizer": "tokenizer",
        "dit": "transformer",
    }
    pipe = build_lingbot_pipeline(checkpoint=root, runtime=Runtime.one_rank("cpu", torch.float32))
    assert _equal_states(pipe.vae.model.state_dict(), states["vae"])
    assert _equal_states(pipe.prompt_encoder.encoder.state_dict(), states["text_encoder"])
    assert _equal_states(pipe.dit.state_dict(), states["dit"])
    assert "diffusers format" in pipe.weights["vae"] and pipe.weights["text_encoder"].endswith("text_encoder")
    assert (pipe.dit.config.local_attn_size, pipe.dit.config.sink_size) == (18, 6)  # the v2 window the loader applies
    image = np.full((48, 64, 3), 90, np.uint8)
    with pipe.start(image, "a road", seed=0, resolution=(64, 48), num_frames=13) as session:
        chunk = session.next_chunk(("w",))
    assert chunk.frames.shape == (13, 48, 64, 3) and chunk.frames.std() > 0


def test_a_missing_part_is_named_before_any_weight_is_read(checkpoint, tmp_path):
    root, _ = checkpoint
    partial = tmp_path / "partial"
    shutil.copytree(root, partial, ignore=shutil.ignore_patterns("text_encoder"))
    with pytest.raises(FileNotFoundError, match=r"not a LingBot-World v2 checkpoint folder; missing: .*text_encoder"):
        build_lingbot_pipeline(checkpoint=partial)
