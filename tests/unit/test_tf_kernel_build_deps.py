"""tf-kernel's `make build-deps` sees what the interpreter lacks (issue 28): run from tf-kernel/, a plain
`python -c 'import cmake'` imported the tf-kernel/cmake/ folder as a namespace package, so cmake was never
installed on a base without it and `make build-sm90` failed in the image with CMakeNotFoundError."""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_build_deps_lists_cmake_for_an_interpreter_without_it(tmp_path):
    assert (REPO / "tf-kernel" / "cmake").is_dir()  # the folder that shadowed the cmake package
    # An interpreter with none of the three build dependencies and no pip (so the install step fails at once and
    # offline), and a PATH without cmake or ninja binaries.
    venv.create(tmp_path / "bare", with_pip=False)
    python = tmp_path / "bare" / "bin" / "python"
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    done = subprocess.run(
        [shutil.which("make"), "-C", str(REPO / "tf-kernel"), "build-deps", f"PYTHON={python}"],
        env={"PATH": str(empty_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    wanted = [line for line in output.splitlines() if line.startswith("installing missing build dependencies:")]
    assert wanted, output
    assert wanted[0].split(":", 1)[1].split() == ["scikit-build-core", "cmake", "ninja"], output
    assert done.returncode != 0 and "could not install" in output, output  # no pip: it says so, nothing hangs
