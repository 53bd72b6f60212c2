"""GPU suite: several processes share the one GPU over a gloo group (CUDA IPC works across them; NCCL and Symmetric
Memory need one GPU per rank and run in the multi-GPU validation instead). Everything skips, with the reason, when
there is no CUDA GPU or tf-kernel is not built."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import get_pool


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    try:
        import tf_kernel  # noqa: F401
    except ImportError as exc:
        return f"tf-kernel is not built for this interpreter ({exc}); run make build-sm90"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(params=[2, 4], ids=lambda w: f"{w}procs")
def gpu_ranks(request):
    return get_pool(request.param, "cuda")


@pytest.fixture
def gpu_ranks2():
    return get_pool(2, "cuda")
