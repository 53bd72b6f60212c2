"""MiniMax H3: one DiT over a packed joint sequence of text, audio and video tokens.

Attention spans every modality; AdaLN modulation is picked per token by its modality and that modality's timestep.
Its parallel plan is in spec.py (TP from tp.py, then Ulysses: each rank embeds its rows and the output rows are
gathered), applied by `Runtime.parallelize`.
On CUDA each joint block runs as one compiled region (`blocks.block_region`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ...distributed.ulysses import UlyssesCommunicator
from ...distributed.ulysses.compiled_ops import exchange_key
from ...distributed.ulysses.sequence import gather_rows
from ...memory.host import layer_tensors, to_host
from ...memory.streaming import StreamedLayers
from ...ops.attention_registry import check_backend, warn_failed_gate
from ...ops.fp8 import quantize_blocks, quantize_linears
from ...ops.regions import region_compiles
from ..ulysses_owner import UlyssesOwner
from .adaln_tables import AdaLNTables, TimestepKey, timestep_key
from .attention import AttentionContext
from .blocks import FinalLayer, MiniMaxH3Block, TokenRefiner, block_region
from .config import MiniMaxH3Config
from .embeddings import Rope3D, TimestepEmbedder
from .modulation import AdaLNProjection, table_rows, timestep_rows
from .packing import (
    PACKED_SEQUENCE_ALIGNMENT,
    TAG_VIDEO,
    Conditions,
    PackedLayout,
    pack_layout,
    patchify_video,
    unpatchify_video,
)
from .tp import TensorParallelState

# Attention backends that failed the quality gate on this DiT (backend -> where the result is written)
FAILED_ATTENTION_GATES = {"cudnn_fp8": "docs/perf/2026-12-02"}

# Parameters the released checkpoint stores, and the model runs, in fp32 whatever the compute dtype.
FP32_PARAMETER_NAMES = frozenset(
    f"{module}.{p}"
    for module in (
        "video_patch_proj",
        "audio_patch_proj",
        "time_embedder.proj_in",
        "time_embedder.proj_out",
        "final_layer.video_out",
        "final_layer.audio_out",
    )
    for p in ("weight", "bias")
)
FP32_BUFFER_NAMES = frozenset({"rope.inv_freq"})

# forward() takes timesteps in [0, 1000]; the released model embeds t in [0, 1] (t = 1 - sigma, 1 = clean).
TIMESTEP_SCALE = 1000.0
STEREO = 2

BlockHook = Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor]


class MiniMaxH3DiT(UlyssesOwner, nn.Module):
    def __init__(
        self, config: MiniMaxH3Config, *, attn_impl: str = "sdpa", sequence_alignment: int = PACKED_SEQUENCE_ALIGNMENT
    ):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.video_patch_proj = nn.Linear(config.video_patch_dim, hidden)
        self.audio_patch_proj = nn.Linear(config.audio_latents_dim, hidden)
        self.condition_proj = nn.Linear(config.text_dim, hidden)
        self.time_embedder = TimestepEmbedder(
            config.timestep_input_dim, config.time_embed_hidden_size, config.time_embed_dim
        )
        self.rope = Rope3D(config.rope_inv_freq_len, config.rope_theta)
        self.token_refiner = TokenRefiner(config)
        self.blocks = nn.ModuleList(MiniMaxH3Block(config) for _ in range(config.num_layers))
        self.final_layer = FinalLayer(config)

        self.attn_impl = check_backend(attn_impl, head_dim=config.attention_head_dim)
        warn_failed_gate("MiniMax H3", self.attn_impl, FAILED_ATTENTION_GATES)
        self.sequence_alignment = sequence_alignment
        self.weights_source = "constructed (default init)"
        self.communicator: UlyssesCommunicator | None = None  # owned by the model, shared by every block
        self.ulysses_group: dist.ProcessGroup | None = None
        self.tensor_parallel: TensorParallelState | None = None  # set by the TP plan (spec.parallelize)
        self.adaln_offloaded = False  # offload_adaln(): the projections live in host memory, tables are required
        self.block_stream: StreamedLayers | None = None  # stream_blocks(): blocks visit the device one at a time

    # -- quantization ---------------------------------------------------------------------------------------------
    # FP8 GEMMs for what dominates a call: the joint blocks' fused QKV, output projection and SwiGLU. The token
    # refiner, embeddings, AdaLN tables and heads stay in their dtype.
    FP8_LINEARS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")

    def quantize(self, quantization: str) -> list[str]:
        """Apply ``"fp8"`` (ops.fp8) to every block's FP8_LINEARS in place (after TP: each rank's slices), or
        nothing for ``"none"``; returns the names quantized. Call it on a loaded model, before it runs."""
        return quantize_blocks(self, quantization, self.FP8_LINEARS)

    def finish_block(self, index: int, *, quantization: str, block_to_host: bool, adaln_to_host: bool) -> None:
        """Block `index` as it will run, done as soon as it is loaded so the device never holds two unfinished
        blocks: its FP8 linears quantized (on the device it was loaded on, after TP), then, when it will stream,
        its tensors (less the AdaLN projection) moved to host memory, and its AdaLN projection when that is
        offloaded."""
        block = self.blocks[index]
        if quantization == "fp8":
            quantize_linears(block, lambda name, _: name in self.FP8_LINEARS)
        moved = [t for name, m in block.named_children() if name != "adaln_proj" for t in layer_tensors(m)]
        for tensor in (moved if block_to_host else []) + (layer_tensors(block.adaln_proj) if adaln_to_host else []):
            tensor.data = to_host(tensor.data)

    # -- forward --------------------------------------------------------------------------------------------------
    def forward(
        self,
        video: torch.Tensor,
        audio: torch.Tensor,
        text: torch.Tensor,
        t_video: torch.Tensor,
        t_audio: torch.Tensor,
        *,
        block_hook: BlockHook | None = None,
        audio_channels: int = STEREO,
        adaln: AdaLNTables | None = None,
        conditions: Conditions | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """video [B, C, T, H, W] latents; audio [B, C_a, A] latents, A = audio_channels x T_a, channel-major;
        text [B, L, text_dim] (all L rows are live text); t_video, t_audio [B] in [0, 1000] (1000 = clean).
        `adaln`: tables from `precompute_adaln` holding this call's timesteps, used instead of the projections
        (a call they do not hold is a ValueError; with `conditions`, tables made with the same `conditions`).
        `conditions` (packing.Conditions): FL2VA keyframe / Ref2VA reference rows packed between the text and the
        audio with their own positions, tags and timesteps (max(t_video, floor) for video rows, a fixed one for
        audio rows); they get no velocity. None: the T2VA sequence, unchanged.
        Returns fp32 velocities shaped like video and audio (the generated rows only)."""
        self._check_inputs(video, audio, text, t_video, t_audio)
        if conditions is not None:
            self._check_conditions(conditions, video.shape[0], text.shape[1])
        # [t_video, t_audio], then the condition rows' timesteps: what this call embeds and its tables are keyed by
        timesteps = (
            torch.cat([t_video, t_audio]) if conditions is None else _call_timesteps(t_video, t_audio, conditions)
        )
        if adaln is None:
            if self.adaln_offloaded:
                raise RuntimeError(
                    "MiniMaxH3DiT.forward: the AdaLN projections are offloaded (offload_adaln); pass "
                    "adaln=model.precompute_adaln(t_video_list, t_audio_list) holding this call's timesteps "
                    f"(t_video={t_video.tolist()}, t_audio={t_audio.tolist()}; with conditions=, the same conditions)"
                )
            cond = self._adaln_cond(timesteps)
            block_tables, final_table = (None,) * len(self.blocks), None
        else:
            cond = None
            block_tables, final_table = adaln.lookup(t_video, timesteps[t_video.shape[0] :], video.device)
            if len(block_tables) != len(self.blocks):
                raise ValueError(f"AdaLN tables for {len(block_tables)} blocks, the model has {len(self.blocks)}")
        batch, channels, lt, lh, lw = video.shape
        rank, world = self._ulysses_coordinates()
        layout = pack_layout(
            text_rows=text.shape[1],
            video_latent_thw=(lt, lh, lw),
            audio_rows=audio.shape[2],
            audio_channels=audio_channels,
            patch_size=self.config.patch_size,
            alignment=self.sequence_alignment,
            multiple_of=world,
            **({} if conditions is None else {"conditions": conditions.layout, "text_tags": conditions.text_tags}),
        )
        rows = layout.local_rows(rank, world)
        tags = layout.tags[rows].to(video.device)
        timesteps = timestep_rows(layout.timestep_slots[rows].to(video.device), batch)
        adaln_rows = table_rows(tags, timesteps)

        hidden = self._embed_rows(layout, rows, video, audio, text, conditions)
        compiled = region_compiles(hidden)  # a compiled region takes the exchange key and the documents as a tensor
        ctx = AttentionContext(
            rope=self.rope(layout.positions[rows].to(video.device)),
            documents=torch.tensor(layout.documents, dtype=torch.int64) if compiled else layout.documents,
            communicator=exchange_key(self.communicator) if compiled else self.communicator,
            attn_impl=self.attn_impl,
        )

        def run_blocks(h: torch.Tensor) -> torch.Tensor:
            for (_, block), table in zip(self._each_block(), block_tables):
                h = block_region(block, h, cond, adaln_rows, ctx, table)
            return h

        hidden = run_blocks(hidden) if block_hook is None else block_hook(hidden, run_blocks, tags)
        video_out, audio_out = self.final_layer(hidden, cond, timesteps, final_table)
        out = torch.cat([video_out, audio_out], dim=-1)
        if world > 1:
            out = gather_rows(out, self.ulysses_group, communicator=self.communicator)
        patch_dim = self.config.video_patch_dim
        video_velocity = unpatchify_video(
            out[:, layout.video, :patch_dim], (channels, lt, lh, lw), self.config.patch_size
        )
        audio_velocity = out[:, layout.audio, patch_dim:].transpose(1, 2)
        return video_velocity.float().contiguous(), audio_velocity.float().contiguous()

    def _adaln_cond(self, timesteps: torch.Tensor) -> torch.Tensor:
        """The AdaLN input of one call: silu(temb) of its [2B] timesteps (video then audio)."""
        return F.silu(self.time_embedder(timesteps.float() / TIMESTEP_SCALE))

    # -- where the weights live -------------------------------------------------------------------------------------
    def stream_blocks(self, device: torch.device | str, *, resident: int = 0) -> int:
        """Keep blocks ``resident:`` in pinned host memory and stream each to `device` while it computes, the next
        one's copy overlapping (memory.streaming.StreamedLayers). Their AdaLN projections are not streamed: they
        make the request's tables (`precompute_adaln`), which a streamed DiT requires. Returns the host bytes."""
        if self.block_stream is not None:
            raise RuntimeError("the blocks already stream; stream_blocks once")
        self.block_stream = StreamedLayers(
            self.blocks, device, resident=resident, keep_slots=True, skip=("adaln_proj",)
        )
        self.adaln_offloaded = True  # forward reads tables, never the projections of a streamed block
        return self.block_stream.host_bytes

    def _each_block(self):
        return self.block_stream.each() if self.block_stream is not None else enumerate(self.blocks)

    # -- AdaLN tables ---------------------------------------------------------------------------------------------
    def adaln_projections(self) -> list[AdaLNProjection]:
        return [*(block.adaln_proj for block in self.blocks), self.final_layer.adaln_proj]

    @torch.no_grad()
    def precompute_adaln(
        self, t_video: Sequence[torch.Tensor], t_audio: Sequence[torch.Tensor], *, conditions: Conditions | None = None
    ) -> AdaLNTables:
        """The AdaLN tables of the DiT calls ``forward(..., t_video[i], t_audio[i], conditions=conditions)`` ([B]
        each, same B; `conditions` adds its rows' timesteps to each call): for each call the same time embedding and
        the same ``adaln_proj(cond)`` calls as `forward` (same modules, input shapes and dtype; under TP the same
        all-gather), so the tables are bit-identical to the per-call ones.
        A collective under TP: every TP rank calls it with the same timesteps. Projections offloaded by
        `offload_adaln` are copied to the compute device one at a time, for that projection's tables only."""
        if len(t_video) != len(t_audio):
            raise ValueError(f"precompute_adaln: {len(t_video)} t_video tensors but {len(t_audio)} t_audio tensors")
        device = self.time_embedder.proj_in.weight.device
        batch, conds = None, {}
        for tv, ta in zip(t_video, t_audio):
            if tv.dim() != 1 or tv.shape != ta.shape or (batch is not None and tv.shape[0] != batch):
                raise ValueError(
                    f"precompute_adaln: every t_video/t_audio must be [B] with one B, got {tuple(tv.shape)} / "
                    f"{tuple(ta.shape)}" + (f" (B={batch})" if batch is not None else "")
                )
            batch = tv.shape[0]
            if conditions is None:
                timesteps = torch.cat([tv.to(device), ta.to(device)])
                key = timestep_key(tv, ta)
            else:  # the condition rows' timesteps too, as forward embeds them (and looks them up)
                timesteps = _call_timesteps(tv.to(device), ta.to(device), conditions)
                key = timestep_key(timesteps[:batch], timesteps[batch:])
            _check_timesteps(timesteps)
            if key not in conds:  # a repeated call shares its tables
                conds[key] = self._adaln_cond(timesteps)
        outputs: dict[TimestepKey, list] = {key: [] for key in conds}
        for projection in self.adaln_projections():
            with self._adaln_on(projection, device) as project:
                for key, cond in conds.items():
                    outputs[key].append(project(cond))
        calls = {key: (tuple(out[:-1]), out[-1]) for key, out in outputs.items()}
        return AdaLNTables(batch=batch or 0, device=device, calls=calls)

    @contextlib.contextmanager
    def _adaln_on(self, projection: AdaLNProjection, device: torch.device) -> Iterator[Callable]:
        """`projection` runnable on `device`: itself when resident there, else (offloaded) the same module, its TP
        hook included, called with device copies of its weights, freed on exit."""
        linear = projection.linear
        if not getattr(linear, "host_resident", False) and linear.weight.device == device:
            yield projection
            return
        # offloaded: always this path (on a CPU-only host `.to` is then a no-op, and the tests still run it)
        lent = {f"linear.{name}": p.to(device, non_blocking=True) for name, p in linear.named_parameters()}
        try:
            yield lambda cond: functional_call(projection, lent, (cond,))
        finally:
            lent.clear()

    def offload_adaln(self, *, resident: int = 0) -> int:
        """Move the AdaLN projections of blocks ``resident:`` and of the final layer (under TP this rank's slices)
        to host memory, pinned when CUDA is available; forward then needs `precompute_adaln` tables. Returns the
        bytes in host memory."""
        moved = 0
        for projection in self.adaln_projections()[resident:]:
            linear = projection.linear
            for tensor in layer_tensors(linear):
                tensor.data = to_host(tensor.data)
                moved += tensor.numel() * tensor.element_size()
            linear.host_resident = True
        self.adaln_offloaded = True
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the freed device memory back, so free-memory checks see it
        return moved

    def _embed_rows(
        self, layout: PackedLayout, rows: slice, video, audio, text, conditions: Conditions | None = None
    ) -> torch.Tensor:
        """This rank's packed rows [B, S_local, hidden]: its part of each modality, in packed order, then padding.
        Only the rows a rank owns are projected; the text refiner runs when the rank owns any text row, since it
        attends over the whole prompt. Condition rows go through the projection of their modality."""
        text_part, audio_part, video_part = (_overlap(s, rows) for s in (layout.text, layout.audio, layout.video))
        parts = []
        if text_part is not None:
            parts.append(self._embed_text(text)[:, text_part])
        for sequence, modality, offset in layout.condition_parts():
            part = _overlap(sequence, rows)
            if part is None:
                continue
            source = slice(offset + part.start, offset + part.stop)
            if modality == TAG_VIDEO:
                parts.append(self._embed_latents(self.video_patch_proj, conditions.video[:, source]))
            else:
                parts.append(self._embed_latents(self.audio_patch_proj, conditions.audio.transpose(1, 2)[:, source]))
        if audio_part is not None:
            parts.append(self._embed_latents(self.audio_patch_proj, audio.transpose(1, 2)[:, audio_part]))
        if video_part is not None:
            tokens = patchify_video(video, self.config.patch_size)[:, video_part]
            parts.append(self._embed_latents(self.video_patch_proj, tokens))
        stream_dtype = self.condition_proj.weight.dtype
        padding = rows.stop - max(layout.used, rows.start)
        if padding > 0:
            parts.append(video.new_zeros(video.shape[0], padding, self.config.hidden_size, dtype=stream_dtype))
        return torch.cat([part.to(stream_dtype) for part in parts], dim=1)

    def _embed_text(self, text: torch.Tensor) -> torch.Tensor:
        return self.token_refiner(self.condition_proj(text.to(self.condition_proj.weight.dtype)), self.attn_impl)

    @staticmethod
    def _embed_latents(proj: nn.Linear, tokens: torch.Tensor) -> torch.Tensor:
        return proj(tokens.to(proj.weight.dtype))  # fp32 projection of fp32 latents, as released

    def _check_inputs(self, video, audio, text, t_video, t_audio) -> None:
        cfg = self.config
        batch = video.shape[0] if video.dim() == 5 else None
        problems = []
        if video.dim() != 5 or video.shape[1] != cfg.latents_dim:
            problems.append(f"video must be [B, {cfg.latents_dim}, T, H, W], got {tuple(video.shape)}")
        if audio.dim() != 3 or audio.shape[:2] != (batch, cfg.audio_latents_dim):
            problems.append(f"audio must be [B={batch}, {cfg.audio_latents_dim}, A], got {tuple(audio.shape)}")
        if text.dim() != 3 or text.shape[0] != batch or text.shape[2] != cfg.text_dim:
            problems.append(f"text must be [B={batch}, L, {cfg.text_dim}], got {tuple(text.shape)}")
        for name, t in (("t_video", t_video), ("t_audio", t_audio)):
            if t.shape != (batch,):
                problems.append(f"{name} must be [B={batch}], got {tuple(t.shape)}")
        if problems:
            raise ValueError("MiniMaxH3DiT.forward: " + "; ".join(problems))
        _check_timesteps(torch.cat([t_video.float(), t_audio.float()]))

    def _check_conditions(self, conditions: Conditions, batch: int, text_rows: int) -> None:
        cfg, layout = self.config, conditions.layout
        problems = []
        video_shape = (batch, layout.video_rows, cfg.video_patch_dim)
        if tuple(conditions.video.shape) != video_shape:
            problems.append(f"conditions.video must be {list(video_shape)}, got {list(conditions.video.shape)}")
        audio_shape = (batch, cfg.audio_latents_dim, layout.audio_rows)
        if tuple(conditions.audio.shape) != audio_shape:
            problems.append(f"conditions.audio must be {list(audio_shape)}, got {list(conditions.audio.shape)}")
        tags = conditions.text_tags
        if tags is not None and tuple(tags.shape) != (text_rows,):
            problems.append(f"conditions.text_tags must be [{text_rows}], got {list(tags.shape)}")
        if problems:
            raise ValueError("MiniMaxH3DiT.forward: " + "; ".join(problems))


