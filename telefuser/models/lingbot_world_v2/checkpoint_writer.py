"""Writing a LingBot-World v2 DiT in the official layout: ``config.json`` at the root, the weights sharded in
``transformers/`` (``model-0000i-of-0000N.safetensors`` with their index), as the release ships them. What the
conformance suite's round trip writes; `checkpoint.load_lingbot_dit(root)` reads it back bit for bit."""

from __future__ import annotations

from pathlib import Path

from ..wan.checkpoint import write_original_layout
from .checkpoint import WEIGHT_DIR_NAMES
from .dit import LingBotWorldV2DiT

# Fields the released config.json does not carry: the camera control is implied, RoPE's base is Wan's constant.
RUNTIME_ONLY = ("control_type", "rope_theta")


def write_lingbot_checkpoint(model: LingBotWorldV2DiT, root: str | Path) -> Path:
    """`model` (dense) under `root` in the official layout; the config's window is the training one (-1, no sink), as
    released: the loader applies the streaming window. Returns `root`."""
    root = Path(root)
    config = {"_class_name": "WanModelFast", **model.config.to_dict(), "local_attn_size": -1, "sink_size": 0}
    for key in RUNTIME_ONLY:
        config.pop(key)
    write_original_layout(model, root / WEIGHT_DIR_NAMES[0], config, config_dir=root, shard_stem="model", shards=3)
    return root
