"""The packed joint sequence ``[text | conditions | audio | video | padding]``: each row's source, modality tag,
timestep, position.

T2VA has no condition rows. FL2VA keyframes and Ref2VA references are packed between the text and the generated audio,
as diffusers' MiniMax H3 layout steps do (`keyframe_layout`, `reference_layout`). Padding (to a multiple of 64 and of
the Ulysses degree) is its own attention document. Pure host bookkeeping, except `Conditions`, which carries the
condition rows' values to the DiT; the released packer's positions are spelled out in this folder's README.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...distributed.ulysses.sequence import rank_rows

PACKED_SEQUENCE_ALIGNMENT = 64

# Modality tags of the packed rows; the AdaLN table is indexed by max(tag, 0).
TAG_PAD, TAG_VIDEO, TAG_TEXT, TAG_AUDIO = -1, 0, 1, 2
# Which timestep a row is modulated with: text and padding rows use the video timestep (as in the release); condition
# rows use their own (`Conditions`: video conditions max(t_video, 0.999), audio references 1.0 in the released scale).
VIDEO_TIMESTEP, AUDIO_TIMESTEP = 0, 1
CONDITION_VIDEO_TIMESTEP, CONDITION_AUDIO_TIMESTEP = 2, 3

_SPATIAL_SCALE = 32.0
_FRAME_RESCALE = 5.0 / 3.0
_FRAMES_PER_LATENT = (1, 4, 4, 4, 4)


@dataclass(frozen=True)
class ConditionSegment:
    """A run of condition rows of one modality (TAG_VIDEO or TAG_AUDIO) and their (t, h, w) positions, float64."""

    modality: int
    positions: torch.Tensor  # [rows, 3] float64

    @property
    def rows(self) -> int:
        return int(self.positions.shape[0])


@dataclass(frozen=True)
class ConditionLayout:
    """The condition rows of a request, packed right after the text in this order, and the rotary time at which the
    generated audio and video start (None: right after the text, as in T2VA and FL2VA; Ref2VA references advance
    it). Video condition rows take their values, in order, from `Conditions.video`; audio ones from
    `Conditions.audio`."""

    segments: tuple[ConditionSegment, ...]
    media_origin: float | None = None

    @property
    def rows(self) -> int:
        return sum(segment.rows for segment in self.segments)

    @property
    def video_rows(self) -> int:
        return sum(segment.rows for segment in self.segments if segment.modality == TAG_VIDEO)

    @property
    def audio_rows(self) -> int:
        return sum(segment.rows for segment in self.segments if segment.modality == TAG_AUDIO)


@dataclass(frozen=True)
class Conditions:
    """What `MiniMaxH3DiT.forward(..., conditions=)` packs besides the generated rows.

    `video`: [B, layout.video_rows, C*pt*ph*pw] patchified video condition tokens (keyframes, image and video
    references), in packed order; `audio`: [B, audio_latents_dim, layout.audio_rows] audio condition rows (each
    reference channel-major), in packed order; `text_tags`: [L] per-text-row modality tags (a vision block's rows are
    TAG_VIDEO in the release), None for all TAG_TEXT. Timesteps in forward's [0, 1000] scale: video condition rows
    are modulated with ``max(t_video, video_timestep_floor)``, audio condition rows with `audio_timestep`
    (diffusers' `MiniMaxH3SetTimestepsStep`: 0.999 and 1.0 in the released [0, 1] scale)."""

    layout: ConditionLayout
    video: torch.Tensor
    audio: torch.Tensor
    text_tags: torch.Tensor | None = None
    video_timestep_floor: float = 999.0
    audio_timestep: float = 1000.0


@dataclass(frozen=True)
class PackedLayout:
    text_rows: int
    audio_rows: int
    video_rows: int
    seq_len: int  # including padding
    tags: torch.Tensor  # [S] long
    timestep_slots: torch.Tensor  # [S] long: VIDEO_TIMESTEP, AUDIO_TIMESTEP or a CONDITION_* slot
    positions: torch.Tensor  # [S, 3] float32 (t, h, w)
    conditions: ConditionLayout | None = None  # rows between the text and the audio

    @property
    def condition_rows(self) -> int:
        return 0 if self.conditions is None else self.conditions.rows

    @property
    def used(self) -> int:
        return self.text_rows + self.condition_rows + self.audio_rows + self.video_rows

    @property
    def text(self) -> slice:
        return slice(0, self.text_rows)

    @property
    def condition(self) -> slice:
        return slice(self.text_rows, self.text_rows + self.condition_rows)

    def condition_parts(self) -> list[tuple[slice, int, int]]:
        """(rows of the sequence, modality, offset into that modality's condition values) of each segment."""
        parts, start, offsets = [], self.text_rows, {TAG_VIDEO: 0, TAG_AUDIO: 0}
        for segment in () if self.conditions is None else self.conditions.segments:
            parts.append((slice(start, start + segment.rows), segment.modality, offsets[segment.modality]))
            start += segment.rows
            offsets[segment.modality] += segment.rows
        return parts

    @property
    def audio(self) -> slice:
        start = self.text_rows + self.condition_rows
        return slice(start, start + self.audio_rows)

    @property
    def video(self) -> slice:
        return slice(self.audio.stop, self.used)

    @property
    def documents(self) -> list[tuple[int, int]]:
        """Attention documents over the full sequence: the valid rows, then the padding (if any)."""
        if self.seq_len == self.used:
            return [(0, self.seq_len)]
        return [(0, self.used), (self.used, self.seq_len)]

    def local_rows(self, rank: int, world_size: int) -> slice:
        """The contiguous rows a sequence-parallel rank owns."""
        if self.seq_len % world_size:
            raise ValueError(f"packed length {self.seq_len} does not split over {world_size} ranks")
        return rank_rows(self.seq_len, rank, world_size)[0]


def packed_length(used: int, *, alignment: int = PACKED_SEQUENCE_ALIGNMENT, multiple_of: int = 1) -> int:
    step = math.lcm(max(alignment, 1), max(multiple_of, 1))
    return -(-used // step) * step


def spatial_grid(latent_size: int, patch: int, sqrt_area: float) -> torch.Tensor:
    """Evenly spaced patch coordinates of one spatial axis, centred and normalised by sqrt(H*W), in fp64."""
    ratio = latent_size / sqrt_area
    left = (1.0 - ratio) / 2.0
    n = latent_size // patch
    step = ratio / n
    return (left + torch.arange(n, dtype=torch.float64) * step) * _SPATIAL_SCALE


def latent_frame_times(latent_t: int, origin: float) -> torch.Tensor:
    spans = torch.tensor([_FRAME_RESCALE * _FRAMES_PER_LATENT[k % 5] for k in range(latent_t)], dtype=torch.float64)
    return origin + torch.cat([spans.new_zeros(1), spans[:-1].cumsum(0)])


def pack_layout(
    *,
    text_rows: int,
    video_latent_thw: tuple[int, int, int],
    audio_rows: int,
    audio_channels: int,
    patch_size: tuple[int, int, int],
    alignment: int = PACKED_SEQUENCE_ALIGNMENT,
    multiple_of: int = 1,
    conditions: ConditionLayout | None = None,
    text_tags: torch.Tensor | None = None,
) -> PackedLayout:
    """The layout of one request; `multiple_of` is the Ulysses degree. `conditions` (FL2VA keyframes, Ref2VA
    references) are packed between the text and the audio, and may move the generated rows' rotary origin;
    `text_tags` ([L], default all TAG_TEXT) tags the text rows. Without either, the T2VA layout."""
    latent_t, latent_h, latent_w = video_latent_thw
    pt, ph, pw = patch_size
    if pt != 1:
        raise ValueError(f"the released position grid assumes a temporal patch of 1, got {pt}")
    if latent_h % ph or latent_w % pw:
        raise ValueError(f"video latent {latent_h}x{latent_w} does not split into {ph}x{pw} patches")
    if audio_channels < 1 or audio_rows % audio_channels:
        raise ValueError(f"{audio_rows} audio rows do not split into {audio_channels} channels")
    if text_rows < 1:
        raise ValueError("the packed sequence needs at least one text row")
    frame_rows = (latent_h // ph) * (latent_w // pw)
    video_rows = latent_t * frame_rows
    condition_rows = 0 if conditions is None else conditions.rows
    used = text_rows + condition_rows + audio_rows + video_rows
    seq_len = packed_length(used, alignment=alignment, multiple_of=multiple_of)

    text = slice(0, text_rows)
    audio = slice(text.stop + condition_rows, text.stop + condition_rows + audio_rows)
    video = slice(audio.stop, used)
    tags = torch.full((seq_len,), TAG_PAD, dtype=torch.long)
    slots = torch.full((seq_len,), VIDEO_TIMESTEP, dtype=torch.long)
    positions = torch.zeros(seq_len, 3, dtype=torch.float64)

    tags[text], tags[audio], tags[video] = TAG_TEXT, TAG_AUDIO, TAG_VIDEO
    slots[audio] = AUDIO_TIMESTEP
    positions[text, 0] = torch.arange(text_rows, dtype=torch.float64)
    if text_tags is not None:
        if tuple(text_tags.shape) != (text_rows,) or not bool(
            ((text_tags == TAG_VIDEO) | (text_tags == TAG_TEXT)).all()
        ):
            raise ValueError(f"text_tags must be [{text_rows}] of TAG_TEXT / TAG_VIDEO, got {text_tags.tolist()}")
        tags[text] = text_tags.to(torch.long).cpu()
    origin = float(text_rows)
    if conditions is not None:
        start = text.stop
        for segment in conditions.segments:
            rows = slice(start, start + segment.rows)
            if segment.modality not in (TAG_VIDEO, TAG_AUDIO):
                raise ValueError(f"a condition segment is TAG_VIDEO or TAG_AUDIO rows, got tag {segment.modality}")
            tags[rows] = segment.modality
            slots[rows] = CONDITION_VIDEO_TIMESTEP if segment.modality == TAG_VIDEO else CONDITION_AUDIO_TIMESTEP
            positions[rows] = segment.positions.to(torch.float64)
            start = rows.stop
        if conditions.media_origin is not None:
            origin = float(conditions.media_origin)

    sqrt_area = math.sqrt(latent_h * latent_w)
    h_grid = spatial_grid(latent_h, ph, sqrt_area)
    w_grid = spatial_grid(latent_w, pw, sqrt_area)
    hh, ww = torch.meshgrid(h_grid, w_grid, indexing="ij")
    video_pos = positions[video].view(latent_t, frame_rows, 3)
    video_pos[:, :, 0] = latent_frame_times(latent_t, origin)[:, None]
    video_pos[:, :, 1] = hh.reshape(-1)
    video_pos[:, :, 2] = ww.reshape(-1)

    audio_t = audio_rows // audio_channels
    audio_pos = positions[audio].view(audio_channels, audio_t, 3)
    audio_pos[:, :, 0] = origin + torch.arange(audio_t, dtype=torch.float64)
    audio_pos[0, :, 2] = float(w_grid[0])
    audio_pos[1:, :, 2] = float(w_grid[-1])

    # The released model consumes fp32 positions.
    return PackedLayout(text_rows, audio_rows, video_rows, seq_len, tags, slots, positions.float(), conditions)


# -- condition rows (diffusers' `MiniMaxH3PrepareLayoutStep` / `MiniMaxH3Ref2VAPrepareLayoutStep`) ------------------
# The condition rows' grids follow diffusers' arithmetic to the float64 bit (numpy's linspace; numpy's pairwise sum
# for the last keyframe, a sequential sum for a reference video's span). The generated rows keep `spatial_grid`,
# which this model used before conditions existed (T2VA stays bit-identical); the two agree in float32, what the
# model consumes, except by one ulp on a few latent sizes (26 of 19602 axes up to 200 latents).


def reference_spatial_grid(latent_size: int, patch: int, sqrt_area: float) -> torch.Tensor:
    """`spatial_grid` computed as diffusers does: ``np.linspace(left, left + ratio, n, endpoint=False) * 32``."""
    ratio = latent_size / sqrt_area
    left = (1.0 - ratio) / 2.0
    grid = np.linspace(left, left + ratio, latent_size // patch, endpoint=False) * _SPATIAL_SCALE
    return torch.from_numpy(grid).to(torch.float64)


def _frame_grid(latent_h: int, latent_w: int, ph: int, pw: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[(h/ph)*(w/pw), 2] (h, w) positions of one latent frame, raster order, and the w axis they came from."""
    sqrt_area = float(np.sqrt(latent_h * latent_w))
    h_grid = reference_spatial_grid(latent_h, ph, sqrt_area)
    w_grid = reference_spatial_grid(latent_w, pw, sqrt_area)
    hh, ww = torch.meshgrid(h_grid, w_grid, indexing="ij")
    return torch.stack([hh.reshape(-1), ww.reshape(-1)], dim=-1), w_grid


def _audio_positions(latents: int, origin: float, w_grid: torch.Tensor, channels: int) -> torch.Tensor:
    """Channel-major audio rows: time origin + j, no h, channel 0 on the first w column and the others on the last."""
    positions = torch.zeros(channels * latents, 3, dtype=torch.float64)
    positions[:, 0] = (origin + torch.arange(latents, dtype=torch.float64)).repeat(channels)
    positions[:latents, 2] = float(w_grid[0])
    positions[latents:, 2] = float(w_grid[-1])
    return positions


def keyframe_layout(
    anchors: Sequence[str], *, text_rows: int, video_latent_thw: tuple[int, int, int], patch_size
) -> ConditionLayout:
    """FL2VA: one latent frame of rows per keyframe, in packed order, on the generated frame's grid. A "first"
    keyframe sits at the first generated frame's time (L); a "last" one at ``L + sum(spans) - 5/3`` (spans summed
    pairwise, as numpy does, as the release does)."""
    latent_t, latent_h, latent_w = video_latent_thw
    _, ph, pw = patch_size
    frame, _ = _frame_grid(latent_h, latent_w, ph, pw)
    segments = []
    for anchor in anchors:
        if anchor == "first":
            time = float(text_rows)
        elif anchor == "last":
            spans = np.ones(latent_t, dtype=np.float64) * _FRAME_RESCALE
            for offset, frames in enumerate(_FRAMES_PER_LATENT):
                spans[offset :: len(_FRAMES_PER_LATENT)] *= frames
            time = float(text_rows) + float(spans.sum()) - _FRAME_RESCALE
        else:
            raise ValueError(f"a keyframe anchor is 'first' or 'last', got {anchor!r}")
        positions = torch.empty(frame.shape[0], 3, dtype=torch.float64)
        positions[:, 0] = time
        positions[:, 1:] = frame
        segments.append(ConditionSegment(TAG_VIDEO, positions))
    return ConditionLayout(tuple(segments))


@dataclass(frozen=True)
class ReferenceGeometry:
    """One Ref2VA reference as the layout sees it: "image", "video" or "audio"; its encoded latent (t, h, w) (image
    and video) and its audio latents per channel (audio, and a video's soundtrack; 0 for none)."""

    kind: str
    video_latent_thw: tuple[int, int, int] | None = None
    audio_latents: int = 0


def reference_layout(
    references: Sequence[ReferenceGeometry],
    *,
    text_rows: int,
    video_latent_thw: tuple[int, int, int],
    patch_size,
    audio_channels: int,
) -> ConditionLayout:
    """Ref2VA: the references' rows in request order on one rotary clock that starts at L. An image is one latent
    frame at one time slot (+1); an audio reference is channel-major rows pinned to the generated canvas's w
    extremes (+its latents); a video reference is its soundtrack's rows (pinned to its own w extremes), then its
    frames, both from the same time (+max(audio latents, its frames' span)). The generated rows start where the
    clock stops."""
    _, ph, pw = patch_size
    _, target_w_grid = _frame_grid(video_latent_thw[1], video_latent_thw[2], ph, pw)
    clock = float(text_rows)
    segments = []
    for reference in references:
        if reference.kind == "image":
            _, latent_h, latent_w = reference.video_latent_thw
            frame, _ = _frame_grid(latent_h, latent_w, ph, pw)
            positions = torch.empty(_thw_rows(reference.video_latent_thw, ph, pw), 3, dtype=torch.float64)
            positions[:, 0] = clock
            positions[:, 1:] = frame.repeat(reference.video_latent_thw[0], 1)
            segments.append(ConditionSegment(TAG_VIDEO, positions))
            clock += 1.0
        elif reference.kind == "audio":
            segments.append(
                ConditionSegment(
                    TAG_AUDIO, _audio_positions(reference.audio_latents, clock, target_w_grid, audio_channels)
                )
            )
            clock += float(reference.audio_latents)
        elif reference.kind == "video":
            latent_t, latent_h, latent_w = reference.video_latent_thw
            frame, w_grid = _frame_grid(latent_h, latent_w, ph, pw)
            if reference.audio_latents:
                audio = _audio_positions(reference.audio_latents, clock, w_grid, audio_channels)
                segments.append(ConditionSegment(TAG_AUDIO, audio))
            positions = torch.empty(latent_t * frame.shape[0], 3, dtype=torch.float64)
            positions[:, 0] = latent_frame_times(latent_t, clock).repeat_interleave(frame.shape[0])
            positions[:, 1:] = frame.repeat(latent_t, 1)
            segments.append(ConditionSegment(TAG_VIDEO, positions))
            # summed one span after the other in float64, as the release does for this call site
            span = sum(_FRAME_RESCALE * _FRAMES_PER_LATENT[k % len(_FRAMES_PER_LATENT)] for k in range(latent_t))
            clock += max(float(reference.audio_latents), span)
        else:
            raise ValueError(f"a reference is an 'image', a 'video' or an 'audio', got {reference.kind!r}")
    return ConditionLayout(tuple(segments), media_origin=clock)


def _thw_rows(thw: tuple[int, int, int], ph: int, pw: int) -> int:
    return thw[0] * (thw[1] // ph) * (thw[2] // pw)


def patchify_video(video: torch.Tensor, patch_size: tuple[int, int, int]) -> torch.Tensor:
    """[B, C, T, H, W] -> [B, T'*H'*W', C*pt*ph*pw]; rows raster (t, h, w), features (c, pt, ph, pw)."""
    b, c, t, h, w = video.shape
    pt, ph, pw = patch_size
    x = video.reshape(b, c, t // pt, pt, h // ph, ph, w // pw, pw)
    x = x.permute(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(b, (t // pt) * (h // ph) * (w // pw), c * pt * ph * pw)


def unpatchify_video(tokens: torch.Tensor, latent_cthw: tuple[int, int, int, int], patch_size) -> torch.Tensor:
    """Inverse of `patchify_video`: [B, N, C*pt*ph*pw] -> [B, C, T, H, W]."""
    c, t, h, w = latent_cthw
    pt, ph, pw = patch_size
    b = tokens.shape[0]
    x = tokens.reshape(b, t // pt, h // ph, w // pw, c, pt, ph, pw)
    x = x.permute(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(b, c, t, h, w)