def _call_timesteps(t_video: torch.Tensor, t_audio: torch.Tensor, conditions: Conditions) -> torch.Tensor:
    """The [4B] timesteps a conditioned call embeds, in timestep-slot order (packing.VIDEO_TIMESTEP,
    AUDIO_TIMESTEP, CONDITION_VIDEO_TIMESTEP, CONDITION_AUDIO_TIMESTEP): video condition rows at
    max(t_video, floor), audio ones at their fixed timestep (diffusers' `MiniMaxH3SetTimestepsStep`)."""
    floor = torch.full_like(t_video, conditions.video_timestep_floor)
    return torch.cat(
        [t_video, t_audio, torch.maximum(t_video, floor), torch.full_like(t_video, conditions.audio_timestep)]
    )


def _check_timesteps(ts: torch.Tensor) -> None:
    ts = ts.float()
    if not bool(((ts >= 0) & (ts <= TIMESTEP_SCALE)).all()):
        raise ValueError(f"timesteps must lie in [0, {TIMESTEP_SCALE:g}], got {ts.tolist()}")


def _overlap(segment: slice, rows: slice) -> slice | None:
    """The part of `segment` inside `rows`, relative to the segment's start; None when they do not meet."""
    start, stop = max(segment.start, rows.start), min(segment.stop, rows.stop)
    return slice(start - segment.start, stop - segment.start) if start < stop else None
