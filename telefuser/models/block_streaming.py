"""`BlockStreaming`: the mixin of a DiT whose `blocks` may live in host memory and stream to the device one at a time
(the block offload tier: `memory.streaming.StreamedLayers`), each finished as it loads."""

from __future__ import annotations

import torch
from torch import nn

from ..memory.host import layer_tensors
from ..memory.host import to_host as host_copy
from ..memory.streaming import StreamedLayers
from ..ops.fp8 import quantize_linears


class BlockStreaming:
    """The model has `blocks` (an ``nn.ModuleList``) and `FP8_LINEARS` (the linears inside a block that FP8 takes),
    and its ``__init__`` sets `block_stream` to None. Every loop over the blocks goes through `_each_block()`."""

    blocks: nn.ModuleList
    FP8_LINEARS: tuple[str, ...]
    block_stream: StreamedLayers | None

    def finish_block(self, index: int, *, quantization: str, to_host: bool) -> None:
        """Block `index` as it will run, done as soon as it is loaded (a loader's `after_block`, see
        `memory.streaming.block_finisher`) so the device never holds two unfinished blocks: its FP8 linears quantized
        on the device it was loaded on, then its tensors moved to host memory when it will stream."""
        block = self.blocks[index]
        if quantization == "fp8":
            quantize_linears(block, lambda name, _: name in self.FP8_LINEARS)
        if to_host:
            for tensor in layer_tensors(block):
                tensor.data = host_copy(tensor.data)

    def stream_blocks(self, device: torch.device | str, *, resident: int = 0) -> int:
        """Keep all blocks but `resident` of them in pinned host memory and stream each to `device` while it
        computes, the next one's copy overlapping; what lies outside the blocks stays where it is. Returns the host
        bytes."""
        if self.block_stream is not None:
            raise RuntimeError("the blocks already stream; stream_blocks once")
        self.block_stream = StreamedLayers(self.blocks, device, resident=resident, keep_slots=True)
        return self.block_stream.host_bytes

    def _each_block(self):
        return self.block_stream.each() if self.block_stream is not None else enumerate(self.blocks)
