"""MiniMax H3's DiT sizes by name, one forward on example inputs and its FLOP count: what its `ModelSpec` points at
(`config_of`, `example_forward`, `forward_flops`).

The example is one T2VA call: text, stereo audio and video latents packed into one joint sequence, each modality at
its own timestep. The default sizes, 7 text + 10 audio + 3 x 4 x 4 video rows = 65 rows, pad to 128 (the packed
alignment), so the padding document crosses Ulysses rank borders.
"""

from __future__ import annotations

import torch

from ..spec import Example
from .config import MiniMaxH3Config
from .dit import STEREO
from .packing import pack_layout


def dit_config(size: str) -> MiniMaxH3Config:
    return MiniMaxH3Config.tiny() if size == "tiny" else MiniMaxH3Config()


def example(
    model,
    *,
    seed: int = 0,
    batch: int = 1,
    frames: int = 3,
    height: int = 8,
    width: int = 8,
    audio_rows: int = 10,
    text_rows: int = 7,
):
    """`model(video, audio, text, t_video, t_audio)` on seeded inputs: latent sizes, audio rows (channels x frames)
    and text rows."""
    config = model.config
    shape = dict(batch=batch, frames=frames, height=height, width=width, audio_rows=audio_rows, text_rows=text_rows)
    device = model.condition_proj.weight.device
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(batch, config.latents_dim, frames, height, width, generator=g).to(device)
    audio = torch.randn(batch, config.audio_latents_dim, audio_rows, generator=g).to(device)
    text = torch.randn(batch, text_rows, config.text_dim, generator=g).to(device)
    t_video, t_audio = (torch.rand(2, batch, generator=g) * 1000.0).to(device)
    return Example(run=lambda: model(video, audio, text, t_video, t_audio), shape=shape, names=("video", "audio"))


def flops(
    config: MiniMaxH3Config, *, batch: int, frames: int, height: int, width: int, audio_rows: int, text_rows: int
) -> int:
    """One dense T2VA call: the prompt's projection and token refiner, the audio and video patch projections, the
    time embedding of both timesteps, every joint block over the packed length (padding included: it runs as its own
    attention document) with its AdaLN projection, and the final layer's projection and heads."""
    layout = pack_layout(
        text_rows=text_rows,
        video_latent_thw=(frames, height, width),
        audio_rows=audio_rows,
        audio_channels=STEREO,
        patch_size=config.patch_size,
    )
    h, inner, f = config.hidden_size, config.inner_dim, config.ffn_hidden_size
    rows = layout.tags.shape[0]  # the packed length
    conds = 2 * batch  # one time embedding per modality's timestep

    def transformer(n: int, attended: int) -> int:  # fused QKV, output, SwiGLU; attention over `attended` pairs
        return 2 * batch * n * (4 * h * inner + 3 * h * f) + 4 * batch * inner * attended

    text = 2 * batch * text_rows * config.text_dim * h
    text += config.token_refiner_num_layers * transformer(text_rows, text_rows * text_rows)
    video_rows = layout.video.stop - layout.video.start
    patches = 2 * batch * (audio_rows * config.audio_latents_dim + video_rows * config.video_patch_dim) * h
    time = 2 * conds * (config.timestep_input_dim + config.time_embed_dim) * config.time_embed_hidden_size
    pairs = sum((stop - start) ** 2 for start, stop in layout.documents)
    blocks = config.num_layers * (
        transformer(rows, pairs) + 2 * conds * config.time_embed_dim * config.adaln_out_features
    )
    final = 2 * conds * config.time_embed_dim * config.final_adaln_out_features
    final += 2 * batch * rows * h * (config.video_patch_dim + config.audio_latents_dim)
    return text + patches + time + blocks + final
