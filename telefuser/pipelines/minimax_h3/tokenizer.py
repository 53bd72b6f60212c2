"""Prompt -> token ids for the MiniMax H3 text encoder: the prompt verbatim, no chat template, no special tokens.

The Qwen3-VL tokenizer comes from the checkpoint's ``processor/`` folder (local files only); without it a
deterministic byte-level stand-in lets tiny runs go without network, and its `description` says its ids mean nothing
to a real model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class PromptTokenizer(Protocol):
    description: str
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...


class ByteFallbackTokenizer:
    """UTF-8 bytes shifted past a few reserved ids: stable across machines, needs no files."""

    RESERVED = 3  # keep 0..2 free (pad/bos/eos in most vocabularies) so bytes never collide with them

    def __init__(self) -> None:
        self.vocab_size = 256 + self.RESERVED
        self.description = "byte-level fallback tokenizer (no tokenizer files given; not the Qwen3-VL vocabulary)"

    def encode(self, text: str) -> list[int]:
        return [b + self.RESERVED for b in text.encode("utf-8")]


class QwenTokenizer:
    """The checkpoint's own tokenizer (Qwen3-VL), loaded from local files only."""

    def __init__(self, path: str | Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.vocab_size = len(self._tokenizer)
        self.description = f"tokenizer from {path}"

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])


def load_tokenizer(path: str | Path | None) -> PromptTokenizer:
    """The tokenizer in `path` (a ``processor/`` or tokenizer folder), or the byte fallback when `path` is None."""
    if path is None:
        return ByteFallbackTokenizer()
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer folder not found: {path}")
    return QwenTokenizer(path)
