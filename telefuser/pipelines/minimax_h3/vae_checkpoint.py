"""Loading the MiniMax H3 VAEs into diffusers' classes, from the release layout or from a diffusers directory.

The release's video VAE uses its original tensor names, mapped here by the rules of diffusers' conversion script
(which the wheel does not ship); its audio VAE already uses diffusers' names. Both layouts, the map and the
precision rule are in this folder's README.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import torch
from torch import nn

from telefuser.models.checkpoint_io import ShardedCheckpoint, check_keys, finish_loading

# diffusers' audio VAE builds its convolutions with torch.nn.utils.weight_norm, which torch deprecates with a
# FutureWarning on every build: the dependency's warning, nothing a user of this pipeline can act on.
warnings.filterwarnings("ignore", message=r"`torch\.nn\.utils\.weight_norm` is deprecated", category=FutureWarning)

log = logging.getLogger(__name__)

VIDEO_CLASS = "AutoencoderKLMiniMaxH3"
AUDIO_CLASS = "AutoencoderKLMiniMaxH3Audio"

# The released architecture in diffusers' argument names (diffusers' defaults, which are the release's).
OFFICIAL_VIDEO_VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 24,
    "block_out_channels": (128, 256, 256, 512, 512, 1024),
    "layers_per_block": 2,
    "spatial_downsample_factors": (2, 2, 2, 2, 1, 1),
    "temporal_downsample_factors": (1, 2, 2, 1, 1, 1),
    "spatial_padding_mode": "reflect",
    "decoder_num_layers": 36,
    "decoder_num_attention_heads": 32,
    "decoder_attention_head_dim": 64,
    "decoder_rope_theta": 100.0,
    "decoder_rope_dim_ratio": 0.75,
    "clip_length": 17,
    "token_drop": 3,
}
# Switches of the original VAE that diffusers' class hard-codes to the released value: anything else is refused.
_RELEASED_SWITCHES = {
    "use_vit_decoder": True,
    "use_3d_conv": True,
    "causal_encoder": True,
    "use_t_isolated_gn": True,
    "pixel_norm_type": "imagenet",
}
_RELEASED_DECODER_SWITCHES = {
    "norm_type": "rms_norm",
    "qk_norm_type": "rms_norm",
    "qk_norm_affine": False,
    "ffn_activation_fn": "silu",
    "ffn_use_gated": True,
}
# The audio VAE's constructor knobs the reference hard-codes (not in metadata.json).
_AUDIO_FIXED = {
    "num_attention_heads": 8,
    "resblock_kernel_sizes": (3, 7, 11),
    "resblock_dilation_sizes": ((1, 3, 5), (1, 3, 5), (1, 3, 5)),
}
_DROPPED_VIDEO_KEYS = frozenset({"decoder.mask_token"})


class VAECheckpointError(ValueError):
    """A VAE folder that is neither the release layout nor a diffusers directory, or that does not match it."""


def _json(path: Path) -> dict:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VAECheckpointError(f"{path} is missing") from None
    if not isinstance(payload, dict):
        raise VAECheckpointError(f"{path} does not hold a JSON object")
    return payload


def diffusers_class(folder: Path) -> str | None:
    """The ``_class_name`` of a diffusers model folder, or None (the release layout)."""
    config = folder / "config.json"
    if not config.is_file():
        return None
    return _json(config).get("_class_name")


def keeps_fp32(name: str, modules) -> bool:
    """diffusers' rule: a parameter stays float32 when one of its dotted name parts is a pinned module."""
    parts = name.split(".")
    return any(module in parts for module in modules or ())


