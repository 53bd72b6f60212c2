"""The images' build context (issue 28): .dockerignore keeps the host's environments, outputs, build trees and caches
out (a copied .venv carried its install stamp, so `make install` in the image skipped and kept a venv built for the
host's paths) and keeps every tracked file in.

The matcher follows Docker's rules (moby/patternmatcher, which podman and buildah use too): a pattern is relative to
the context root, `*` and `?` stay within one path segment, `**` spans any number of them, a pattern that matches a
directory excludes everything under it, `!` re-includes, and the last matching pattern decides."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# What a developer's checkout holds besides the sources: each must stay out of the images.
EXCLUDED = [
    ".git/HEAD",
    ".venv/.telefuser-installed",
    ".venv/bin/python",
    ".venv-aiperf/bin/python",
    "tools/aiperf/venv/bin/python",
    "outputs/demo/lingbot_world_v2.mp4",
    "build/lib/telefuser/cli.py",
    "dist/telefuser-0.1.0.tar.gz",
    "telefuser.egg-info/PKG-INFO",
    "tf-kernel/build/sm90-0123456789/CMakeCache.txt",
    "tf-kernel/dist/tf_kernel-0.1.0-py3-none-linux_x86_64.whl",
    "tf-kernel/tf_kernel/libtf_kernel_ops.so",
    "telefuser/__pycache__/cli.cpython-311.pyc",
    "tests/unit/__pycache__/conftest.cpython-311.pyc",
    ".pytest_cache/v/cache/nodeids",
    "tf-kernel/.pytest_cache/v/cache/nodeids",
    ".ruff_cache/CACHEDIR.TAG",
    ".hypothesis/examples/0/1",
    ".whl/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
]


def pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def read_rules(text: str) -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        rules.append((keep, pattern_regex(line.removeprefix("!").strip().strip("/"))))
    return rules


def excluded(path: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for keep, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            verdict = not keep
    return verdict


@pytest.fixture(scope="module")
def rules():
    path = REPO / ".dockerignore"
    assert path.is_file(), "no .dockerignore: COPY . . would copy .venv, .git and the host's build trees"
    return read_rules(path.read_text())


def test_the_matcher_follows_dockers_rules():
    rules = read_rules("a\n**/b\nc/*.txt\n!c/keep.txt\nd/\n")
    assert excluded("a/x/y", rules) and not excluded("x/a", rules)  # relative to the root
    assert excluded("b", rules) and excluded("x/y/b/z", rules)  # ** spans zero or more segments
    assert excluded("c/n.txt", rules) and not excluded("c/keep.txt", rules) and not excluded("c/x/n.txt", rules)
    assert excluded("d/e", rules)


@pytest.mark.parametrize("path", EXCLUDED)
def test_the_host_environments_outputs_and_build_trees_stay_out(rules, path):
    assert excluded(path, rules), f"{path} would be copied into the images"


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
def test_every_tracked_file_goes_in(rules):
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    dropped = [path for path in tracked.splitlines() if excluded(path, rules)]
    assert not dropped, f".dockerignore drops tracked files the builds may need: {dropped[:20]}"
