"""`telefuser info` answers on a machine that has torch but not the service stack (the lent GPU image has no
FastAPI); `serve` there says what is missing instead of a traceback."""

from __future__ import annotations

import json
import sys

from telefuser import cli


def test_info_answers_and_serve_explains_without_the_service_packages(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "telefuser.serving.video.cli", None)  # importing it raises ImportError
    assert cli.main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert "sdpa" in info["attention_impls"] and info["torch"]
    assert cli.main(["serve", "--model", "minimax_h3", "--port", "1"]) == 2
    assert "pip install 'telefuser[serve]'" in capsys.readouterr().err


def test_info_and_serve_with_the_service_packages(capsys):
    assert cli.main(["info"]) == 0
    assert "serve-stream" in cli.build_parser().format_help()
