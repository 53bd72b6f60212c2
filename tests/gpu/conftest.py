"""GPU suite: several processes share the one GPU over a gloo group (CUDA IPC works across them; NCCL and Symmetric
Memory need one GPU per rank and run in the multi-GPU validation instead). Everything skips, with the reason, when
there is no CUDA GPU; the tests marked ``tf_kernel`` (the copy engine's) also when tf-kernel is not built."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import get_pool


def _tf_kernel_missing() -> str | None:
    try:
        import tf_kernel  # noqa: F401
    except ImportError as exc:
        return f"tf-kernel is not built for this interpreter ({exc}); run make build-sm90"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "tests/gpu" in str(item.fspath)]
    no_gpu = None if torch.cuda.is_available() else "no CUDA GPU on this machine"
    no_tf_kernel = _tf_kernel_missing() if gpu_items and not no_gpu else None
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if no_gpu:
            item.add_marker(pytest.mark.skip(reason=no_gpu))
        elif no_tf_kernel and item.get_closest_marker("tf_kernel"):
            item.add_marker(pytest.mark.skip(reason=no_tf_kernel))


@pytest.fixture(params=[2, 4], ids=lambda w: f"{w}procs")
def gpu_ranks(request):
    return get_pool(request.param, "cuda")


@pytest.fixture
def gpu_ranks2():
    return get_pool(2, "cuda")
