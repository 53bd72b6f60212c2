"""ParallelConfig rules (pure)."""

from __future__ import annotations

import pytest

from telefuser.distributed.mesh import ParallelConfig, ParallelConfigError


def test_tp_is_innermost_for_tp2_ulysses2():
    ulysses, tp = ParallelConfig(ulysses_degree=2, tp_degree=2).group_ranks()
    assert tp == [[0, 1], [2, 3]]
    assert ulysses == [[0, 2], [1, 3]]
    assert ParallelConfig(2, 2).coordinates(3) == (1, 1)
    assert ParallelConfig(2, 2).coordinates(2) == (1, 0)


def test_eight_ranks_tp2_ulysses4():
    ulysses, tp = ParallelConfig(ulysses_degree=4, tp_degree=2).group_ranks()
    assert tp == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert ulysses == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize(
    "kwargs", [dict(ulysses_degree=0), dict(tp_degree=-1), dict(ulysses_degree=1.5), dict(tp_degree=True)]
)
def test_degrees_must_be_positive_integers(kwargs):
    with pytest.raises(ParallelConfigError, match="must be a positive integer"):
        ParallelConfig(**kwargs)


def test_world_size_must_match():
    with pytest.raises(ParallelConfigError, match="world size 3 does not match ulysses_degree x tp_degree = 2 x 2 = 4"):
        ParallelConfig(2, 2).check_world_size(3)


def test_heads_must_divide():
    ParallelConfig(ulysses_degree=2, tp_degree=2).check_heads(56)  # MiniMax H3: 28 per TP rank, 14 after scatter
    with pytest.raises(ParallelConfigError, match="cannot be split over tp_degree 2"):
        ParallelConfig(1, 2).check_heads(5)
    with pytest.raises(
        ParallelConfigError, match="40 attention heads give 20 heads per TP rank, which ulysses_degree 3"
    ):
        ParallelConfig(3, 2).check_heads(40)
