"""tools/bench/video_service_bench.py against the fake model on the CPU: every job made, downloaded and probed, the
first-over-steady ratio reported, and a refused job is a problem with exit status 1 (never a silent pass)."""

from __future__ import annotations

import importlib
import json

import pytest

pytest.importorskip("openai", reason="the openai package is in the dev extra")


def _bench():
    return importlib.import_module("tools.bench.video_service_bench")


def test_fake_service_jobs_are_made_checked_and_compared(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "summary.json"
    jobs = ["--jobs", "64x32:0.5", "64x32:0.5", "96x64:0.5"]
    assert bench.main(["--fake", *jobs, "--prompt", "a cat", "a cat on a mat", "--output", str(out)]) == 0
    summary = json.loads(out.read_text())
    jobs = summary["jobs"]
    assert [j["status"] for j in jobs] == ["completed"] * 3 and all(not j["problems"] for j in jobs)
    assert [j["size"] for j in jobs] == ["64x32", "64x32", "96x64"]
    assert [j["prompt"] for j in jobs] == ["a cat", "a cat on a mat", "a cat"]
    assert all(j["mp4_bytes"] > 0 and j["frames"] > 0 for j in jobs)
    assert summary["service_exit_code"] == 0 and summary["problems"] == []
    assert isinstance(summary["ratios"]["first_over_steady"], float)  # job 1 has job 0's shape; job 2 does not count
    assert "first / steady" in capsys.readouterr().out


def test_a_refused_job_is_a_problem_and_fails_the_run(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "summary.json"
    assert bench.main(["--fake", "--jobs", "64x32:0.5", "64x32:9999", "--output", str(out)]) == 1
    summary = json.loads(out.read_text())
    assert len(summary["jobs"]) == 1 and summary["jobs"][0]["status"] == "completed"
    assert any("BadRequestError" in p or "UnprocessableEntity" in p for p in summary["problems"]), summary["problems"]
    assert "PROBLEM" in capsys.readouterr().err


@pytest.mark.parametrize("job", ["64x32", "64x32:", "64:1", "0x32:1", "64x32:-1"])
def test_bad_job_arguments_are_refused(job):
    with pytest.raises(SystemExit):
        _bench().parse_args(["--fake", "--jobs", job])
