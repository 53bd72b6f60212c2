"""The packed joint sequence ``[text | audio | video | padding]``: each row's source, modality tag, timestep, position.

Padding (to a multiple of 64 and of the Ulysses degree) is its own attention document. Pure host bookkeeping; the
released packer's positions are spelled out in this folder's README.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...distributed.ulysses.sequence import rank_rows

PACKED_SEQUENCE_ALIGNMENT = 64

# Modality tags of the packed rows; the AdaLN table is indexed by max(tag, 0).
TAG_PAD, TAG_VIDEO, TAG_TEXT, TAG_AUDIO = -1, 0, 1, 2
# Which timestep a row is modulated with: text and padding rows use the video timestep (as in the release).
VIDEO_TIMESTEP, AUDIO_TIMESTEP = 0, 1

_SPATIAL_SCALE = 32.0
_FRAME_RESCALE = 5.0 / 3.0
_FRAMES_PER_LATENT = (1, 4, 4, 4, 4)


@dataclass(frozen=True)
class PackedLayout:
    text_rows: int
    audio_rows: int
    video_rows: int
    seq_len: int  # including padding
    tags: torch.Tensor  # [S] long
    timestep_slots: torch.Tensor  # [S] long: VIDEO_TIMESTEP or AUDIO_TIMESTEP
    positions: torch.Tensor  # [S, 3] float32 (t, h, w)

    @property
    def used(self) -> int:
        return self.text_rows + self.audio_rows + self.video_rows

    @property
    def text(self) -> slice:
        return slice(0, self.text_rows)

    @property
    def audio(self) -> slice:
        return slice(self.text_rows, self.text_rows + self.audio_rows)

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
) -> PackedLayout:
    """The layout of one text-to-video+audio request; `multiple_of` is the Ulysses degree."""
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
    used = text_rows + audio_rows + video_rows
    seq_len = packed_length(used, alignment=alignment, multiple_of=multiple_of)

    text = slice(0, text_rows)
    audio = slice(text.stop, text.stop + audio_rows)
    video = slice(audio.stop, used)
    tags = torch.full((seq_len,), TAG_PAD, dtype=torch.long)
    slots = torch.full((seq_len,), VIDEO_TIMESTEP, dtype=torch.long)
    positions = torch.zeros(seq_len, 3, dtype=torch.float64)

    tags[text], tags[audio], tags[video] = TAG_TEXT, TAG_AUDIO, TAG_VIDEO
    slots[audio] = AUDIO_TIMESTEP
    positions[text, 0] = torch.arange(text_rows, dtype=torch.float64)

    sqrt_area = math.sqrt(latent_h * latent_w)
    h_grid = spatial_grid(latent_h, ph, sqrt_area)
    w_grid = spatial_grid(latent_w, pw, sqrt_area)
    hh, ww = torch.meshgrid(h_grid, w_grid, indexing="ij")
    video_pos = positions[video].view(latent_t, frame_rows, 3)
    video_pos[:, :, 0] = latent_frame_times(latent_t, float(text_rows))[:, None]
    video_pos[:, :, 1] = hh.reshape(-1)
    video_pos[:, :, 2] = ww.reshape(-1)

    audio_t = audio_rows // audio_channels
    audio_pos = positions[audio].view(audio_channels, audio_t, 3)
    audio_pos[:, :, 0] = float(text_rows) + torch.arange(audio_t, dtype=torch.float64)
    audio_pos[0, :, 2] = float(w_grid[0])
    audio_pos[1:, :, 2] = float(w_grid[-1])

    # The released model consumes fp32 positions.
    return PackedLayout(text_rows, audio_rows, video_rows, seq_len, tags, slots, positions.float())


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
