"""Pure layout rules: validation and the pitched-copy geometry, checked by executing the copies on CPU bytes."""

from __future__ import annotations

import pytest
import torch

from telefuser.distributed.ulysses.layout import (
    Direction,
    UlyssesInputError,
    pitched_copy_to_peer,
    plan_gather,
    plan_scatter,
    readable_layout,
)
from tools.harness.ulysses_reference import expected_gather, expected_scatter, rank_input, run_pitched_copy


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fused", [False, True], ids=["contiguous", "fused_v_view"])
def test_pitched_scatter_geometry_builds_exact_outputs(world, dtype, fused):
    b, s, h, d = 2, 3, 2 * world, 4
    if fused:  # the V view of a fused [B, S, 3, H, D] projection: rows at a 3*H*D pitch
        inputs = [rank_input(7, r, (b, s, 3, h, d), dtype)[:, :, 2] for r in range(world)]
    else:
        inputs = [rank_input(7, r, (b, s, h, d), dtype) for r in range(world)]
    plans = [plan_scatter(x, world) for x in inputs]
    outputs = [torch.full(plans[0].out_shape, float("nan"), dtype=dtype) for _ in range(world)]  # poisoned
    for rank in range(world):
        for peer in range(world):
            run_pitched_copy(inputs[rank], outputs[peer], pitched_copy_to_peer(plans[rank], rank, peer))
    for peer in range(world):
        assert torch.equal(outputs[peer], expected_scatter(inputs, peer))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_pitched_gather_geometry_builds_exact_outputs(world):
    b, s, hl, d = 2, 3, 2, 4
    inputs = [rank_input(8, r, (b, s * world, hl, d), torch.bfloat16) for r in range(world)]
    plans = [plan_gather(y, world) for y in inputs]
    outputs = [torch.full(plans[0].out_shape, float("nan"), dtype=torch.bfloat16) for _ in range(world)]
    for rank in range(world):
        for peer in range(world):
            run_pitched_copy(inputs[rank], outputs[peer], pitched_copy_to_peer(plans[rank], rank, peer))
    for peer in range(world):
        assert torch.equal(outputs[peer], expected_gather(inputs, peer))


def test_plan_fields():
    x = torch.randn(1, 5, 3, 8, 16)[:, :, 1]
    plan = plan_scatter(x, 4)
    assert plan.direction is Direction.SCATTER
    assert plan.out_shape == (1, 20, 2, 16) and plan.row_elems == 32 and plan.element_size == 4
    assert plan.in_strides == (5 * 3 * 8 * 16, 3 * 8 * 16, 16, 1)
    pc = pitched_copy_to_peer(plan, rank=1, peer=3)
    assert (pc.src_offset, pc.src_pitch, pc.dst_offset, pc.dst_pitch, pc.width, pc.height) == (
        3 * 32 * 4,
        3 * 8 * 16 * 4,
        5 * 32 * 4,
        32 * 4,
        32 * 4,
        5,
    )
    assert plan.signature() == ("scatter", (1, 5, 8, 16), torch.float32)
    with pytest.raises(ValueError, match="outside world size"):
        pitched_copy_to_peer(plan, rank=4, peer=0)


