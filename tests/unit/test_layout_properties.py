"""Property tests of the pitched-copy geometry over arbitrary strided layouts (hypothesis, CPU bytes).

For any input layout -- permuted dimensions, padded strides, a storage offset, rows that overlap or are expanded
(stride 0), fused-QKV-like pitches -- the communicator either reads the input as it lies or packs it once, and then
every rank's copies into every peer's output must: stay inside the source storage and the destination buffer, keep
pitch >= width (a `cudaMemcpy2DAsync` rule), cover each destination byte exactly once, and give exactly the
reference exchange. Outputs start as NaN, so a byte that no copy writes is caught by the exact comparison.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from telefuser.distributed.ulysses.layout import (
    Direction,
    PitchedCopy,
    copies_to_all_peers,
    plan_gather,
    plan_scatter,
    readable_layout,
)
from tools.harness.ulysses_reference import expected_gather, expected_scatter, rank_input, run_pitched_copy

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@st.composite
def exchanges(draw, direction: Direction):
    """(world, dtype, shape, strides, storage offset) of one rank's input; every rank uses the same layout."""
    world = draw(st.sampled_from([1, 2, 3, 4, 8]))
    b, s, hl, d = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    shape = [b, s, hl * world, d] if direction is Direction.SCATTER else [b, s * world, hl, d]
    strides = [0, 0, 0, 0]
    extent = 1
    # memory order, innermost first: mostly D then H (a layout the copy reads in place), else any permutation
    row_major = draw(st.booleans())
    order = [3, 2, *draw(st.permutations([0, 1]))] if row_major else draw(st.permutations(range(4)))
    for dim in order:
        # padding: none, a little, or whole extra rows (a fused [B, S, 3, H, D] view pads S by 2*H*D)
        pad = 0 if row_major and dim >= 2 else draw(st.sampled_from([0, 0, 1, 3, extent, 2 * extent]))
        strides[dim] = extent + pad
        extent = strides[dim] * shape[dim]
    special = draw(st.sampled_from(["none", "none", "expanded_rows", "expanded_batch", "overlapping_rows"]))
    if special == "expanded_rows" and shape[1] > 1:
        strides[1] = 0
    elif special == "expanded_batch" and shape[0] > 1:
        strides[0] = 0
    elif special == "overlapping_rows":  # rows exactly one copy width apart: read in place when heads lie inside
        strides[1] = shape[2] // world * shape[3] if direction is Direction.SCATTER else shape[2] * shape[3]
    offset = draw(st.integers(0, 7))
    return world, draw(st.sampled_from(DTYPES)), tuple(shape), tuple(strides), offset


def rank_inputs(world, dtype, shape, strides, offset, seed):
    size = offset + sum((n - 1) * stride for n, stride in zip(shape, strides)) + 1
    return [rank_input(seed, r, (size,), dtype).as_strided(shape, strides, offset) for r in range(world)]


def check_copy_bounds(src: torch.Tensor, dst: torch.Tensor, pc: PitchedCopy) -> None:
    for pitch in (pc.src_pitch, pc.dst_pitch):
        assert pitch >= pc.width, pc
    e = src.element_size()
    first = src.storage_offset() * e + pc.src_offset
    assert first >= 0 and first + (pc.batch - 1) * pc.src_batch_stride + (pc.height - 1) * pc.src_pitch + pc.width <= (
        src.untyped_storage().nbytes()
    ), pc
    last = pc.dst_offset + (pc.batch - 1) * pc.dst_batch_stride + (pc.height - 1) * pc.dst_pitch + pc.width
    assert pc.dst_offset >= 0 and last <= dst.numel() * dst.element_size(), pc


def exchange_and_compare(direction: Direction, case, seed: int) -> None:
    world, dtype, shape, strides, offset = case
    inputs = rank_inputs(world, dtype, shape, strides, offset, seed)
    sources = []
    for x in inputs:
        source, problem = readable_layout(x, world, direction)
        assert torch.equal(source, x)  # packing moves values, never changes them
        assert (source is x) == (problem is None), problem
        sources.append(source)
    plan_for = plan_scatter if direction is Direction.SCATTER else plan_gather
    plans = [plan_for(source, world) for source in sources]
    outputs = [torch.full(plans[0].out_shape, float("nan"), dtype=dtype) for _ in range(world)]
    written = [0] * world
    for rank in range(world):
        for peer, pc in copies_to_all_peers(plans[rank], rank):
            check_copy_bounds(sources[rank], outputs[peer], pc)
            run_pitched_copy(sources[rank], outputs[peer], pc)
            written[peer] += pc.batch * pc.height * pc.width
    expected_for = expected_scatter if direction is Direction.SCATTER else expected_gather
    dense = [x.contiguous() for x in inputs]
    for peer in range(world):
        assert written[peer] == outputs[peer].numel() * outputs[peer].element_size()  # with equality: each byte once
        assert torch.equal(outputs[peer], expected_for(dense, peer)), (peer, shape, strides, offset)


@settings(max_examples=150, deadline=None)
@given(case=exchanges(Direction.SCATTER), seed=st.integers(0, 2**16))
def test_scatter_of_any_layout_is_exact(case, seed):
    exchange_and_compare(Direction.SCATTER, case, seed)


@settings(max_examples=150, deadline=None)
@given(case=exchanges(Direction.GATHER), seed=st.integers(0, 2**16))
def test_gather_of_any_layout_is_exact(case, seed):
    exchange_and_compare(Direction.GATHER, case, seed)
