"""Our LingBot-World v2 DiT against other people's implementations (CPU, tiny random weights, fp32).

* The Wan part (camera off, empty session: queries and keys are the chunk itself) against diffusers'
  ``WanTransformer3DModel``, our weights moved into it by diffusers' own Wan converter
  (``convert_wan_transformer_to_diffusers``).
* The camera path against the public reference's formulas (LingBot's ``WanModelFast``, as the model README records
  them), written out below on diffusers' Wan modules, so attention, RoPE and norms are diffusers' and only the camera
  lines are ours to transcribe.
* Checkpoints written from the *reference* model's tensors (diffusers' Wan model with redrawn random weights, plus
  camera tensors): in the original layout under the names diffusers' converter maps onto them, in the layout the
  ``...-diffusers`` LingBot release uses (diffusers config keys, original tensor names), and as diffusers' own
  ``save_pretrained`` writes it. Each must load into our model and compute what the reference computes.

Tolerance. Both sides compute in fp32 (u = 2**-24) through the same operations in other orders (fused vs separate
linears, another RMSNorm, RoPE tables built otherwise): measured 1.1e-6 relative (about 18u) on AVX-512, AVX2 and
portable kernels, for 2 layers, dot products of at most 128 terms and softmax over at most 12 keys. The bound 1024u =
6.1e-5 leaves a 50x margin; every negative control below (a convention error of the kind the comparison exists to
catch) lands at 0.05 or more, over 800x above it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from diffusers import WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import save_file

from telefuser.models.checkpoint_io import random_tensor
from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit, load_lingbot_dit
from tests.numerics import UNIT_ROUNDOFF, relative_error

pytestmark = pytest.mark.numerics

CONFIG = LingBotWorldV2Config.tiny()  # 4 heads x 16, 2 layers, FFN 128, text_len 8
FRAMES, HEIGHT, WIDTH = 3, 4, 6  # latent grid: 3 frames of 2 x 3 tokens
TOKENS_PER_FRAME = (HEIGHT // 2) * (WIDTH // 2)
TEXT_ROWS = 5  # zero-padded to text_len rows, all of them attended (as released)
BOUND = 1024 * UNIT_ROUNDOFF[torch.float32]
FAR = 800 * BOUND  # where a convention error must land
CAMERA_MARKERS = ("patch_embedding_wancamctrl.", "c2ws_hidden_states_layer", ".cam_")


def is_camera(name: str) -> bool:
    return any(marker in name for marker in CAMERA_MARKERS)


def diffusers_wan(config: LingBotWorldV2Config) -> WanTransformer3DModel:
    """diffusers' Wan transformer at our dimensions (the key mapping written out here, not taken from our loader)."""
    return WanTransformer3DModel(
        patch_size=config.patch_size,
        num_attention_heads=config.num_heads,
        attention_head_dim=config.head_dim,
        in_channels=config.in_dim,
        out_channels=config.out_dim,
        text_dim=config.text_dim,
        freq_dim=config.freq_dim,
        ffn_dim=config.ffn_dim,
        num_layers=config.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=config.eps,
        image_dim=None,
        added_kv_proj_dim=None,
    ).eval()