@pytest.mark.parametrize(
    "make, world, message",
    [
        (lambda: torch.randn(2, 4, 8), 2, "expected a 4-D tensor"),
        (lambda: torch.randn(1, 4, 6, 8), 4, "6 heads cannot be split evenly over the Ulysses degree 4"),
        (lambda: torch.randn(1, 4, 4, 8).to(torch.int8), 2, "dtype int8 is not supported"),
        (lambda: torch.randn(1, 0, 4, 8), 2, "the tensor is empty"),
        (lambda: torch.randn(1, 8, 4, 4).transpose(1, 2), 2, "heads are not contiguous within a row"),
        (lambda: torch.randn(1, 4, 4, 16)[..., ::2], 2, "head channels are not contiguous"),
        (lambda: torch.randn(1, 1, 4, 8).expand(1, 4, 4, 8), 2, r"rows are closer than one copy width \(stride\(1\)=0"),
    ],
)
def test_scatter_validation_messages(make, world, message):
    with pytest.raises(UlyssesInputError, match=message):
        plan_scatter(make(), world)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(1, 8, 4, 4).transpose(1, 2),  # heads strided within a row
        lambda: torch.randn(1, 4, 4, 16)[..., ::2],  # channels strided
        lambda: torch.randn(1, 1, 4, 8).expand(1, 4, 4, 8),  # expanded rows: stride(1) == 0
        lambda: torch.randn(2, 1, 4, 8).expand(2, 3, 4, 8),
    ],
    ids=["heads_strided", "channels_strided", "expanded_rows", "expanded_rows_batch2"],
)
def test_unreadable_layouts_are_packed_with_one_copy(make):
    x = make()
    packed, problem = readable_layout(x, 2, Direction.SCATTER)
    assert problem is not None and packed.is_contiguous() and torch.equal(packed, x)
    assert plan_scatter(packed, 2).signature() == ("scatter", tuple(x.shape), x.dtype)


@pytest.mark.parametrize("world", [2, 4])
def test_overlapping_source_rows_and_batches_are_read_in_place(world):
    """Only destinations must not overlap: a source whose rows (or batch items) overlap is read as it lies."""
    h, d, s = 2 * world, 4, 3
    width = h // world * d
    rows = [rank_input(10, r, (64 * world,), torch.float32) for r in range(world)]
    inputs = [t.as_strided((2, s, h, d), (width, width, d, 1)) for t in rows]  # rows one copy width apart
    for x in inputs:
        assert readable_layout(x, world, Direction.SCATTER)[1] is None
    plans = [plan_scatter(x, world) for x in inputs]
    outputs = [torch.full(plans[0].out_shape, float("nan")) for _ in range(world)]
    for rank in range(world):
        for peer in range(world):
            run_pitched_copy(inputs[rank], outputs[peer], pitched_copy_to_peer(plans[rank], rank, peer))
    for peer in range(world):
        assert torch.equal(outputs[peer], expected_scatter([x.contiguous() for x in inputs], peer))


def test_signature_ignores_strides_and_size_one_dimensions_get_canonical_strides():
    fused = torch.randn(1, 5, 3, 4, 8)
    view, contiguous = fused[:, :, 2], fused[:, :, 2].contiguous()
    assert plan_scatter(view, 2).signature() == plan_scatter(contiguous, 2).signature()
    odd = torch.randn(1, 1, 4, 8).as_strided((1, 1, 4, 8), (7, 3, 8, 1))  # strides of size-1 dims are meaningless
    plan = plan_scatter(odd, 2)
    assert plan.in_strides == (32, 32, 8, 1)
    assert pitched_copy_to_peer(plan, 0, 1).src_pitch >= pitched_copy_to_peer(plan, 0, 1).width


def test_gather_validation_messages():
    with pytest.raises(UlyssesInputError, match="global sequence length 5 is not divisible by the Ulysses degree 2"):
        plan_gather(torch.randn(1, 5, 2, 8), 2)
    assert plan_gather(torch.randn(1, 6, 2, 8), 2).out_shape == (1, 3, 4, 8)


@pytest.mark.parametrize("world", [2, 4])
def test_packed_flat_ablation_geometry_builds_exact_outputs(world):
    from telefuser.distributed.ulysses.layout import flat_copy_to_peer, packed_source

    inputs = [rank_input(9, r, (2, 3, 3, 2 * world, 4), torch.float16)[:, :, 2] for r in range(world)]
    plans = [plan_scatter(x, world) for x in inputs]
    outputs = [torch.full(plans[0].out_shape, float("nan"), dtype=torch.float16) for _ in range(world)]
    for rank in range(world):
        packed = packed_source(inputs[rank], plans[rank])
        for peer in range(world):
            run_pitched_copy(packed, outputs[peer], flat_copy_to_peer(plans[rank], rank, peer))
    for peer in range(world):
        assert torch.equal(outputs[peer], expected_scatter(inputs, peer))