# -- video: the release's configs ------------------------------------------------------------------------------------
def video_vae_config_from_release(folder: Path) -> tuple[dict, dict, Path]:
    """(diffusers constructor arguments, tiling arguments for ``enable_tiling``, the weights file) of a release
    ``video_vae/`` folder."""
    wrapper = _json(folder / "config.json")
    for key in ("latents_mean", "latents_std"):
        if key not in wrapper:
            raise VAECheckpointError(f"{folder / 'config.json'} does not carry {key}")
    source = folder / str(wrapper.get("source_path", "source"))
    weights = source / str(wrapper.get("source_safetensors_path", "model.safetensors"))
    if not weights.is_file():
        raise VAECheckpointError(f"no video VAE weights at {weights}")
    arch = _json(source / "config.json") if (source / "config.json").is_file() else {}
    config = dict(OFFICIAL_VIDEO_VAE)
    config.update(_video_arch_from_original(arch, source / "config.json"))
    if "vae_clip_length" in wrapper:
        config["clip_length"] = int(wrapper["vae_clip_length"])
    if "vae_token_drop" in wrapper:
        config["token_drop"] = int(wrapper["vae_token_drop"])
    config["latents_mean"] = tuple(float(v) for v in wrapper["latents_mean"])
    config["latents_std"] = tuple(float(v) for v in wrapper["latents_std"])
    if (
        len(config["latents_mean"]) != config["latent_channels"]
        or len(config["latents_std"]) != config["latent_channels"]
    ):
        raise VAECheckpointError(f"{folder / 'config.json'}: latents_mean/std need {config['latent_channels']} values")
    tiling = {}
    if "vae_tile_size" in wrapper:
        tiling["tile_sample_min_height"] = tiling["tile_sample_min_width"] = int(wrapper["vae_tile_size"])
    if "vae_tile_overlap_min" in wrapper:
        overlap = int(wrapper["vae_tile_overlap_min"])
        tiling["tile_sample_min_overlap_height"] = tiling["tile_sample_min_overlap_width"] = overlap
    return config, tiling, weights


def _video_arch_from_original(arch: dict, where: Path) -> dict:
    """diffusers' arguments from the original constructor's names; absent ones keep the released values."""
    bad = {k: arch[k] for k, v in _RELEASED_SWITCHES.items() if k in arch and arch[k] != v}
    vit = arch.get("vit_decoder_kwargs") or {}
    bad.update(
        {f"vit_decoder_kwargs.{k}": vit[k] for k, v in _RELEASED_DECODER_SWITCHES.items() if k in vit and vit[k] != v}
    )
    if bad:
        raise VAECheckpointError(
            f"{where}: {bad} -- diffusers' AutoencoderKLMiniMaxH3 implements only the released variant "
            f"({_RELEASED_SWITCHES}, decoder {_RELEASED_DECODER_SWITCHES})"
        )
    if "embed_dim" in arch and "z_channels" in arch and arch["embed_dim"] != arch["z_channels"]:
        raise VAECheckpointError(f"{where}: embed_dim {arch['embed_dim']} != z_channels {arch['z_channels']}")
    out = {}
    renames = {"in_channels": "in_channels", "out_ch": "out_channels", "z_channels": "latent_channels",
               "num_res_blocks": "layers_per_block", "padding_mode": "spatial_padding_mode"}  # fmt: skip
    out.update({theirs: arch[ours] for ours, theirs in renames.items() if ours in arch})
    if "ch" in arch or "ch_mult" in arch:
        ch = int(arch.get("ch", 128))
        out["block_out_channels"] = tuple(ch * int(m) for m in arch.get("ch_mult", (1, 2, 2, 4, 4, 8)))
    for ours, theirs in (("space_down", "spatial_downsample_factors"), ("time_down", "temporal_downsample_factors")):
        if ours in arch:
            out[theirs] = tuple(int(v) for v in arch[ours])
    for ours, theirs in (("num_layers", "decoder_num_layers"), ("heads", "decoder_num_attention_heads"),
                         ("dim_head", "decoder_attention_head_dim"), ("rope_theta", "decoder_rope_theta"),
                         ("rope_dim_ratio", "decoder_rope_dim_ratio")):  # fmt: skip
        if ours in vit:
            out[theirs] = vit[ours]
    return out


# -- video: the tensor names -----------------------------------------------------------------------------------------
def _rename_video_key(key: str) -> str:
    if key.startswith("encoder.down."):
        level, rest = key[len("encoder.down.") :].split(".", 1)
        rest = rest.replace("block.", "resnets.", 1).replace("nin_shortcut.", "conv_shortcut.", 1)
        rest = rest.replace("downsample.", "downsamplers.0.", 1)
        key = f"encoder.down_blocks.{level}.{rest}"
    for ours, theirs in (
        (".attn.to_out.", ".attn.to_out.0."),
        (".ff.w1.", ".ff.net.0.proj."),
        (".ff.w2.", ".ff.net.2."),
    ):
        key = key.replace(ours, theirs)
    return key.replace("decoder.x_embedder.", "decoder.proj_in.")


