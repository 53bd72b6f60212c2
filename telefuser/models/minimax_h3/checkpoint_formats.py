"""The on-disk layouts of the MiniMax H3 transformer, and where each of this model's tensors is read from in them.

The release and its re-exports share names but not the fused QKV row order (interleaved per head or stacked), and
nothing in the tensors tells them apart, so the order must come from the caller, the metadata or the released index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...distributed.tp import Index
from .config import MiniMaxH3Config
from .spec import QKV_LAYOUTS  # declared with the --qkv-layout flag
from .tp import tensor_pieces

QKV_METADATA_KEY = "qkv_layout"
RELEASE_CLASS = "MiniMaxH3DiTModel"
DIFFUSERS_CLASS = "MiniMaxH3Transformer3DModel"
RELEASE_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")

# this model's name fragment -> diffusers' (the inverse of diffusers' converter renames), applied in order
_TO_DIFFUSERS = (
    ("token_refiner.blocks.", "token_refiner.refiner_blocks."),
    ("time_embedder.proj_in.", "time_embedder.linear_1."),
    ("time_embedder.proj_out.", "time_embedder.linear_2."),
    ("video_patch_proj.", "proj_in."),
    ("audio_patch_proj.", "audio_proj_in."),
    ("condition_proj.", "context_embedder."),
    ("final_layer.norm.", "norm_out.norm."),
    ("final_layer.adaln_proj.linear.", "norm_out.linear."),
    ("final_layer.video_out.", "proj_out."),
    ("final_layer.audio_out.", "audio_proj_out."),
    (".attn.q_norm.", ".attn.norm_q."),
    (".attn.k_norm.", ".attn.norm_k."),
    (".attn.out_proj.", ".attn.to_out.0."),
    (".mlp.fc1.", ".ff.net.0.proj."),
    (".mlp.fc2.", ".ff.net.2."),
)


class LayoutError(ValueError):
    """The files do not say (or contradict) how their fused QKV rows are ordered."""


Source = tuple[str, Index | None]  # (checkpoint tensor name, the part of it to read; None = all of it)


@dataclass(frozen=True)
class Recipe:
    """How one model tensor is read: the checkpoint parts, concatenated along dim 0, then `finish` (if any)."""

    parts: list[Source]
    finish: Callable[[torch.Tensor], torch.Tensor] | None = None


def is_qkv(key: str) -> bool:
    return key.endswith(".attn.qkv_proj.weight")


def grouped_qkv_to_fused(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Released rows ``[(q_h, k_h, v_h) for each head h]`` -> this model's ``[Q; K; V]`` rows."""
    return weight.reshape(num_heads, 3, head_dim, -1).transpose(0, 1).reshape(3 * num_heads * head_dim, -1)


def diffusers_name(key: str) -> str:
    if key.startswith("blocks."):
        key = "transformer_blocks." + key[len("blocks.") :]
    for ours, theirs in _TO_DIFFUSERS:
        key = key.replace(ours, theirs)
    return key


# -- which layout ---------------------------------------------------------------------------------------------------
def read_class_name(config_path: Path | None) -> str | None:
    if config_path is None or not config_path.is_file():
        return None
    payload = json.loads(config_path.read_text(encoding="utf-8"))
    return payload.get("_class_name") if isinstance(payload, dict) else None


def is_diffusers_layout(keys: set[str], class_name: str | None) -> bool:
    return class_name == DIFFUSERS_CLASS or "transformer_blocks.0.attn.to_q.weight" in keys


