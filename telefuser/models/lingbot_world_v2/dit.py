"""LingBot-World v2: a Wan 2.x I2V DiT made chunk-causal, with camera conditioning and a rolling KV window.

A chunk is denoised by read-only `forward_chunk` calls, then `commit_chunk` writes its clean K/V. Under Ulysses each
rank embeds and runs its rows and the output rows are gathered, so every rank (called with identical inputs) returns
the full prediction.

Every block runs as one region (`blocks.block_region`), compiled on CUDA and run as it is elsewhere; with
`enable_cuda_graphs` the forwards of windows made afterwards are captured and replayed as CUDA graphs on pooled
buffers (graphs.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...distributed.ulysses import UlyssesCommunicator
from ...distributed.ulysses.compiled_ops import exchange_key
from ...distributed.ulysses.sequence import gather_rows, rank_rows, take_rows
from ...memory.streaming import StreamedLayers
from ...ops.attention_registry import check_backend
from ...ops.fp8 import linear_dtype, quantize_blocks
from ...ops.fusion import fusion_enabled
from ..block_streaming import BlockStreaming
from ..ulysses_owner import UlyssesOwner
from ..wan.attention import run_linear
from ..wan.blocks import WanHead
from ..wan.config import MODULATION_PARAMS
from ..wan.embeddings import embed_patches, embed_text, embed_time, patchify, unpatchify
from ..wan.rope import chunk_rope
from .attention import ChunkInputs, window_rows
from .blocks import LingBotBlock, block_region
from .config import LingBotWorldV2Config
from .graphs import ChunkData, ChunkGraphs
from .kv_cache import KVWindow
from .window_formats import WindowFormat, format_for, key_scale

MAX_TIMESTEP = 1000.0


@dataclass(frozen=True)
class CameraModulation:
    """One chunk's camera conditioning, computed once for all of its forwards (`LingBotWorldV2DiT.camera_modulation`):
    each block's (scale, shift) ``[B, S_local, dim]`` for this rank's rows of a chunk of `tokens` tokens."""

    tokens: int
    per_block: tuple[tuple[torch.Tensor, torch.Tensor], ...]


class LingBotWorldV2DiT(UlyssesOwner, BlockStreaming, nn.Module):
    def __init__(self, config: LingBotWorldV2Config, *, attn_impl: str = "sdpa"):
        super().__init__()
        self.config = config
        dim = config.dim
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, kernel_size=config.patch_size, stride=config.patch_size)
        self.patch_embedding_wancamctrl = nn.Linear(config.camera_feature_dim, dim)
        self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.text_embedding = nn.Sequential(
            nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, MODULATION_PARAMS * dim))
        self.blocks = nn.ModuleList(LingBotBlock(config) for _ in range(config.num_layers))
        self.head = WanHead(config)

        self.attn_impl = check_backend(attn_impl, head_dim=config.head_dim)
        self.weights_source = "constructed (default init)"
        self.communicator: UlyssesCommunicator | None = None  # owned by the model, shared by every block
        self.ulysses_group: dist.ProcessGroup | None = None
        self.graphs: ChunkGraphs | None = None  # enable_cuda_graphs()
        self.block_stream: StreamedLayers | None = None  # stream_blocks(): blocks visit the device one at a time
        self._rope_cache: tuple[tuple, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._slots_cache: tuple[tuple, torch.Tensor] | None = None

    # -- quantization ---------------------------------------------------------------------------------------------
    # FP8 GEMMs for what dominates a forward: self-attention q/k/v/o, cross-attention q/o (its text K/V are computed
    # once per KV window) and the FFN. The camera, modulation, embeddings and head stay in their dtype.
    FP8_LINEARS = (
        "self_attn.q",
        "self_attn.k",
        "self_attn.v",
        "self_attn.o",
        "cross_attn.q",
        "cross_attn.o",
        "ffn.0",
        "ffn.2",
    )

    def quantize(self, quantization: str) -> list[str]:
        """Apply ``"fp8"`` (ops.fp8) to every block's FP8_LINEARS in place (after TP: each rank's slices), or
        nothing for ``"none"``; returns the names quantized. Call it on a loaded model, before it runs."""
        return quantize_blocks(self, quantization, self.FP8_LINEARS)

    # -- where the weights live -------------------------------------------------------------------------------------
    def stream_blocks(self, device: torch.device | str, *, resident: int = 0) -> int:
        """Keep blocks ``resident:`` in pinned host memory and stream each to `device` while it computes, the next
        one's copy overlapping (memory.streaming.StreamedLayers); every loop over the blocks goes through it. Not
        with CUDA graphs (the slots change under a replay). Returns the host bytes."""
        if self.graphs is not None:
            raise ValueError("streamed blocks cannot replay as CUDA graphs; turn the graphs off (--cuda-graphs off)")
        return super().stream_blocks(device, resident=resident)

    # -- parallelism ----------------------------------------------------------------------------------------------
    def enable_cuda_graphs(self, enabled: bool = True) -> LingBotWorldV2DiT:
        """Capture and replay the forwards of windows made from now on, on CUDA, as CUDA graphs (graphs.py): their
        buffers come from a pool that outlives them. Call it once the model is loaded, quantized and parallelized.
        ``enabled=False`` drops the pool (windows still open keep their buffers)."""
        if enabled and self.block_stream is not None:
            raise ValueError("streamed blocks cannot replay as CUDA graphs; turn the graphs off (--cuda-graphs off)")
        self.graphs = ChunkGraphs() if enabled else None
        return self

    def reset_parallel(self) -> bool:
        """`UlyssesOwner.reset_parallel`; after a reset, graphs captured on the former transport are dropped (the
        pooled buffers stay) and captured again at their next call."""
        reset = super().reset_parallel()
        if reset and self.graphs is not None:
            self.graphs.forget_captures()
        return reset

    @property
    def compute_dtype(self) -> torch.dtype:
        return linear_dtype(self.blocks[0].self_attn.q)

    # -- KV windows -----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def new_window(
        self,
        batch: int,
        text_states: torch.Tensor,
        *,
        tokens_per_frame: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVWindow:
        """Allocate a KV window: per-layer KV buffers of ``local_attn_size * tokens_per_frame`` rows x this rank's heads,
        and the prompt's cross-attention K/V (computed here, once). The window takes the format the model's attention
        backend asks for (its `window_format`: FP8 keys for ``cudnn_fp8``, the SM90 kernel's layout for ``sage_sm90``,
        window_formats.py); a quantized window then serves only that backend.

        text_states ``[B, L, text_dim]`` with L <= text_len: encoder states, padding rows zero. They are zero-padded
        to text_len (512) and all text_len rows are attended, as in the release."""
        cfg = self.config
        if text_states.dim() != 3 or text_states.shape[0] != batch or text_states.shape[2] != cfg.text_dim:
            raise ValueError(f"text_states must be [B={batch}, L, {cfg.text_dim}], got {tuple(text_states.shape)}")
        if text_states.shape[1] > cfg.text_len:
            raise ValueError(f"text_states has {text_states.shape[1]} rows, more than text_len {cfg.text_len}")
        device = torch.device(device) if device is not None else self.patch_embedding.weight.device
        dtype = dtype or self.compute_dtype
        _, world = self._ulysses_coordinates()
        text = F.pad(text_states.to(device), (0, 0, 0, cfg.text_len - text_states.shape[1]))
        context = embed_text(self.text_embedding, text)
        window_format = format_for(self.attn_impl)
        cross_kv, key_scales = [], [] if window_format.needs_key_scales else None
        for _, block in self._each_block():
            k, v = block.cross_attn.text_kv(context)
            cross_kv.append((k.to(dtype).contiguous(), v.to(dtype).contiguous()))
            if key_scales is not None:
                key_scales.append(key_scale(block.self_attn.norm_k, cfg.dim))
        local_heads = cfg.num_heads // world
        entry = None
        if self.graphs is not None and self.graphs.takes(device):
            shape = (batch, cfg.local_attn_size * tokens_per_frame, local_heads, cfg.head_dim)
            pool_key = (shape, dtype, window_format.name, world, device, text.shape[1])
            entry = self.graphs.acquire(
                pool_key,
                lambda: window_format.allocate(cfg.num_layers, shape, cross_kv, key_scales, device=device, dtype=dtype),
            )
        return KVWindow(
            batch=batch,
            num_layers=cfg.num_layers,
            tokens_per_frame=tokens_per_frame,
            local_attn_size=cfg.local_attn_size,
            sink_size=cfg.sink_size,
            local_heads=local_heads,
            head_dim=cfg.head_dim,
            ulysses_degree=world,
            cross_kv=cross_kv,
            device=device,
            dtype=dtype,
            window_format=window_format,
            key_scales=key_scales,
            buffers=None if entry is None else entry.buffers,
            pool_entry=entry,
            on_close=None if entry is None else functools.partial(self.graphs.release, entry),
        )

    # -- one chunk ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def camera_modulation(self, camera: torch.Tensor) -> CameraModulation:
        """Every block's camera scale and shift for one chunk, from its camera features (either form accepted by
        `forward_chunk`). They depend on neither t nor the latents, so the chunk's five forwards share them: pass the
        result as `camera`. Under Ulysses, call it on every rank with the same features."""
        tokens = self._camera_tokens(camera)
        rank, world = self._ulysses_coordinates()
        rows, padded = rank_rows(tokens.shape[1], rank, world)
        cam = self._embed_camera(take_rows(tokens, rows, padded))
        return CameraModulation(
            tokens.shape[1], tuple(block.camera_scale_shift(cam) for _, block in self._each_block())
        )

    @torch.no_grad()
    def forward_chunk(
        self,
        window: KVWindow,
        latents: torch.Tensor,
        t: torch.Tensor,
        camera: torch.Tensor | CameraModulation | None,
        *,
        update_cache: bool,
    ) -> torch.Tensor:
        """Flow prediction ``[B, out_dim, F, h, w]`` (fp32) for one chunk.

        latents ``[B, in_dim, F, h, w]``: channels [noisy latent (16) | first-frame mask (4) | image latent (16)].
        t ``[B]``: scheduler timesteps in [0, 1000] (0 for the clean-KV commit); range-checked on the CPU only, so
        a device tensor costs no host sync.
        camera: per-token features ``[B, F*(h/2)*(w/2), 6*64*4]`` (see camera.chunk_camera_features), or the latent
        grid form ``[B, 6*64, F, h, w]``, or the chunk's `camera_modulation` (the same result, computed once), or
        None (no camera injection).
        update_cache: False reads the window: the rows the chunk keeps and the cursor stay bit-identical, its own
        K/V go into the slots of the rows it evicts (kv_cache.py); True also commits this chunk's K/V and advances the
        frame cursor by F."""
        return self._forward(window, latents, t, camera, update_cache=update_cache, kv_only=False)

    @torch.no_grad()
    def commit_chunk(
        self,
        window: KVWindow,
        latents: torch.Tensor,
        t: torch.Tensor,
        camera: torch.Tensor | CameraModulation | None,
    ) -> None:
        """The clean-KV update: `forward_chunk(..., update_cache=True)` without the work whose result it would
        discard (the last block after its K/V, and the head). The committed K/V are the same."""
        self._forward(window, latents, t, camera, update_cache=True, kv_only=True)

    def _forward(self, window, latents, t, camera, *, update_cache: bool, kv_only: bool) -> torch.Tensor | None:
        window.check_open()
        frames, grid_h, grid_w = self._check_chunk(window, latents, t, camera)
        t = t.to(latents.device, non_blocking=True)  # a host tensor is checked above and welcome
        window.check_serves(self.attn_impl, self._ulysses_coordinates()[1])
        plan = window.plan(frames)
        if camera is not None and not isinstance(camera, CameraModulation):
            camera = self.camera_modulation(camera)
        grid = (frames, grid_h, grid_w)
        cos, sin = self._chunk_rope(window.frame_offset, grid, latents.device)
        per_block = camera.per_block if camera is not None else None
        data = ChunkData(latents, t, cos, sin, self._slot_rows(plan, latents.device), per_block)
        program = functools.partial(
            self._run_regions, window.format, window.layers, grid, window_rows(plan), plan.kept == 0, kv_only
        )
        if window.pool_entry is not None and self.graphs is not None:
            graph_key = (kv_only, plan.total, plan.kept == 0, fusion_enabled(), self.attn_impl)
            graph_key += (exchange_key(self.communicator),)
            out = self.graphs.run(window.pool_entry, graph_key, data, program, camera)
        else:
            out = program(data)
        window.note_written(plan, commit=update_cache)
        if update_cache:
            window.advance(plan, frames)
        return out

    def _run_regions(
        self, window_format: WindowFormat, layers: list, grid, kv_rows: torch.Tensor, fresh: bool, kv_only: bool, data
    ):
        """The forward from `data`, the window's format and `layers` and constants: one region per block (compiled
        on CUDA), the program a CUDA graph captures (graphs.py)."""
        n = data.slots.shape[0]
        x, t_emb, t_mod = self._embed(data.latents, data.t, n)
        exchange = exchange_key(self.communicator)
        chunk = ChunkInputs(data.cos, data.sin, data.slots, kv_rows, n, exchange, self.attn_impl, window_format, fresh)
        per_block = data.camera if data.camera is not None else (None,) * len(self.blocks)
        last = len(self.blocks) - 1
        for (layer, block), block_camera, state in zip(self._each_block(), per_block, layers, strict=True):
            x = block_region(block, x, t_mod, block_camera, state, chunk, kv_only=kv_only and layer == last)
        return None if kv_only else self._head_out(x, t_emb, n, grid)

    def _embed(self, latents: torch.Tensor, t: torch.Tensor, n: int):
        """This rank's rows of the chunk embedded ``[B, S_local, dim]`` fp32, the time embedding and its projection."""
        cfg = self.config
        rank, world = self._ulysses_coordinates()
        rows, padded = rank_rows(n, rank, world)
        x = embed_patches(self.patch_embedding, take_rows(patchify(latents, cfg.patch_size), rows, padded))
        t_emb, t_mod = embed_time(self.time_embedding, self.time_projection, cfg.freq_dim, t)
        return x, t_emb, t_mod

    def _head_out(self, x: torch.Tensor, t_emb: torch.Tensor, n: int, grid: tuple[int, int, int]) -> torch.Tensor:
        out = self.head(x, t_emb)
        if self._ulysses_coordinates()[1] > 1:
            out = gather_rows(out, self.ulysses_group, communicator=self.communicator)
        return unpatchify(out[:, :n], grid, self.config.patch_size).contiguous()

    def _slot_rows(self, plan, device) -> torch.Tensor:
        """`WindowSlots.slot_rows`; a chunk's forwards share one plan, so they share its tensor (never written)."""
        key = (plan, str(device))
        if self._slots_cache is None or self._slots_cache[0] != key:
            self._slots_cache = (key, plan.slot_rows(device))
        return self._slots_cache[1]

    def _chunk_rope(self, frame_offset: int, grid, device) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE of the chunk's rows; a chunk's forwards share it (computed once per chunk)."""
        key = (frame_offset, grid, str(device))
        if self._rope_cache is None or self._rope_cache[0] != key:
            cfg = self.config
            rope = chunk_rope(frame_offset, *grid, cfg.head_dim, theta=cfg.rope_theta, device=device)
            self._rope_cache = (key, rope)
        return self._rope_cache[1]

    def _camera_tokens(self, camera: torch.Tensor) -> torch.Tensor:
        return patchify(camera, self.config.patch_size) if camera.dim() == 5 else camera

    def _embed_camera(self, features: torch.Tensor) -> torch.Tensor:
        """Embed once per chunk; each block derives its own scale/shift from this."""
        emb = run_linear(self.patch_embedding_wancamctrl, features)
        hidden = run_linear(self.c2ws_hidden_states_layer2, F.silu(run_linear(self.c2ws_hidden_states_layer1, emb)))
        return emb + hidden

    def _check_chunk(self, window, latents, t, camera) -> tuple[int, int, int]:
        cfg = self.config
        pt, ph, pw = cfg.patch_size
        problems = []
        if latents.dim() != 5 or latents.shape[1] != cfg.in_dim or latents.shape[0] != window.batch:
            problems.append(f"latents must be [B={window.batch}, {cfg.in_dim}, F, h, w], got {tuple(latents.shape)}")
            raise ValueError("LingBotWorldV2DiT.forward_chunk: " + "; ".join(problems))
        b, _, f, h, w = latents.shape
        if f % pt or h % ph or w % pw:
            problems.append(f"latent grid {(f, h, w)} does not split into {cfg.patch_size} patches")
        frames, grid_h, grid_w = f // pt, h // ph, w // pw
        if grid_h * grid_w != window.tokens_per_frame:
            problems.append(
                f"{grid_h}x{grid_w} = {grid_h * grid_w} tokens per frame, the window was made for "
                f"{window.tokens_per_frame}"
            )
        if t.shape != (b,):
            problems.append(f"t must be [B={b}], got {tuple(t.shape)}")
        elif t.device.type == "cpu" and not bool(((t >= 0) & (t <= MAX_TIMESTEP)).all()):  # no device sync
            problems.append(f"t must lie in [0, {MAX_TIMESTEP:g}], got {t.tolist()}")
        if isinstance(camera, CameraModulation):
            if camera.tokens != frames * grid_h * grid_w or len(camera.per_block) != len(self.blocks):
                problems.append(
                    f"the camera modulation was computed for {camera.tokens} tokens and "
                    f"{len(camera.per_block)} blocks; this chunk has {frames * grid_h * grid_w} tokens and "
                    f"the model {len(self.blocks)} blocks"
                )
        elif camera is not None:
            tokens = frames * grid_h * grid_w
            token_form = (b, tokens, cfg.camera_feature_dim)
            grid_form = (b, cfg.camera_feature_dim // cfg.patch_volume, f, h, w)
            if tuple(camera.shape) not in (token_form, grid_form):
                problems.append(
                    f"camera must be {list(token_form)} (tokens) or {list(grid_form)} (latent grid), "
                    f"got {list(camera.shape)}"
                )
        if problems:
            raise ValueError("LingBotWorldV2DiT.forward_chunk: " + "; ".join(problems))
        return frames, grid_h, grid_w
