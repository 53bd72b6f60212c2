"""tools/validation/model_parity.py under torchrun on CPU ranks (gloo, fp32): its cases are every registered model's
Ulysses layouts (and TP2 x Ulysses2 where the spec's plan takes TP); the cases that fit 2 and 4 ranks pass with errors
far below the fp32 bound, a perturbed parallel model fails every model's case with exit status 1, and an unknown case
name is refused on every rank before any collective (no hang).

Each run starts its own torchrun (about 4 s of imports on 2 cores, plus 10-20 s of work for every model's cases).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed

from telefuser.models import registry
from tests.torchrun_launch import run_torchrun

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "validation" / "model_parity.py"
FP32_BOUND = 1e-5

pytestmark = pytest.mark.timeout(180)


def run_tool(nproc: int, *args: str, timeout: float = 120) -> tuple[int, str]:
    """(exit status, stdout + stderr) of torchrun running the tool on CPU."""
    return run_torchrun(nproc, "-m", "tools.validation.model_parity", "--device", "cpu", *args, timeout=timeout)


def read_report(directory: Path) -> dict:
    return json.loads((directory / "model_parity.json").read_text())


def load_tool(monkeypatch):
    spec = importlib.util.spec_from_file_location("model_parity_tool", TOOL)
    tool = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, tool)
    spec.loader.exec_module(tool)
    return tool


def check_passed(report: dict, expected: list[str], transport: str) -> None:
    assert [c["case"] for c in report["cases"]] == expected
    assert report["passed"] and report["dtype"] == "float32" and report["max_rel_error"] == FP32_BOUND
    for case in report["cases"]:
        assert case["passed"] and not case["problems"], case
        assert case["transport"] == transport, case
        # Parallel and dense sum in other orders: a tiny difference, or none (bit-identical is a valid result).
        assert case["relative"] <= FP32_BOUND / 5 and case["max_abs"] < 1e-4, case
        assert case["max_abs_dense"] > 0.1  # never compared on zeros
        assert case["outputs"] and all(o["relative"] <= case["relative"] for o in case["outputs"].values())
        if case["model"] == "minimax_h3":  # outputs named by the spec's example
            assert set(case["outputs"]) == {"video", "audio"}


def test_the_cases_are_every_registered_models_layouts(monkeypatch):
    tool = load_tool(monkeypatch)
    expected = []
    for name in registry.names():
        expected += [f"{name}_u2", f"{name}_u4"] + ([f"{name}_tp2_u2"] if name == "minimax_h3" else [])
    assert list(tool.CASES) == expected
    assert [registry.get_spec(name).tensor_parallel for name in registry.names()].count(True) == 1


@pytest.mark.numerics
def test_two_ranks_every_case_that_fits_passes(tmp_path):
    rc, output = run_tool(2, "--output", str(tmp_path))
    assert rc == 0, output[-4000:]
    report = read_report(tmp_path)
    assert report["world_size"] == 2
    check_passed(report, [f"{name}_u2" for name in registry.names()], "portable")  # "auto" on CPU
    assert "overall: PASS" in output


@pytest.mark.numerics
def test_four_ranks_over_host_shared_memory(tmp_path, monkeypatch):
    """Every case; the 2-rank cases run as two replicas ({0, 1} and {2, 3}) on the copy-engine protocol."""
    rc, output = run_tool(4, "--transport", "host-shm", "--output", str(tmp_path))
    assert rc == 0, output[-4000:]
    report = read_report(tmp_path)
    check_passed(report, list(load_tool(monkeypatch).CASES), "host-shm")
    groups = {c["case"]: c["groups"] for c in report["cases"]}
    assert groups["minimax_h3_u2"] == [[0, 1], [2, 3]] and groups["minimax_h3_tp2_u2"] == [[0, 1, 2, 3]]


@pytest.mark.numerics
def test_a_wrong_parallel_model_fails_every_model_with_status_1(tmp_path):
    rc, output = run_tool(2, "--perturb", "1e-3", "--output", str(tmp_path))
    assert rc == 1, output[-4000:]
    cases = read_report(tmp_path)["cases"]
    assert [c["model"] for c in cases] == registry.names()
    for case in cases:
        assert not case["passed"] and case["relative"] > 10 * FP32_BOUND, case
        assert any("relative error" in p for p in case["problems"])
    assert "overall: FAIL" in output


def test_an_unknown_case_is_refused_on_every_rank(tmp_path, monkeypatch, capsys):
    # Under torchrun: a clear error, a failed run, no report, no hang. (torchrun stops the other rank as soon as the
    # first one exits, so how many ranks got to print is a race; the in-process check below covers every rank.)
    rc, output = run_tool(2, "--cases", "minimax_h3_u2,minimax_u2", "--output", str(tmp_path), timeout=60)
    assert rc != 0
    assert "unknown case(s) ['minimax_u2']" in output, output[-4000:]  # the cases take registry names
    assert not (tmp_path / "model_parity.json").exists()
    # Each rank refuses on its own, from its arguments alone, before the process group exists.
    tool = load_tool(monkeypatch)
    for rank in (0, 1):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(SystemExit) as exit_info:
            tool.parse_args(["--device", "cpu", "--cases", "minimax_h3_u2,minimax_u2"])
        assert exit_info.value.code == 2
        assert "unknown case(s) ['minimax_u2']" in capsys.readouterr().err
        assert not torch.distributed.is_initialized()