def decide_qkv_layout(
    requested: str | None, metadata: dict[str, str], *, index: Path | None, shards: list[Path], class_name: str | None
) -> tuple[str, str]:
    """(layout, why) for a release-named checkpoint. An explicit `requested` layout or a ``qkv_layout`` metadata
    entry (in a shard's ``__metadata__`` or the index's ``metadata``) decides; failing both, only the released
    sharded layout (a ``MiniMaxH3DiTModel`` config.json and an index over ``model-XXXXX-of-YYYYY.safetensors``
    shards) is taken as interleaved. Anything else is refused: guessing wrong loads without error and gives noise."""
    for value, where in ((requested, "the qkv_layout argument"), (metadata.get(QKV_METADATA_KEY), "the metadata")):
        if value is not None and value not in QKV_LAYOUTS:
            raise LayoutError(f"{where} says qkv_layout={value!r}; expected one of {', '.join(QKV_LAYOUTS)}")
    declared = metadata.get(QKV_METADATA_KEY)
    if requested is not None and declared is not None and requested != declared:
        raise LayoutError(f"qkv_layout={requested!r} was asked for, but the files' metadata says {declared!r}")
    if requested is not None:
        return requested, "given by the caller"
    if declared is not None:
        return declared, f"the files' metadata ({QKV_METADATA_KEY}={declared!r})"
    released = (
        index is not None
        and class_name == RELEASE_CLASS
        and bool(shards)
        and all(RELEASE_SHARD.fullmatch(s.name) for s in shards)
    )
    if released:
        return "interleaved", "the MiniMaxAI release layout (MiniMaxH3DiTModel config and a sharded index)"
    where = shards[0].parent if shards else "the checkpoint"
    raise LayoutError(
        f"cannot tell how the fused QKV rows of {where} are ordered: the MiniMaxAI/MiniMax-H3 shards interleave "
        "q, k, v per head, re-exports (Comfy-Org/MiniMax-H3 single files, GGUFs derived from them) stack [Q; K; V], "
        "and both have the same keys and shapes. Say which: qkv_layout='interleaved' or 'stacked' "
        f'(--qkv-layout), or record it in the files\' metadata ({{"{QKV_METADATA_KEY}": ...}}).'
    )


# -- where each model tensor comes from ------------------------------------------------------------------------------
def _swap_halves(index: Index, rows: int) -> Index:
    """The same rows of the other half of a [2 * rows/2, ...] tensor ([gate; up] <-> [value; gate])."""
    half = rows // 2
    first = index[0]
    shift = half if first.start < half else -half
    return (slice(first.start + shift, first.stop + shift), *index[1:])


@dataclass(frozen=True)
class TransformerLayout:
    """One checkpoint's layout, for one TP rank: `recipe(key, full_shape)` for every model tensor."""

    kind: str  # "release" or "diffusers"
    qkv_layout: str | None  # release only: "interleaved" or "stacked"
    config: MiniMaxH3Config
    tp_rank: int = 0
    tp_size: int = 1

    def recipe(self, key: str, full_shape: tuple[int, ...]) -> Recipe:
        if self.kind == "diffusers":
            return self._diffusers(key, full_shape)
        return self._release(key, full_shape)

    def _pieces(self, key: str, shape: tuple[int, ...]) -> list[Index] | None:
        return tensor_pieces(key, shape, self.tp_rank, self.tp_size)

    def _release(self, key: str, shape: tuple[int, ...]) -> Recipe:
        if is_qkv(key) and self.qkv_layout == "interleaved":
            heads, head_dim = self.config.num_attention_heads, self.config.attention_head_dim
            local = heads // self.tp_size
            # a rank's heads are one contiguous block of interleaved rows
            rows = slice(self.tp_rank * local * 3 * head_dim, (self.tp_rank + 1) * local * 3 * head_dim)
            index = (rows,) if self.tp_size > 1 else None
            return Recipe([(key, index)], finish=lambda t: grouped_qkv_to_fused(t, local, head_dim))
        pieces = self._pieces(key, shape)
        return Recipe([(key, None)] if pieces is None else [(key, p) for p in pieces])

    def _diffusers(self, key: str, shape: tuple[int, ...]) -> Recipe:
        name = diffusers_name(key)
        if is_qkv(key):
            # this rank's heads of each of Q, K and V: the same rows of to_q, to_k and to_v
            rows = shape[0] // 3 // self.tp_size
            local = (slice(self.tp_rank * rows, (self.tp_rank + 1) * rows),) if self.tp_size > 1 else None
            return Recipe([(name.replace("qkv_proj", f"to_{p}"), local) for p in "qkv"])
        if key.endswith(".mlp.fc1.weight"):
            pieces = self._pieces(key, shape) or [(slice(0, shape[0] // 2),), (slice(shape[0] // 2, shape[0]),)]
            return Recipe([(name, _swap_halves(p, shape[0])) for p in pieces])
        pieces = self._pieces(key, shape)
        return Recipe([(name, None)] if pieces is None else [(name, p) for p in pieces])

    def source_shape(self, key: str, full_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The full shape each checkpoint tensor of `key` must have (a third of the rows for diffusers' to_q/k/v)."""
        if self.kind == "diffusers" and is_qkv(key):
            return (full_shape[0] // 3, *full_shape[1:])
        return full_shape
