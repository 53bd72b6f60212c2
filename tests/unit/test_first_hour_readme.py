"""Issue 36's newcomer test: the README's quickstart, run as written, so the README cannot drift from what works.

The blocks are the README's fenced blocks whose info string names them (```bash quickstart-video, ```python
quickstart-video-sdk, ```bash quickstart-stream). Each runs literally in a fresh directory that holds the repository's
`examples/` (the README runs them from a clone's root), with this environment's `bin/` first on PATH; the one change
is the port (8000 or 8088 becomes a free one, so the test never collides with a server already running). The install
block is not run (it downloads); the extras it names must exist.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from telefuser.media import probe_media

REPO = Path(__file__).resolve().parents[2]
FENCED = re.compile(r"^```(\w+) ([\w-]+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def readme_blocks() -> dict[str, tuple[str, str]]:
    """{name: (language, body)} of the README's named blocks."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return {name: (language, body) for language, name, body in FENCED.findall(text)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def commands(body: str) -> list[str]:
    return [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]


class Shell:
    """A README block run by bash in its own process group (it leaves its server running in the background)."""

    def __init__(self, script: str, cwd: Path, name: str):
        self.log = cwd / f"{name}.log"
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                ["bash", "-e", "-o", "pipefail", "-c", script],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def finish(self, timeout_s: float) -> str:
        self.proc.wait(timeout_s)
        output = self.log.read_text()
        assert self.proc.returncode == 0, output[-4000:]
        return output

    def stop(self) -> None:
        """SIGTERM to the group (the background server too); wait until every member has gone."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture
def clone(tmp_path) -> Path:
    """A directory that looks like a clone's root to the quickstart (it reads examples/...)."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return tmp_path


def test_the_readme_names_its_quickstart_blocks_and_installs_what_exists():
    blocks = readme_blocks()
    assert {"install", "quickstart-video", "quickstart-video-sdk", "quickstart-stream"} <= set(blocks), list(blocks)
    assert [blocks[name][0] for name in ("quickstart-video", "quickstart-video-sdk", "quickstart-stream")] == [
        "bash",
        "python",
        "bash",
    ]
    assert len(commands(blocks["quickstart-video"][1])) == 3 and len(commands(blocks["quickstart-stream"][1])) == 3
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in re.findall(r'"\.\[(\w+)\]"', blocks["install"][1]):
        assert extra in extras, extra
    assert "serve" in re.findall(r'"\.\[(\w+)\]"', blocks["install"][1])
    # the first screen: what it is for whom, before any command
    top = (REPO / "README.md").read_text(encoding="utf-8").split("```", 1)[0]
    assert "telefuser serve" in top and "telefuser serve-stream" in top and len(top.splitlines()) < 30


def test_the_video_quickstart_makes_an_mp4_with_curl_and_with_the_openai_sdk(clone):
    pytest.importorskip("openai", reason="the openai package is in the dev extra")
    blocks = readme_blocks()
    port = str(free_port())
    video = blocks["quickstart-video"][1]
    assert video.count("8000") >= 3, video
    shell = Shell(video.replace("8000", port), clone, "video")
    try:
        log = shell.finish(120)
        info = probe_media(clone / "fox.mp4")
        assert info.video_frames > 0 and info.has_audio, info
        assert "fake-MiniMax-H3 (a fake model" in log, log[-3000:]  # the start line says what runs

        sdk = blocks["quickstart-video-sdk"][1]
        assert "8000" in sdk
        (clone / "fox.py").write_text(sdk.replace("8000", port))
        done = subprocess.run(
            [sys.executable, "fox.py"], cwd=clone, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert " completed " in done.stdout and "fake" not in done.stderr, done.stdout
        info = probe_media(clone / "fox_sdk.mp4")
        assert 4 * 24 <= info.video_frames < 5 * 24 and info.has_audio, info  # seconds="4", snapped up to the grid
    finally:
        shell.stop()


def test_the_stream_quickstart_runs_a_session_with_curl(clone):
    stream = readme_blocks()["quickstart-stream"][1]
    port = str(free_port())
    assert stream.count("8088") >= 2, stream
    shell = Shell(stream.replace("8088", port), clone, "stream")
    try:
        log = shell.finish(120)
    finally:
        shell.stop()
    events = re.findall(r"^event: (\w+)$", log, re.MULTILINE)
    assert events == ["chunk", "chunk", "chunk", "done"], log[-3000:]
    assert '"published_frames":45' in log, log[-3000:]
