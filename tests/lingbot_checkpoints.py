"""Checkpoint files for the LingBot-World v2 loader tests, in the layouts users have."""

from __future__ import annotations

from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config


def diffusers_transformer_config(config: LingBotWorldV2Config, **overrides) -> dict:
    """A diffusers `WanTransformer3DModel` config.json for `config`, with `overrides` on top."""
    payload = {
        "_class_name": "WanTransformer3DModel",
        "patch_size": list(config.patch_size),
        "num_attention_heads": config.num_heads,
        "attention_head_dim": config.head_dim,
        "in_channels": config.in_dim,
        "out_channels": config.out_dim,
        "text_dim": config.text_dim,
        "freq_dim": config.freq_dim,
        "ffn_dim": config.ffn_dim,
        "num_layers": config.num_layers,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": config.eps,
        "image_dim": None,
        "added_kv_proj_dim": None,
        "rope_max_seq_len": 1024,
        "pos_embed_seq_len": None,
    }
    return {**payload, **overrides}
