"""A scripted LingBot-World v2 session for the compiled-region and CUDA-graph tests.

Ten 3-frame chunks through a 10-frame window with 2 sink frames (tiny config; 6 tokens per frame by default): the
window grows (3, 6, 9 frames of keys), fills in the middle of chunk 3, then stays full while the ring's head moves 3
frames a chunk through its 8, so chunk 8 wraps past the ring's end. Each chunk runs two read-only denoising steps and the commit,
like the pipeline (each with its own latents), under a camera modulation computed once per chunk. Every input comes
from one seed, so two runs see the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config
from telefuser.models.lingbot_world_v2.window_formats import FP8_KEY_WINDOW

GRID_HW = (4, 6)  # latent h, w -> 2 x 3 = 6 tokens per frame
CHUNKS = 10
CHUNK_FRAMES = 3
STEPS = (900.0, 500.0)  # read-only steps per chunk; then the commit at t = 0


def session_config(**overrides) -> LingBotWorldV2Config:
    return LingBotWorldV2Config.tiny_session(**overrides)


@dataclass
class SessionRecord:
    outputs: list[torch.Tensor]  # every read-only step's prediction, in order
    keys: list[torch.Tensor]  # every layer's window buffers after the last commit (copies)
    values: list[torch.Tensor]
    value_amax: list[torch.Tensor] | None  # FP8 keys: every layer's running max |V|
    window_lengths: list[int]  # keys attended by each chunk
    ring_heads: list[int]  # the ring's head before each chunk


def tokens_per_frame(grid_hw: tuple[int, int]) -> int:
    return grid_hw[0] * grid_hw[1] // 4  # the patch (1, 2, 2)


def run_session(
    model, *, device="cpu", dtype=None, seed: int = 1, chunks: int = CHUNKS, grid_hw: tuple[int, int] = GRID_HW
) -> SessionRecord:
    config = model.config
    g = torch.Generator().manual_seed(seed)
    text = torch.randn(1, 5, config.text_dim, generator=g)
    tpf = tokens_per_frame(grid_hw)
    session = model.new_window(
        1, text.to(device, model.compute_dtype), tokens_per_frame=tpf, device=device, dtype=dtype
    )
    outputs, lengths, heads = [], [], []
    try:
        for _ in range(chunks):
            lengths.append(session.plan(CHUNK_FRAMES).total)
            heads.append(session.ring_head)
            camera = torch.randn(1, CHUNK_FRAMES * tpf, config.camera_feature_dim, generator=g)
            modulation = model.camera_modulation(camera.to(device, model.compute_dtype))
            for t in STEPS:
                latents = torch.randn(1, config.in_dim, CHUNK_FRAMES, *grid_hw, generator=g).to(device)
                outputs.append(
                    model.forward_chunk(
                        session, latents, torch.tensor([t], device=device), modulation, update_cache=False
                    )
                )
            latents = torch.randn(1, config.in_dim, CHUNK_FRAMES, *grid_hw, generator=g).to(device)
            model.commit_chunk(session, latents, torch.zeros(1, device=device), modulation)
        keys = [layer.k.clone() for layer in session.layers]
        values = [layer.v.clone() for layer in session.layers]
        amax = [layer.value_amax.clone() for layer in session.layers] if session.format is FP8_KEY_WINDOW else None
    finally:
        session.close()
    return SessionRecord(outputs, keys, values, amax, lengths, heads)


def covers_the_window(record: SessionRecord, config: LingBotWorldV2Config, grid_hw=GRID_HW) -> bool:
    """The script met every window length and wrapped the ring (so a test over it covers them)."""
    tpf = tokens_per_frame(grid_hw)
    capacity = config.local_attn_size * tpf
    ring = capacity - config.sink_size * tpf
    rows = CHUNK_FRAMES * tpf
    grew = record.window_lengths[:4] == [rows, 2 * rows, 3 * rows, capacity]
    wrapped = any(head + rows > ring for head in record.ring_heads[4:])
    return grew and wrapped


def exactly_equal(a: SessionRecord, b: SessionRecord) -> bool:
    """Every output and every buffer the sessions wrote, bit for bit."""
    pairs = [*zip(a.outputs, b.outputs), *zip(a.keys, b.keys), *zip(a.values, b.values)]
    if a.value_amax is not None or b.value_amax is not None:
        pairs += list(zip(a.value_amax or [], b.value_amax or []))
    same_bytes = lambda x, y: torch.equal(x.view(torch.uint8), y.view(torch.uint8))
    return len(a.outputs) == len(b.outputs) and all(same_bytes(x, y) for x, y in pairs)


VARIED_CHUNK_FRAMES = (1, 2, 3, 2, 1, 3)  # chunk lengths of `session_under_impl`
TOKENS_PER_FRAME = 6  # GRID_HW's 2 x 3 patches


def session_under_impl(model, impl: str):
    """(the session, every prediction) of a scripted session under attention `impl`: chunks of 1, 2, 3, 2, 1, 3
    frames, each with two read-only steps and a committing forward, from fixed seeds. `impl` is set directly (a
    CPU test has no GPU to check it against) and reset to ``sdpa`` after."""
    text = torch.randn(1, 5, model.config.text_dim, generator=torch.Generator().manual_seed(1))
    model.attn_impl = impl
    session = model.new_window(1, text, tokens_per_frame=TOKENS_PER_FRAME)
    outputs = []
    for index, frames in enumerate(VARIED_CHUNK_FRAMES):
        g = torch.Generator().manual_seed(100 + index)
        camera = torch.randn(1, frames * TOKENS_PER_FRAME, model.config.camera_feature_dim, generator=g)
        modulation = model.camera_modulation(camera)
        for t, commit in ((900.0, False), (500.0, False), (0.0, True)):
            latents = torch.randn(1, model.config.in_dim, frames, *GRID_HW, generator=g)
            outputs.append(model.forward_chunk(session, latents, torch.tensor([t]), modulation, update_cache=commit))
    model.attn_impl = "sdpa"
    return session, outputs
