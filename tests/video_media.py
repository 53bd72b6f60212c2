"""What the video service tests upload: small images, clips and data URLs, and LoRA files for the tiny MiniMax H3
DiT (in the "comfy" layout: this model's own layer names with lora_A / lora_B, read as the FL2VA partition's)."""

from __future__ import annotations

import base64
import io
import math
import wave
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

from telefuser.media import write_mp4

LORA_LAYERS = ("blocks.0.attn.out_proj", "blocks.1.mlp.fc2", "time_embedder.proj_in")


def png(width: int = 64, height: int = 32, color=(200, 40, 40)) -> bytes:
    buffer = io.BytesIO()
    image = Image.new("RGB", (width, height), color)
    image.paste((20, 20, 220), (0, 0, width // 2, height // 2))  # not flat: a keyframe the VAE can see
    image.save(buffer, "PNG")
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def mp4_with_sound(path: Path, frames: int = 12, size=(64, 32)) -> bytes:
    pictures = np.random.default_rng(3).integers(0, 256, (frames, size[1], size[0], 3), dtype=np.uint8)
    tone = 0.2 * np.sin(np.linspace(0, 200 * math.pi, 32_000 * frames // 24, dtype=np.float32))
    write_mp4(path, pictures, 24, np.stack([tone, tone]), 32_000)
    return path.read_bytes()


def wav(seconds: float = 0.5, rate: int = 16_000) -> bytes:
    samples = (8000 * np.sin(np.arange(int(seconds * rate)) / 7)).astype(np.int16)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return buffer.getvalue()


def write_tiny_lora(path: Path, *, seed: int, layers=LORA_LAYERS, prefix: str = "", block: int | None = None) -> Path:
    """Random rank-2 factors for `layers` of the tiny DiT (`prefix` "transformer_ref." makes a Ref2VA LoRA;
    `block` renames them onto a block the model lacks)."""
    from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit

    dit = build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=0, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in layers:
        out_features, in_features = dit.get_submodule(name).weight.shape
        key = (
            name
            if block is None
            else name.replace("blocks.0.", f"blocks.{block}.").replace("blocks.1.", f"blocks.{block}.")
        )
        tensors[f"{prefix}{key}.lora_A.weight"] = torch.randn(2, in_features, generator=g) / math.sqrt(in_features)
        tensors[f"{prefix}{key}.lora_B.weight"] = torch.randn(out_features, 2, generator=g) * 0.3
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path
