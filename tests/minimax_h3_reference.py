"""diffusers' MiniMax H3 as the reference for tests: tiny reference models, and checkpoints whose files are written
from them (or whose meaning is defined by diffusers' own converter), never by this repository's loaders.

* the DiT: random tensors under the released names are converted with diffusers'
  ``convert_minimax_h3_transformer_checkpoint_to_diffusers`` into ``MiniMaxH3Transformer3DModel``; the same tensors
  are written as a release ``transformer/`` folder for our loader. A diffusers folder is ``save_pretrained``.
* the video VAE: ``AutoencoderKLMiniMaxH3``'s state dict is written under the original names, tensor by tensor
  (``to_q/to_k/to_v`` interleaved back per head, the SwiGLU halves back to ``[gate; up]``), as the release stores it.
* the audio VAE: its state dict already uses the released names.
* the text encoder: a ``Qwen3VLForConditionalGeneration`` with 51 language layers (diffusers reads hidden state 50),
  saved with ``save_pretrained``; a word-level tokenizer stands in for Qwen's.
* `reference_dit_rows` runs the reference DiT on diffusers' own packing (``build_packed_sequence``,
  ``patchify_video_latents``, ``build_row_timesteps``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from telefuser.models.minimax_h3 import MiniMaxH3Config
from telefuser.models.minimax_h3.dit import MiniMaxH3DiT

PATCH = (1, 2, 2)


# -- random values ---------------------------------------------------------------------------------------------------
def random_like(name: str, shape, generator: torch.Generator) -> torch.Tensor:
    """N(0, 1/fan_in) weights, scales near 1, small biases: O(1) activations through a tiny stack."""
    noise = torch.randn(tuple(shape), generator=generator)
    if name.endswith("bias"):
        return 0.1 * noise
    if len(shape) == 1 or name.endswith("weight_g"):
        return 1.0 + 0.1 * noise
    return noise / math.prod(shape[1:]) ** 0.5


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(random_like(name, param.shape, generator))
    return module.eval()


# -- the DiT -------------------------------------------------------------------------------------------------------
def release_dit_tensors(config: MiniMaxH3Config, seed: int) -> dict[str, torch.Tensor]:
    """Random tensors under the released names and shapes (the names are this model's, by the release's design),
    with the released fp32 buffer."""
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in MiniMaxH3DiT(config).state_dict().items()}
    generator = torch.Generator().manual_seed(seed)
    tensors = {k: random_like(k, s, generator) for k, s in shapes.items() if k != "rope.inv_freq"}
    n = config.rope_inv_freq_len
    tensors["rope.inv_freq"] = 1.0 / config.rope_theta ** (torch.arange(0, 2 * n, 2, dtype=torch.float32) / (2 * n))
    return tensors


def reference_dit_from_release(tensors: dict[str, torch.Tensor], config: MiniMaxH3Config, qkv_layout: str):
    """diffusers' transformer holding `tensors`, read the way diffusers' converter reads a `qkv_layout` file."""
    from diffusers import MiniMaxH3Transformer3DModel
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    arguments = config.to_diffusers_dict()
    model = MiniMaxH3Transformer3DModel(**arguments)
    state = convert_minimax_h3_transformer_checkpoint_to_diffusers(
        {k: v.clone() for k, v in tensors.items()}, arguments, qkv_layout=qkv_layout
    )
    model.load_state_dict(state, strict=True)
    return model.float().eval()


def stacked_release_qkv(model) -> dict[str, torch.Tensor]:
    """The fused QKV tensors of a stacked re-export, under the released names: diffusers reads such a file with
    ``chunk(fused, 3)``, so stacking the reference's to_q/to_k/to_v gives exactly what the file holds."""
    state = model.state_dict()
    out = {}
    for key in (k for k in state if k.endswith(".attn.to_q.weight")):
        prefix = key[: -len("to_q.weight")]
        released = prefix.replace("token_refiner.refiner_blocks.", "token_refiner.blocks.")
        released = released.replace("transformer_blocks.", "blocks.", 1)
        out[released + "qkv_proj.weight"] = torch.cat([state[prefix + f"to_{p}.weight"] for p in "qkv"])
    return out