def video_vae_state(key: str, tensor: torch.Tensor, heads: int, head_dim: int) -> list[tuple[str, torch.Tensor]]:
    """One original video-VAE tensor -> the diffusers tensor(s) it becomes (none for a dropped training buffer)."""
    if key in _DROPPED_VIDEO_KEYS:
        return []
    if ".attn.to_qkv." in key:
        # per head [q_h; k_h; v_h], like the DiT's release layout
        per_head = tensor.reshape(heads, 3, head_dim, *tensor.shape[1:])
        prefix, suffix = key.split(".attn.to_qkv.")
        return [
            (f"{prefix}.attn.to_{p}.{suffix}", per_head[:, i].reshape(heads * head_dim, *tensor.shape[1:]))
            for i, p in enumerate("qkv")
        ]
    name = _rename_video_key(key)
    if ".ff.w1." in key:
        gate, up = tensor.chunk(2, dim=0)
        return [(name, torch.cat([up, gate]))]  # diffusers' SwiGLU reads [value; gate]
    return [(name, tensor)]


# -- audio: the release's configs ------------------------------------------------------------------------------------
def audio_vae_config_from_release(folder: Path) -> dict:
    """diffusers constructor arguments of a release ``audio_vae/`` folder (metadata.json + config.json)."""
    wrapper = _json(folder / "config.json")
    for key in ("latents_mean", "latents_std"):
        if key not in wrapper:
            raise VAECheckpointError(f"{folder / 'config.json'} does not carry {key}")
    config = dict(_AUDIO_FIXED)
    if (folder / "metadata.json").is_file():
        kwargs = (_json(folder / "metadata.json").get("metadata") or {}).get("kwargs") or {}
        if kwargs.get("decoder_type", "bigvgan") != "bigvgan" or not kwargs.get("attn_proj", True):
            raise VAECheckpointError(
                f"{folder / 'metadata.json'}: only the BigVGAN decoder with the attention projection (the release) is "
                f"implemented by diffusers' {AUDIO_CLASS}"
            )
        for ours, theirs in (("encoder_dim", "encoder_dim"), ("encoder_rates", "encoder_rates"),
                             ("latent_dim", "latent_dim"), ("vae_latent_channels", "latent_channels"),
                             ("decoder_dim", "decoder_dim"), ("decoder_rates", "decoder_rates"),
                             ("sample_rate", "sampling_rate")):  # fmt: skip
            if ours in kwargs:
                config[theirs] = tuple(kwargs[ours]) if isinstance(kwargs[ours], list) else kwargs[ours]
        if "decoder_rates" in config:
            # the reference pairs upsampling rate u with kernel 2u (even u) or 2u - 1 (odd u): 5,5,2.. -> 9,9,4..
            config["decoder_kernel_sizes"] = tuple(2 * r - (r % 2) for r in config["decoder_rates"])
    for ours, theirs in (("latent_channels", "latent_channels"), ("sample_rate", "sampling_rate")):
        if ours in wrapper and theirs in config and wrapper[ours] != config[theirs]:
            raise VAECheckpointError(
                f"{folder}: config.json {ours}={wrapper[ours]} but metadata.json says {config[theirs]}"
            )
        if ours in wrapper:
            config[theirs] = wrapper[ours]
    config["latents_mean"] = [float(v) for v in wrapper["latents_mean"]]
    config["latents_std"] = [float(v) for v in wrapper["latents_std"]]
    return config


# -- building the models ---------------------------------------------------------------------------------------------
def build_empty(cls, config: dict) -> nn.Module:
    from accelerate import init_empty_weights

    with init_empty_weights():  # parameters on meta; buffers (resampling filters) computed on the host
        return cls(**config)


