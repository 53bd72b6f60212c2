"""tools/bench/vae_overlap_bench.py runs end to end on the CPU (a smoke run: no streams there) and reports every
row; the GPU run is what decides whether the session moves its VAE work beside the DiT."""

from __future__ import annotations

import importlib
import json

import pytest


def _bench():
    return importlib.import_module("tools.bench.vae_overlap_bench")


def test_the_smoke_run_reports_each_row(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "overlap.json"
    argv = "--config tiny --device cpu --resolution 64x48 --iters 1 --host-profile 5".split() + ["--output", str(out)]
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert list(runs) == [*bench.VARIANTS, "dit_enqueue"]
    assert report["dit_graph"] == "CPU: no CUDA graphs"
    assert all(r["median_s"] > 0 for r in runs.values())
    assert runs["dit"]["side_hidden"] is None and isinstance(runs["both"]["side_hidden"], float)
    assert runs["dit_enqueue"]["median_s"] > 0
    printed = capsys.readouterr().out
    assert "CPU: no streams" in printed and "function calls" in printed  # the cProfile table


def test_bad_arguments_are_refused_before_any_model_is_built():
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.parse_args(["--resolution", "100x48"])
    with pytest.raises(RuntimeError, match="cudnn_fp8"):
        bench.main(["--config", "tiny", "--device", "cpu", "--attn-impl", "cudnn_fp8"])
