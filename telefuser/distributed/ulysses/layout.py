"""Pure shape and stride rules for the Ulysses exchange: who sends which head slice where, pitches, validation.

Nothing here touches a device or a process group, so every rule is tested on CPU. Any input layout is valid data:
one the pitched copy cannot read is packed locally, so strides never make ranks' calls differ.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class UlyssesInputError(ValueError):
    """A Ulysses call got an input it cannot move; raised identically on every rank."""


class Direction(str, enum.Enum):
    SCATTER = "scatter"  # [B, S_local, H, D] -> [B, S_global, H/W, D]
    GATHER = "gather"  # [B, S_global, H_local, D] -> [B, S_local, H_local*W, D]
    ALL_GATHER = "all_gather"  # [B, S_local, 1, C] -> [B, S_local*W, 1, C]: every rank's rows, in rank order


@dataclass(frozen=True)
class UlyssesLayout:
    """Everything a backend needs to move one tensor; derived from the input alone."""

    direction: Direction
    world_size: int
    batch: int
    local_seq: int  # S: rows each rank owns before scatter / after gather
    heads_per_rank: int  # H/W: heads each rank owns after scatter / before gather
    head_dim: int
    dtype: torch.dtype
    in_shape: tuple[int, int, int, int]
    out_shape: tuple[int, int, int, int]
    in_strides: tuple[int, int, int, int]  # in elements

    @property
    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def row_elems(self) -> int:
        """Elements of one rank's head slice in one sequence row: the width of every pitched copy."""
        return self.heads_per_rank * self.head_dim

    def signature(self) -> tuple:
        """What all ranks must agree on for this call. Strides are not part of it: they are a local matter."""
        return (self.direction.value, self.in_shape, self.dtype)


def describe(x: torch.Tensor) -> str:
    return f"shape={tuple(x.shape)} stride={tuple(x.stride())} dtype={str(x.dtype).removeprefix('torch.')}"


