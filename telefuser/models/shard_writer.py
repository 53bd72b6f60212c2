"""Writing tensors as a sharded safetensors checkpoint with its index, the way the releases ship them: what each
model's checkpoint writer (the conformance suite's round trip) shares."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_shards(
    tensors: dict[str, torch.Tensor], directory: Path, *, stem: str, index_name: str, shards: int = 2
) -> list[Path]:
    """`tensors` (names sorted, dealt round-robin) into ``<stem>-0000i-of-0000N.safetensors`` files in `directory`,
    and ``index_name`` mapping each name to its file; dtypes kept. Returns the shard paths."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map, paths = {}, []
    for i in range(shards):
        path = directory / f"{stem}-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({name: tensors[name].detach().contiguous() for name in part}, str(path))
        weight_map.update(dict.fromkeys(part, path.name))
        paths.append(path)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / index_name).write_text(json.dumps(index, indent=2), encoding="utf-8")
    return paths
