"""Pure-Python helpers for loading tf_kernel; imports neither torch nor the extension."""

from __future__ import annotations

import glob
import os
from typing import Any, Mapping, Optional

__all__ = ["check_build_compatibility", "find_library", "REBUILD_HINT"]

REBUILD_HINT = "rebuild it against the running torch: make -C tf-kernel build-sm90 PYTHON=<this python>"


def check_build_compatibility(
    build_info: Mapping[str, Any],
    running_torch_version: str,
    running_cuda: Optional[str],
) -> None:
    """Raise ImportError unless the running torch is the one tf_kernel was built against.

    The extension links libtorch_cpu/libc10 and uses their C++ ABI, which is only stable
    within one exact torch build. Loading it into another torch could crash the process or
    fail to resolve symbols, so ``tf_kernel/__init__.py`` calls this BEFORE loading the
    shared library. Both ``torch.__version__`` (e.g. ``2.11.0+cu130``) and
    ``torch.version.cuda`` (``None`` for a CPU build) must match exactly.

    Args:
        build_info: ``tf_kernel._build_info.BUILD_INFO`` (needs ``torch_version`` and
            ``torch_cuda_version``).
        running_torch_version: ``torch.__version__`` of the running interpreter.
        running_cuda: ``torch.version.cuda`` of the running interpreter.
    """
    if "torch_version" not in build_info or "torch_cuda_version" not in build_info:
        raise ImportError(
            "tf_kernel: the recorded build info lacks torch_version/torch_cuda_version; " + REBUILD_HINT
        )
    built_torch = build_info["torch_version"]
    built_cuda = build_info["torch_cuda_version"]
    problems = []
    if str(built_torch) != str(running_torch_version):
        problems.append(f"torch {built_torch} at build time vs torch {running_torch_version} now")
    if built_cuda != running_cuda:
        problems.append(f"torch.version.cuda {built_cuda!r} at build time vs {running_cuda!r} now")
    if problems:
        raise ImportError(
            "tf_kernel was built against a different torch than the one running ("
            + "; ".join(problems)
            + "). Refusing to load its shared library (the C++ ABI is not compatible); "
            + REBUILD_HINT
        )


def find_library(package_dir: str) -> str:
    """Path of the built extension library inside the installed package."""
    candidates = sorted(glob.glob(os.path.join(package_dir, "sm90", "libtf_kernel_ops*.so")))
    if not candidates:
        raise ImportError(
            f"tf_kernel: no compiled library found under {os.path.join(package_dir, 'sm90')}; "
            "is this the source tree rather than an installed build? Build and install it with "
            "make -C tf-kernel build-sm90 PYTHON=<python>"
        )
    return candidates[0]
