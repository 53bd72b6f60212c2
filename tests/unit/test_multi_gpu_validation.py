"""The multi-GPU runner's plan: every step the 4- and 8-GPU issues name, each tool path present, bad step names
refused before anything runs (the runs themselves need the multi-GPU machines)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.tool_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
runner = load_script("tools/validation/multi_gpu_validation.py", register=True)


@pytest.mark.parametrize("gpus", [4, 8])
def test_every_step_names_an_existing_tool(gpus, tmp_path):
    steps = runner.build_steps(gpus, tmp_path)
    names = [s.name for s in steps]
    assert {
        "correctness",
        "gpu_tests_symm",
        "gpu_tests_ipc",
        "model_parity",
        "ab_bench",
        "overlap_minimax",
        "overlap_lingbot",
        "minimax_tp2_u2",
        "lingbot_u4_dit",
    } <= set(names)
    assert ("lingbot_u8_dit" in names and "minimax_tp2_u4" in names) == (gpus == 8)
    for step in steps:
        scripts = [a for a in step.command if a.endswith(".py") and "/" in a]
        assert all((ROOT / s).is_file() for s in scripts), step.command
        assert step.limit_s <= 600  # one device call's limit


def test_two_gpus_run_only_what_fits_two_ranks(tmp_path):
    steps = {s.name: s for s in runner.build_steps(2, tmp_path)}
    assert {"lingbot_u2_dit", "lingbot_u2_e2e_ce-symm", "model_parity", "gpu_tests_symm"} <= set(steps)
    assert not {"minimax_tp2_u2", "overlap_minimax", "overlap_lingbot", "lingbot_u4_dit"} & set(steps)  # 4 ranks
    for name in ("gpu_tests_symm", "gpu_tests_ipc"):
        assert steps[name].command[-2:] == ["-k", "not 4procs"]
    launched = [s for s in steps.values() if "torch.distributed.run" in s.command]
    assert launched and all("--nproc-per-node=2" in s.command for s in launched)


def test_unknown_step_is_refused(capsys):
    with pytest.raises(SystemExit):
        argv, sys.argv = sys.argv, ["multi_gpu_validation.py", "--steps", "nope"]
        try:
            runner.main()
        finally:
            sys.argv = argv
    assert "unknown steps ['nope']" in capsys.readouterr().err