def _check_common(x: object, world_size: int, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise UlyssesInputError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise UlyssesInputError(f"{what}: expected a 4-D tensor [B, S, H, D], got {x.dim()}-D ({describe(x)})")
    if x.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise UlyssesInputError(f"{what}: dtype {str(x.dtype).removeprefix('torch.')} is not supported ({names})")
    if x.numel() == 0:
        raise UlyssesInputError(f"{what}: the tensor is empty ({describe(x)})")
    if world_size < 1:
        raise UlyssesInputError(f"{what}: world size must be >= 1, got {world_size}")
    return x


def layout_problem(x: torch.Tensor, width_elems: int) -> str | None:
    """Why a pitched copy of `width_elems`-wide row slices cannot read `x` as it lies, or None when it can.

    Heads and head channels must be contiguous within a row, and consecutive rows at least one copy width apart (a
    pitch below the width, as in an expanded ``stride(1) == 0`` input, is not a 2-D copy). Overlapping rows or batch
    items are fine: the copy only reads them."""
    _, s, h, d = x.shape
    _, ss, sh, sd = x.stride()
    if d > 1 and sd != 1:
        return f"head channels are not contiguous (stride(3)={sd})"
    if h > 1 and sh != d:
        return f"heads are not contiguous within a row (stride(2)={sh}, D={d})"
    if s > 1 and ss < width_elems:
        return f"rows are closer than one copy width (stride(1)={ss} < {width_elems})"
    return None


def readable_layout(x: torch.Tensor, world_size: int, direction: Direction) -> tuple[torch.Tensor, str | None]:
    """(`x`, None) when the pitched copy reads `x` as it lies, else (a packed copy of `x`, why it was packed).

    `x` must already have passed `_check_common` and the divisibility rules."""
    if direction is Direction.ALL_GATHER:  # one whole row per copy: any packed layout reads as it lies
        return (x, None) if x.is_contiguous() else (x.contiguous(), "rows are gathered from a contiguous tensor")
    width = x.shape[2] // world_size * x.shape[3] if direction is Direction.SCATTER else x.shape[2] * x.shape[3]
    problem = layout_problem(x, width)
    if problem is None:
        return x, None
    return x.contiguous(), problem


def _pitch_strides(x: torch.Tensor) -> tuple[int, int, int, int]:
    """The input's strides as the copies use them: a size-1 dimension's stride is meaningless, so it is replaced by
    the one a contiguous tensor would have (a pitch is then never below the row width)."""
    b, s, h, d = x.shape
    sb, ss, sh, sd = x.stride()
    sd = 1 if d == 1 else sd
    sh = d if h == 1 else sh
    ss = h * d if s == 1 else ss
    sb = s * ss if b == 1 else sb
    return sb, ss, sh, sd


def _check_readable(x: torch.Tensor, width_elems: int, what: str) -> None:
    problem = layout_problem(x, width_elems)
    if problem is not None:
        raise UlyssesInputError(
            f"{what}: the pitched copy cannot read this layout ({describe(x)}): {problem}; pack it first "
            "(UlyssesCommunicator does that itself, see readable_layout)"
        )


def check_scatter(x: object, world_size: int) -> torch.Tensor:
    """The value rules of a scatter input (type, rank, dtype, size, divisibility); layouts are not checked here."""
    _check_common(x, world_size, "scatter_heads")
    h = x.shape[2]
    if h % world_size:
        raise UlyssesInputError(
            f"scatter_heads: {h} heads cannot be split evenly over the Ulysses degree {world_size} ({describe(x)})"
        )
    return x


def check_gather(y: object, world_size: int) -> torch.Tensor:
    """The value rules of a gather input; layouts are not checked here."""
    _check_common(y, world_size, "gather_heads")
    sg = y.shape[1]
    if sg % world_size:
        raise UlyssesInputError(
            f"gather_heads: the global sequence length {sg} is not divisible by the Ulysses degree {world_size} "
            f"({describe(y)})"
        )
    return y


def plan_scatter(x: torch.Tensor, world_size: int) -> UlyssesLayout:
    """Describe the exchange of a scatter input that the pitched copy can read. Raises UlyssesInputError."""
    check_scatter(x, world_size)
    b, s, h, d = x.shape
    hl = h // world_size
    _check_readable(x, hl * d, "scatter_heads")
    return UlyssesLayout(
        Direction.SCATTER, world_size, b, s, hl, d, x.dtype, (b, s, h, d), (b, s * world_size, hl, d), _pitch_strides(x)
    )


def plan_gather(y: torch.Tensor, world_size: int) -> UlyssesLayout:
    """Describe the exchange of a gather input that the pitched copy can read. Raises UlyssesInputError."""
    check_gather(y, world_size)
    b, sg, hl, d = y.shape
    _check_readable(y, hl * d, "gather_heads")
    s = sg // world_size
    return UlyssesLayout(
        Direction.GATHER,
        world_size,
        b,
        s,
        hl,
        d,
        y.dtype,
        (b, sg, hl, d),
        (b, s, hl * world_size, d),
        _pitch_strides(y),
    )


def check_all_gather(x: object, world_size: int) -> torch.Tensor:
    """The value rules of a row gather input ``[B, S_local, C]``."""
    if isinstance(x, torch.Tensor) and x.dim() != 3:
        raise UlyssesInputError(f"gather_rows: expected a 3-D tensor [B, S, C], got {x.dim()}-D ({describe(x)})")
    if isinstance(x, torch.Tensor):
        _check_common(x.unsqueeze(2), world_size, "gather_rows")
        return x
    return _check_common(x, world_size, "gather_rows")


def plan_all_gather(x: torch.Tensor, world_size: int) -> UlyssesLayout:
    """Describe the gather of every rank's rows ``[B, S_local, C]`` (contiguous) into ``[B, W*S_local, C]`` on every
    rank: the scatter's geometry with one whole row per peer. Raises UlyssesInputError."""
    check_all_gather(x, world_size)
    if not x.is_contiguous():
        raise UlyssesInputError(f"gather_rows: the rows must be contiguous ({describe(x)})")
    b, s, c = x.shape
    return UlyssesLayout(
        Direction.ALL_GATHER, world_size, b, s, 1, c, x.dtype, (b, s, 1, c), (b, s * world_size, 1, c), (s * c, c, c, 1)
    )


@dataclass(frozen=True)
class PitchedCopy:
    """One 2-D copy per batch item, in bytes: what `cudaMemcpy2DAsync` (or a fake) executes."""

    src_offset: int
    src_pitch: int
    src_batch_stride: int
    dst_offset: int
    dst_pitch: int
    dst_batch_stride: int
    width: int
    height: int
    batch: int

    @property
    def values(self) -> tuple[int, ...]:
        """The fields in declaration order (source offset, pitch, batch stride; the same for the destination; width,
        height, batch): the order tf-kernel's copy ops take them in."""
        return dataclasses.astuple(self)


def pitched_copy_to_peer(plan: UlyssesLayout, rank: int, peer: int) -> PitchedCopy:
    """Geometry of rank `rank`'s copy into `peer`'s final output tensor (contiguous `plan.out_shape`).

    Scatter: read head slice `peer` of every local row; write it at rows `[rank*S, (rank+1)*S)` of the peer's output.
    Gather: read rows `[peer*S, (peer+1)*S)` of the local heads; write them at head slice `rank` of the peer's rows.
    Row gather: read every local row whole; write it at rows `[rank*S, (rank+1)*S)` of the peer's output.
    The source offset is relative to the input's first element (its data_ptr).
    """
    if not (0 <= rank < plan.world_size and 0 <= peer < plan.world_size):
        raise ValueError(f"rank {rank} / peer {peer} outside world size {plan.world_size}")
    e = plan.element_size
    sb, ss, _, _ = plan.in_strides
    width = plan.row_elems * e
    s, w = plan.local_seq, plan.world_size
    if plan.direction is not Direction.GATHER:  # a scatter sends head slice `peer`; a row gather the whole row
        return PitchedCopy(
            src_offset=peer * plan.row_elems * e if plan.direction is Direction.SCATTER else 0,
            src_pitch=ss * e,
            src_batch_stride=sb * e,
            dst_offset=rank * s * width,
            dst_pitch=width,
            dst_batch_stride=w * s * width,
            width=width,
            height=s,
            batch=plan.batch,
        )
    return PitchedCopy(
        src_offset=peer * s * ss * e,
        src_pitch=ss * e,
        src_batch_stride=sb * e,
        dst_offset=rank * width,
        dst_pitch=w * width,
        dst_batch_stride=s * w * width,
        width=width,
        height=s,
        batch=plan.batch,
    )


def packed_source(x, plan: UlyssesLayout):
    """Ablation of the pitched path: pack the input destination-major ([W, B, S, Hl, D], one copy on the caller's
    stream) so that every peer's chunk is contiguous. Only meaningful for scatter."""
    w, hl = plan.world_size, plan.heads_per_rank
    return x.unflatten(2, (w, hl)).permute(2, 0, 1, 3, 4).contiguous()


def flat_copy_to_peer(plan: UlyssesLayout, rank: int, peer: int) -> PitchedCopy:
    """Geometry of a copy from `packed_source(x)` (contiguous rows) into the peer's output: the flat-copy ablation."""
    e = plan.element_size
    width = plan.row_elems * e
    s, w, b = plan.local_seq, plan.world_size, plan.batch
    return PitchedCopy(
        src_offset=peer * b * s * width,
        src_pitch=width,
        src_batch_stride=s * width,
        dst_offset=rank * s * width,
        dst_pitch=width,
        dst_batch_stride=w * s * width,
        width=width,
        height=s,
        batch=b,
    )


@functools.lru_cache(maxsize=512)
def copies_to_all_peers(plan: UlyssesLayout, rank: int, packed: bool = False) -> tuple[tuple[int, PitchedCopy], ...]:
    """(peer, geometry) for every peer, starting with `rank` itself so that the writes spread over peers.

    Cached: a model repeats the same few plans every layer and step, and the submission path is latency-critical."""
    geometry_for = flat_copy_to_peer if packed else pitched_copy_to_peer
    order = [(rank + i) % plan.world_size for i in range(plan.world_size)]
    return tuple((peer, geometry_for(plan, rank, peer)) for peer in order)
