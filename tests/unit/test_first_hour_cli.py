"""Issue 36: `--help` shows defaults, `telefuser --version` answers, `telefuser info` lists the models and only the
GPU builds that apply to this host, and `telefuser serve --fake` calls itself a fake in its start line."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import torch

from telefuser import __version__, cli
from tools.harness.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]


def help_of(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare words


def test_serve_help_shows_every_default_that_says_something(capsys):
    text = help_of(capsys, "serve")
    for shown in (
        "the port to listen on; 0 picks a free one (logged) (default: 8000)",
        "more get 429 (default: 16)",
        "(the OpenAI SDK's seconds='12' needs --max-seconds 12) (default: 10.0)",
        "stop at its next step (default: 30.0)",
        "log verbosity (default: info)",
        "random-weight sizes without --checkpoint (default: tiny)",  # a model flag: its spec's serve default
        "(default: 1344x768; --config tiny 64x32; --fake 64x64)",
        "num_inference_steps when a request omits it (default: 50; --fake 4)",
    ):
        assert shown in text, shown
    assert "(default: None)" not in text and "(default: False)" not in text


def test_the_top_level_help_version_and_a_bad_command(capsys):
    assert "--version" in help_of(capsys)
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"telefuser {__version__}"
    with pytest.raises(SystemExit) as done:
        cli.main(["nonsense"])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("telefuser: error: "), err


def test_info_lists_the_models_and_only_the_builds_that_apply(capsys):
    assert cli.main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    models = {m["name"]: m for m in info["models"]}
    assert models["minimax_h3"]["served_by"] == ["telefuser serve"]
    assert models["lingbot_world_v2"]["served_by"] == ["telefuser serve-stream"]
    assert all(m["title"] for m in models.values())
    if torch.version.cuda is None:  # a CPU-only torch: no GPU build recipe, and the reason why
        assert "sage_sm90_build" not in info and "none apply" in info["gpu_builds"]
    else:
        assert "sage_sm90_build" in info


def test_serve_fake_names_itself_a_fake_in_its_start_line(tmp_path):
    with ServerProcess(["telefuser", "serve", "--fake", "--port", "0", "--artifacts", str(tmp_path)]) as server:
        try:
            server.wait_for_line("serving on", 60, poll_s=0.002)
        finally:
            # within milliseconds of the line, before uvicorn's own handlers: the server must still stop gracefully
            returncode = server.stop(signal.SIGTERM, 30)
    lines = server.lines
    assert returncode == 0 and "Traceback" not in server.log, server.log
    assert any("serve exited cleanly" in line for line in lines), server.log
    start = next(line for line in lines if "serving on" in line)
    assert re.search(
        r"serving on http://127\.0\.0\.1:\d+ \(model: fake-MiniMax-H3 \(a fake model: test pattern and tone, no "
        r"weights; requests may also name MiniMax-H3\), jobs: ",
        start,
    ), start