def write_release_transformer(tensors, config: MiniMaxH3Config, directory: Path, *, shards: int = 2) -> Path:
    """<directory>/{config.json, model-0000i-of-0000N.safetensors, model.safetensors.index.json}, as released."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"_class_name": "MiniMaxH3DiTModel", "_diffusers_version": "0.36.0", **config.to_dict()}
    payload.pop("rope_theta")  # the released config does not carry it
    (directory / "config.json").write_text(json.dumps(payload))
    keys = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i::shards]
        save_file({k: tensors[k].contiguous() for k in part}, str(directory / name))
        weight_map.update({k: name for k in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return directory


def reference_dit_rows(model, video, audio, text, t_video: float, t_audio: float):
    """The reference's velocity rows for one item: (video rows [N, C*4] in diffusers' patch order, audio rows
    [2*Ta, 32] channel-major), with diffusers' packing and row timesteps."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
        patchify_video_latents,
    )

    _, _, frames, height, width = video.shape
    positions, tags, video_rows, audio_rows, text_rows, _, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.ones(text.shape[1], dtype=torch.long), frames, height, width, audio.shape[-1] // 2, PATCH, 2, 2, 0
    )
    timesteps, indices = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        video_rows, audio_rows, 0, 0, text.shape[1], t_video, t_audio, 1.0, 1.0
    )
    with torch.no_grad():
        v, a = model(
            patchify_video_latents(video, PATCH)[None],
            audio[0].t()[None],
            text,
            timesteps,
            indices,
            tags,
            positions.float(),
            video_rows,
            audio_rows,
            text_rows,
            return_dict=False,
        )
    return v[0], a[0]


def our_rows(velocity_video, velocity_audio):
    """Our velocities in the reference's row layout (diffusers' own patchify)."""
    from diffusers.modular_pipelines.minimax_h3.before_denoise import patchify_video_latents

    return patchify_video_latents(velocity_video, PATCH), velocity_audio[0].t()


# -- the VAEs --------------------------------------------------------------------------------------------------------
TINY_VIDEO_ARCH = {  # the original constructor's names (video_vae/source/config.json)
    "in_channels": 3, "out_ch": 3, "ch": 32, "ch_mult": [1, 1, 1, 1], "z_channels": 24, "embed_dim": 24,
    "num_res_blocks": 1, "space_down": [2, 2, 2, 2], "time_down": [1, 2, 2, 1], "padding_mode": "reflect",
    "use_vit_decoder": True, "use_3d_conv": True, "causal_encoder": True, "use_t_isolated_gn": True,
    "pixel_norm_type": "imagenet",
    "vit_decoder_kwargs": {"num_layers": 2, "heads": 2, "dim_head": 24, "rope_theta": 100.0, "rope_dim_ratio": 0.75,
                           "norm_type": "rms_norm", "qk_norm_type": "rms_norm", "qk_norm_affine": False,
                           "ffn_activation_fn": "silu", "ffn_use_gated": True},
}  # fmt: skip
TINY_VIDEO_DIFFUSERS = {  # the same architecture in diffusers' names (what the loader must derive)
    "block_out_channels": (32, 32, 32, 32), "layers_per_block": 1, "spatial_downsample_factors": (2, 2, 2, 2),
    "temporal_downsample_factors": (1, 2, 2, 1), "decoder_num_layers": 2, "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 24,
}  # fmt: skip


def latent_stats(channels: int, seed: int) -> tuple[list[float], list[float]]:
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(channels, generator=g)).tolist(), (1.0 + torch.rand(channels, generator=g)).tolist()


def reference_video_vae(seed: int = 0, **overrides):
    from diffusers import AutoencoderKLMiniMaxH3

    mean, std = latent_stats(24, seed + 1)
    vae = AutoencoderKLMiniMaxH3(**{**TINY_VIDEO_DIFFUSERS, "latents_mean": mean, "latents_std": std, **overrides})
    randomize(vae, seed)
    with torch.no_grad():  # the ViT's residual scales start at zero in diffusers: make the blocks count
        for block in vae.decoder.transformer_blocks:
            block.scale1.fill_(0.5), block.scale2.fill_(0.5)
    return vae


