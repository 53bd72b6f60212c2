"""The engine's CUDA allocator settings (memory/allocator.py), on the CPU: what it sets and leaves, and the switch
around CUDA IPC buffers (its effect on real segments is tests/gpu/test_allocator_ipc_cuda.py)."""

from __future__ import annotations

import pytest

from telefuser.memory import allocator


def test_the_engine_sets_expandable_segments_unless_the_user_chose(monkeypatch):
    monkeypatch.setenv(allocator.ALLOC_CONF, "recorded")  # so that the variable the engine writes is undone after
    monkeypatch.delenv(allocator.ALLOC_CONF)
    assert allocator.configure_cuda_allocator() == "expandable_segments:True"
    monkeypatch.setenv(allocator.ALLOC_CONF, "max_split_size_mb:512")
    assert allocator.configure_cuda_allocator() == "max_split_size_mb:512"  # the user's, untouched


@pytest.mark.parametrize(
    "conf, switched",
    [("expandable_segments:True", True), ("max_split_size_mb:64, expandable_segments:True", True),
     ("expandable_segments:False", False), (None, False)],
)  # fmt: skip
def test_ipc_buffers_switch_expandable_segments_off_and_back(monkeypatch, conf, switched):
    if conf is None:
        monkeypatch.delenv(allocator.ALLOC_CONF, raising=False)
    else:
        monkeypatch.setenv(allocator.ALLOC_CONF, conf)
    calls = []
    monkeypatch.setattr(allocator, "set_allocator_settings", calls.append)
    with pytest.raises(RuntimeError), allocator.ipc_shareable_segments():
        assert calls == (["expandable_segments:False"] if switched else [])
        raise RuntimeError("an allocation failed")  # the setting comes back on the way out all the same
    assert calls == (["expandable_segments:False", "expandable_segments:True"] if switched else [])
