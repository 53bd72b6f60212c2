"""Shared pytest setup for tf-kernel's tests.

The tests exercise the INSTALLED tf_kernel (make build-sm90 builds and installs it). The
tf_kernel/ directory of this source tree has no compiled library and no _build_info.py, so
it must never shadow the installed package: `python -m pytest` run from tf-kernel/ puts the
working directory on sys.path, and that entry is removed here before any test imports it.
"""

import os
import sys

_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_source_root(entry: str) -> bool:
    try:
        return os.path.samefile(entry or os.getcwd(), _SOURCE_ROOT)
    except OSError:
        return False


sys.path[:] = [p for p in sys.path if not _is_source_root(p)]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (deselect with -m 'not gpu')")
    config.addinivalue_line("markers", "slow: slow tests")