def original_video_vae_state(vae, *, swap_ffn: bool = True, interleave_qkv: bool = True) -> dict[str, torch.Tensor]:
    """`vae`'s state dict under the release's names and layouts, spelled out rule by rule (the two switches exist
    for negative controls: a file that skips one of them)."""
    heads, head_dim = vae.config.decoder_num_attention_heads, vae.config.decoder_attention_head_dim
    state = {k: v.detach().clone() for k, v in vae.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for key in sorted(state):
        value = state[key]
        if ".attn.to_q." in key:
            prefix, suffix = key.split(".attn.to_q.")
            q, k, v = (state[f"{prefix}.attn.to_{p}.{suffix}"] for p in "qkv")
            if interleave_qkv:
                rows = []
                for h in range(heads):
                    rows += [t[h * head_dim : (h + 1) * head_dim] for t in (q, k, v)]
                out[f"{prefix}.attn.to_qkv.{suffix}"] = torch.cat(rows)
            else:
                out[f"{prefix}.attn.to_qkv.{suffix}"] = torch.cat([q, k, v])
            continue
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        name = key
        if name.startswith("encoder.down_blocks."):
            level, rest = name[len("encoder.down_blocks.") :].split(".", 1)
            rest = rest.replace("resnets.", "block.", 1).replace("conv_shortcut.", "nin_shortcut.", 1)
            rest = rest.replace("downsamplers.0.", "downsample.", 1)
            name = f"encoder.down.{level}.{rest}"
        name = name.replace("decoder.proj_in.", "decoder.x_embedder.").replace(".attn.to_out.0.", ".attn.to_out.")
        if ".ff.net.0.proj." in name:
            name = name.replace(".ff.net.0.proj.", ".ff.w1.")
            up, gate = value.chunk(2)
            value = torch.cat([gate, up]) if swap_ffn else value
        name = name.replace(".ff.net.2.", ".ff.w2.")
        out[name] = value
    out["decoder.mask_token"] = torch.zeros(1, 1, vae.config.decoder_num_attention_heads * head_dim)
    return out


def write_release_video_vae(vae, folder: Path, *, arch=TINY_VIDEO_ARCH, tile=None, **layout) -> Path:
    """<folder>/{config.json, source/config.json, source/model.safetensors}: `vae` as the release stores it."""
    (folder / "source").mkdir(parents=True, exist_ok=True)
    wrapper = {
        "latents_mean": list(vae.config.latents_mean), "latents_std": list(vae.config.latents_std),
        "vae_clip_length": vae.config.clip_length, "vae_token_drop": vae.config.token_drop,
        "source_path": "source", "source_safetensors_path": "model.safetensors",
    }  # fmt: skip
    if tile is not None:
        wrapper.update(vae_tile_size=tile[0], vae_tile_overlap_min=tile[1])
    (folder / "config.json").write_text(json.dumps(wrapper))
    (folder / "source" / "config.json").write_text(json.dumps(arch))
    save_file(original_video_vae_state(vae, **layout), str(folder / "source" / "model.safetensors"))
    return folder


TINY_AUDIO_KWARGS = {  # audio_vae/metadata.json "kwargs", the original names
    "encoder_dim": 4, "encoder_rates": [8, 10, 10], "latent_dim": 32, "vae_latent_channels": 32,
    "decoder_dim": 32, "decoder_rates": [8, 10, 10], "sample_rate": 32000, "decoder_type": "bigvgan",
    "attn_proj": True,
}  # fmt: skip


def reference_audio_vae(seed: int = 0):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    mean, std = latent_stats(32, seed + 1)
    kwargs = TINY_AUDIO_KWARGS
    vae = AutoencoderKLMiniMaxH3Audio(
        encoder_dim=kwargs["encoder_dim"],
        encoder_rates=tuple(kwargs["encoder_rates"]),
        latent_dim=kwargs["latent_dim"],
        latent_channels=32,
        num_attention_heads=8,
        decoder_dim=kwargs["decoder_dim"],
        decoder_rates=tuple(kwargs["decoder_rates"]),
        decoder_kernel_sizes=(16, 20, 20),
        latents_mean=mean,
        latents_std=std,
    )
    return randomize(vae, seed)


def write_release_audio_vae(vae, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metadata.json").write_text(json.dumps({"metadata": {"kwargs": TINY_AUDIO_KWARGS}}))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "latent_channels": 32,
                "sample_rate": 32000,
                "latents_mean": list(vae.config.latents_mean),
                "latents_std": list(vae.config.latents_std),
            }
        )
    )
    save_file(
        {k: v.detach().clone().contiguous() for k, v in vae.state_dict().items()}, str(folder / "model.safetensors")
    )
    return folder


# -- text --------------------------------------------------------------------------------------------------------------
WORDS = ("a", "red", "fox", "runs", "through", "snow", "at", "dawn", "the", "sea")


def write_tokenizer(folder: Path):
    """A word-level fast tokenizer saved like a Qwen processor folder's tokenizer files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def reference_text_encoder(text_dim: int, seed: int = 0, layers: int = 51):
    """A tiny ``Qwen3VLForConditionalGeneration`` (diffusers' conditioner class) with `layers` language layers."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from telefuser.pipelines.minimax_h3.text_encoder import tiny_text_config

    torch.manual_seed(seed)
    text = tiny_text_config(hidden_size=text_dim, num_layers=layers, vocab_size=64)
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": text_dim,
              "patch_size": 16, "num_position_embeddings": 16, "deepstack_visual_indexes": []}  # fmt: skip
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text.to_dict(), vision_config=vision))
    return randomize(model, seed)


class TextOnlyProcessor:
    """What diffusers' ``get_qwen3vl_prompt_embeds`` asks of a Qwen3-VL processor for a text-only prompt."""

    def create_mm_token_type_ids(self, token_ids):
        return [[0] * len(ids) for ids in token_ids]
