"""`DiT`: what every registered model's DiT offers the pipelines, tools and tests, whatever its forward looks like;
`PromptEncoder`: what a pipeline's text side offers (umT5 for the Wan family, Qwen3-VL for MiniMax H3).

A structural protocol (torchtitan's `BaseModel`, without a base class): the config it was built from, its attention
implementation, where its weights came from, the block linears its FP8 path quantizes, its blocks, and the Ulysses
ownership of `ulysses_owner.UlyssesOwner`. The forward itself differs by model (a whole sequence, a KV-window chunk,
a packed joint sequence); `ModelSpec.example_forward` runs one of each. The conformance suite checks every
registered DiT against it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class DiT(Protocol):
    config: Any  # the model's config dataclass (`ModelSpec.config_of` makes one)
    attn_impl: str  # an ops.attention implementation name
    weights_source: str  # "random (no checkpoint)", "checkpoint <path>", ... (+ ", fp8" once quantized)
    FP8_LINEARS: tuple[str, ...]  # names inside each block that `quantize("fp8")` turns into FP8 GEMMs
    blocks: Any  # the repeated transformer blocks (an nn.ModuleList)

    def quantize(self, quantization: str) -> list[str]: ...

    def open_ulysses(self, mesh, communicator_factory=None) -> None: ...

    def reset_parallel(self) -> bool: ...

    def close(self) -> None: ...


@runtime_checkable
class PromptEncoder(Protocol):
    """A tokenizer and text encoder behind one call: a prompt to the DiT's text conditioning ``[1, L, hidden_size]``
    on `device` (pipelines/wan/text_encoder.py `UMT5PromptEncoder`, pipelines/minimax_h3/text_encoder.py
    `Qwen3VLPromptEncoder`)."""

    @property
    def hidden_size(self) -> int: ...

    def __call__(self, prompt: str, device) -> Any: ...