# -- the public formulas ----------------------------------------------------------------------------------------------
def reference_forward(
    wan, camera_weights, latents, t, text, camera=None, *, inject_after_cross_attention=False, injector_residual=True
):
    """LingBot-World v2's DiT on an empty cache, per the public formulas, on diffusers' Wan modules.

    Model level: ``cam = P(f) + L2(silu(L1(P(f))))`` with P = patch_embedding_wancamctrl (a linear on the token's
    6*64*4 ray features), L1/L2 = c2ws_hidden_states_layer1/2. Per block, after the gated self-attention residual and
    before cross-attention: ``c = I2(silu(I1(cam))) + cam`` (I = cam_injector_layer1/2), then
    ``x = (1 + S(c)) * x + T(c)`` (S = cam_scale_layer, T = cam_shift_layer). The rest is Wan's block: diffusers'
    ``norm2`` is the affine cross-attention norm (the release's ``norm3``), ``norm3`` the FFN's."""
    b, _, f, h, w = latents.shape
    p_t, p_h, p_w = wan.config.patch_size
    rotary = wan.rope(latents)
    x = wan.patch_embedding(latents).flatten(2).transpose(1, 2)
    temb, timestep_proj, context, _ = wan.condition_embedder(t, text, None)
    timestep_proj = timestep_proj.unflatten(1, (6, -1))

    def linear(name, v):
        return F.linear(v, camera_weights[f"{name}.weight"], camera_weights[f"{name}.bias"])

    if camera is not None:
        cam = linear("patch_embedding_wancamctrl", camera)
        cam = cam + linear("c2ws_hidden_states_layer2", F.silu(linear("c2ws_hidden_states_layer1", cam)))

    def inject(i, x):
        if camera is None:
            return x
        c = linear(f"blocks.{i}.cam_injector_layer2", F.silu(linear(f"blocks.{i}.cam_injector_layer1", cam)))
        c = c + cam if injector_residual else c
        return (1 + linear(f"blocks.{i}.cam_scale_layer", c)) * x + linear(f"blocks.{i}.cam_shift_layer", c)

    for i, block in enumerate(wan.blocks):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            block.scale_shift_table + timestep_proj
        ).chunk(6, dim=1)
        x = x + block.attn1(block.norm1(x) * (1 + scale_msa) + shift_msa, None, None, rotary) * gate_msa
        x = x if inject_after_cross_attention else inject(i, x)
        x = x + block.attn2(block.norm2(x), context, None, None)
        x = inject(i, x) if inject_after_cross_attention else x
        x = x + block.ffn(block.norm3(x) * (1 + scale_mlp) + shift_mlp) * gate_mlp
    shift, scale = (wan.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
    x = wan.proj_out(wan.norm_out(x) * (1 + scale) + shift)
    x = x.reshape(b, f // p_t, h // p_h, w // p_w, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, -1, f, h, w)


# -- fixtures ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(3)
    latents = torch.randn(1, CONFIG.in_dim, FRAMES, HEIGHT, WIDTH, generator=g)
    text = torch.randn(1, TEXT_ROWS, CONFIG.text_dim, generator=g)
    camera = torch.randn(1, FRAMES * TOKENS_PER_FRAME, CONFIG.camera_feature_dim, generator=g)
    return {
        "latents": latents,
        "t": torch.tensor([637.0]),
        "text": text,
        "camera": camera,
        "padded_text": F.pad(text, (0, 0, 0, CONFIG.text_len - TEXT_ROWS)),
    }  # to the tiny config's text_len


@pytest.fixture(scope="module")
def ours():
    return build_random_lingbot_dit(CONFIG, seed=1)


@pytest.fixture(scope="module")
def wan_from_ours(ours):
    """diffusers' Wan model holding our weights, moved there by diffusers' Wan converter (strict: every tensor)."""
    wan = diffusers_wan(CONFIG)
    state = {k: v.clone() for k, v in ours.state_dict().items() if not is_camera(k)}
    wan.load_state_dict(convert_wan_transformer_to_diffusers(state), strict=True)
    return wan


@pytest.fixture(scope="module")
def reference(ours):
    """The reference model with its own weights: diffusers' Wan model, every parameter redrawn (seeded; diffusers'
    init leaves norms at exactly 1 and 0, which would hide a swapped norm), and camera tensors beside it."""
    wan = diffusers_wan(CONFIG)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, param in wan.named_parameters():
            param.copy_(random_tensor(name, param, g))
    camera = {k: random_tensor(k, v, g) for k, v in ours.state_dict().items() if is_camera(k)}
    return wan, camera


def original_names(wan_state: dict, candidates) -> dict[str, str]:
    """diffusers name -> original name, as diffusers' converter maps the original names (the released ones, which are
    our model's) onto diffusers'. Every reference tensor must get exactly one name."""
    converted = convert_wan_transformer_to_diffusers({name: name for name in candidates if not is_camera(name)})
    assert set(converted) == set(wan_state), sorted(set(converted) ^ set(wan_state))
    return converted


def run_ours(model, inputs, camera: bool):
    session = model.new_window(1, inputs["text"], tokens_per_frame=TOKENS_PER_FRAME)
    try:
        return model.forward_chunk(
            session, inputs["latents"], inputs["t"], inputs["camera"] if camera else None, update_cache=False
        )
    finally:
        session.close()


@torch.no_grad()
def run_reference(reference, inputs, camera: bool, text_len: int = CONFIG.text_len):
    """The reference on the prompt zero-padded to `text_len` rows, as diffusers' Wan pipeline and the release pad it."""
    wan, camera_weights = reference
    text = F.pad(inputs["text"], (0, 0, 0, text_len - TEXT_ROWS))
    if not camera:  # diffusers' own forward
        return wan(inputs["latents"], inputs["t"], text, return_dict=False)[0]
    return reference_forward(wan, camera_weights, inputs["latents"], inputs["t"], text, inputs["camera"])


# -- the DiT and the camera path --------------------------------------------------------------------------------------
def test_the_dit_matches_diffusers_wan_with_the_camera_off(ours, wan_from_ours, inputs):
    expected = run_reference((wan_from_ours, None), inputs, camera=False)
    assert relative_error(run_ours(ours, inputs, camera=False), expected) <= BOUND
    with torch.no_grad():  # negative controls: the two conventions a port gets wrong most easily
        unpadded = wan_from_ours(inputs["latents"], inputs["t"], inputs["text"], return_dict=False)[0]
        rescaled = wan_from_ours(inputs["latents"], inputs["t"] / 1000, inputs["padded_text"], return_dict=False)[0]
    assert relative_error(unpadded, expected) > FAR  # the padding rows are attended (measured 0.16)
    assert relative_error(rescaled, expected) > FAR  # the raw timestep in [0, 1000] (measured 0.47)


def test_the_reference_formulas_are_diffusers_wan_without_a_camera(reference, inputs):
    """The transcription above computes what diffusers' own forward computes when no camera is given."""
    wan, camera_weights = reference
    with torch.no_grad():
        written_out = reference_forward(wan, camera_weights, inputs["latents"], inputs["t"], inputs["padded_text"])
    assert relative_error(written_out, run_reference(reference, inputs, camera=False)) <= BOUND


def test_the_camera_path_matches_the_public_formulas(ours, wan_from_ours, inputs):
    camera_weights = {k: v for k, v in ours.state_dict().items() if is_camera(k)}
    expected = run_reference((wan_from_ours, camera_weights), inputs, camera=True)
    assert relative_error(run_ours(ours, inputs, camera=True), expected) <= BOUND
    assert relative_error(run_reference((wan_from_ours, None), inputs, camera=False), expected) > FAR  # it matters
    args = (wan_from_ours, camera_weights, inputs["latents"], inputs["t"], inputs["padded_text"], inputs["camera"])
    with torch.no_grad():  # negative controls: the injection placed after cross-attention; the injector's residual
        late = reference_forward(*args, inject_after_cross_attention=True)
        no_residual = reference_forward(*args, injector_residual=False)
    assert relative_error(late, expected) > FAR
    assert relative_error(no_residual, expected) > FAR


# -- checkpoints written from the reference model ---------------------------------------------------------------------
def write_shards(tensors: dict, weights: Path, shards: int = 2) -> None:
    weights.mkdir(parents=True, exist_ok=True)
    keys, weight_map = sorted(tensors), {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k].contiguous() for k in keys[i::shards]}, str(weights / name))
        weight_map.update({k: name for k in keys[i::shards]})
    (weights / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def reference_in_original_names(reference, ours) -> dict:
    wan, camera = reference
    state = wan.state_dict()
    names = original_names(state, ours.state_dict())
    return {**{names[k]: v.detach().clone() for k, v in state.items()}, **camera}


def original_config(config: LingBotWorldV2Config) -> dict:
    """The original layout's config.json (the `WanModelFast` constructor arguments), as released: training window."""
    payload = {"_class_name": "WanModelFast", **config.to_dict(), "local_attn_size": -1, "sink_size": 0}
    for runtime_only in ("control_type", "rope_theta"):
        payload.pop(runtime_only)
    return payload


def release_diffusers_config(wan: WanTransformer3DModel) -> dict:
    """The diffusers-keyed config of the ``...-diffusers`` LingBot v2 release (vLLM-Omni's checkpoint contract): Wan's
    diffusers keys plus the causal window the release streams with."""
    payload = {k: v for k, v in wan.config.items() if not k.startswith("_")}
    return {
        "_class_name": "CausalLingBotWorldTransformer3DModel",
        **payload,
        "patch_size": list(payload["patch_size"]),
        "sink_size": 9,
        "num_frames_per_block": 3,
        "sliding_window_num_frames": 18,
        "local_attn_size": -1,
    }


def check_loaded(path, reference, inputs, ours_names, *, text_len=CONFIG.text_len):
    """Loads `path` and checks it computes what the reference computes, camera off and on. A diffusers config has no
    text_len: the model then attends 512 prompt rows, the release's length, and so must the reference."""
    model = load_lingbot_dit(path, device="cpu", dtype=torch.float32, local_attn_size=4, sink_size=1)
    assert set(model.state_dict()) == set(ours_names)
    assert model.config.text_len == text_len
    for camera in (False, True):
        expected = run_reference(reference, inputs, camera=camera, text_len=text_len)
        assert relative_error(run_ours(model, inputs, camera=camera), expected) <= BOUND, camera
    return model


def test_an_original_layout_checkpoint_written_from_the_reference_loads_faithfully(reference, ours, inputs, tmp_path):
    tensors = reference_in_original_names(reference, ours)
    write_shards(tensors, tmp_path / "transformers")
    (tmp_path / "config.json").write_text(json.dumps(original_config(CONFIG)))
    model = check_loaded(tmp_path, reference, inputs, tensors)
    assert torch.equal(model.blocks[1].norm3.weight, reference[0].blocks[1].norm2.weight)  # the norm2/norm3 swap
    # negative control: a name mix-up of the kind a hand-written map makes, self-attention's q and k exchanged
    swapped = dict(tensors)
    for i in range(CONFIG.num_layers):
        for part in ("weight", "bias"):
            q, k = f"blocks.{i}.self_attn.q.{part}", f"blocks.{i}.self_attn.k.{part}"
            swapped[q], swapped[k] = tensors[k], tensors[q]
    write_shards(swapped, tmp_path / "wrong" / "transformers")
    (tmp_path / "wrong" / "config.json").write_text(json.dumps(original_config(CONFIG)))
    wrong = load_lingbot_dit(tmp_path / "wrong", device="cpu", dtype=torch.float32, local_attn_size=4, sink_size=1)
    assert relative_error(run_ours(wrong, inputs, camera=False), run_reference(reference, inputs, False)) > FAR


def test_the_release_diffusers_layout_loads_faithfully_and_names_its_window(reference, ours, inputs, tmp_path, caplog):
    """model_index.json + transformer/{config.json in diffusers keys, shards under the original names}."""
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "LingBotWorldCausalDMDPipeline"}))
    tensors = reference_in_original_names(reference, ours)
    write_shards(tensors, tmp_path / "transformer")
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(release_diffusers_config(reference[0])))
    with caplog.at_level(logging.WARNING, logger="telefuser.models.lingbot_world_v2.checkpoint"):
        check_loaded(tmp_path, reference, inputs, tensors, text_len=512)
    assert "declares a streaming window of 18 frames with 9 sink frames (blocks of 3 frames)" in caplog.text


def test_a_diffusers_save_pretrained_directory_loads_faithfully(reference, ours, inputs, tmp_path):
    """diffusers' own save_pretrained of the reference (its config, its tensor names), the camera tensors beside it."""
    wan, camera = reference
    wan.save_pretrained(tmp_path / "transformer")
    save_file({k: v.contiguous() for k, v in camera.items()}, str(tmp_path / "transformer" / "camera.safetensors"))
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "LingBotWorldCausalDMDPipeline"}))
    model = check_loaded(tmp_path, reference, inputs, ours.state_dict(), text_len=512)
    loaded = model.state_dict()
    for theirs, original in convert_wan_transformer_to_diffusers({k: k for k in loaded if not is_camera(k)}).items():
        assert torch.equal(loaded[original], wan.state_dict()[theirs]), theirs  # weights read back exactly
    for name, value in camera.items():
        assert torch.equal(loaded[name], value), name