def place(model: nn.Module, *, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Move to `device` with diffusers' mixed precision: pinned modules float32, everything else `dtype`."""
    model.to(device)
    pinned = getattr(model, "_keep_in_fp32_modules", None)
    for name, param in model.named_parameters():
        want = torch.float32 if keeps_fp32(name, pinned) else dtype
        if param.dtype != want:
            param.data = param.data.to(want)
    return model


def _load_release_tensors(model: nn.Module, weights: Path, convert, *, what: str, device, dtype) -> None:
    """Stream the original tensors through `convert(key, tensor) -> [(name, tensor)]` into the meta-built model, one
    at a time onto `device` in diffusers' mixed precision (the host holds one tensor, never the model), strictly:
    every model tensor must come from the file and every file tensor must have a place."""
    expected = model.state_dict()
    pinned = getattr(model, "_keep_in_fp32_modules", None)
    with ShardedCheckpoint([weights]) as checkpoint:
        produced: set[str] = set()
        for key in sorted(checkpoint.keys()):
            for name, tensor in convert(key, checkpoint.read(key)):
                if name not in expected:
                    raise VAECheckpointError(f"{what}: {weights.name} holds {key}, which has no place in {name!r}")
                want = tuple(expected[name].shape)
                if tuple(tensor.shape) != want:
                    raise VAECheckpointError(
                        f"{what}: {key} has shape {tuple(tensor.shape)}, the config expects {want}"
                    )
                target = torch.float32 if keeps_fp32(name, pinned) or not tensor.is_floating_point() else dtype
                tensor = tensor.to(device=device, dtype=target).contiguous()
                model.load_state_dict({name: tensor}, strict=False, assign=True)
                produced.add(name)
    check_keys(set(expected), produced, weights, model_label=what, error=VAECheckpointError)


def load_video_vae(folder: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """``AutoencoderKLMiniMaxH3`` from a release ``video_vae/`` or a diffusers ``vae/`` folder, tiled as released."""
    from diffusers import AutoencoderKLMiniMaxH3

    folder, device = Path(folder), torch.device(device)
    if diffusers_class(folder) == VIDEO_CLASS:
        vae = AutoencoderKLMiniMaxH3.from_pretrained(str(folder), torch_dtype=dtype, local_files_only=True)
        vae = place(vae, device=device, dtype=dtype)
        source = f"diffusers {VIDEO_CLASS} from {folder}"
    else:
        config, tiling, weights = video_vae_config_from_release(folder)
        vae = build_empty(AutoencoderKLMiniMaxH3, config)
        heads, head_dim = config["decoder_num_attention_heads"], config["decoder_attention_head_dim"]
        _load_release_tensors(
            vae,
            weights,
            lambda k, t: video_vae_state(k, t, heads, head_dim),
            what="MiniMax H3 video VAE",
            device=device,
            dtype=dtype,
        )
        vae = place(vae, device=device, dtype=dtype)  # the buffers (rotary tables) follow
        if tiling:
            vae.enable_tiling(**tiling)
        source = f"diffusers {VIDEO_CLASS} from the release {weights}"
    finish_loading(vae, source, error=VAECheckpointError)
    log.info("%s (tiling %s)", source, "on" if vae.use_tiling else "off")
    return vae


def load_audio_vae(folder: str | Path, *, device: str | torch.device = "cpu"):
    """``AutoencoderKLMiniMaxH3Audio`` (float32) from a release or a diffusers ``audio_vae/`` folder."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    folder, device = Path(folder), torch.device(device)
    if diffusers_class(folder) == AUDIO_CLASS:
        vae = AutoencoderKLMiniMaxH3Audio.from_pretrained(str(folder), local_files_only=True)
        source = f"diffusers {AUDIO_CLASS} from {folder}"
    else:
        weights = folder / "model.safetensors"
        if not weights.is_file():
            raise VAECheckpointError(f"no audio VAE weights at {weights}")
        config = audio_vae_config_from_release(folder)
        if math.prod(config.get("decoder_rates", (5, 5, 2, 2, 2, 2, 2))) != 800:
            raise VAECheckpointError(f"{folder}: the audio VAE must hop 800 samples (40 latents/s at 32 kHz)")
        vae = build_empty(AutoencoderKLMiniMaxH3Audio, config)
        _load_release_tensors(
            vae, weights, lambda k, t: [(k, t)], what="MiniMax H3 audio VAE", device=device, dtype=torch.float32
        )
        source = f"diffusers {AUDIO_CLASS} from the release {weights}"
    vae = place(vae, device=device, dtype=torch.float32)
    finish_loading(vae, source, error=VAECheckpointError)
    return vae
