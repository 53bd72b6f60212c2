"""Shared fixtures: long-lived gloo rank pools, one per world size, built on first use."""

from __future__ import annotations

import pytest

from tests.rank_pool import RankPool

_pools: dict[tuple[int, str], RankPool] = {}


def get_pool(world_size: int, device: str = "cpu") -> RankPool:
    key = (world_size, device)
    if key not in _pools:
        _pools[key] = RankPool(world_size, device)
    return _pools[key]


@pytest.fixture(params=[2, 4], ids=lambda w: f"W{w}")
def ranks(request) -> RankPool:
    """A gloo pool of 2 or 4 CPU ranks."""
    return get_pool(request.param)


@pytest.fixture
def ranks2() -> RankPool:
    return get_pool(2)


@pytest.fixture
def ranks4() -> RankPool:
    return get_pool(4)


def pytest_sessionfinish(session, exitstatus):
    for pool in _pools.values():
        pool.close()
    _pools.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Captured output with a lone surrogate (the hostile tests log model errors such as "\\udcff") spelled out, so
    that pytest-xdist can send the report from its worker: its channel refuses text that is not valid UTF-8."""
    outcome = yield
    report = outcome.get_result()
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8")) for title, text in report.sections
    ]
