"""tools/run: the plans name tools that exist and fit a device call; a plan of small `python -c` steps runs with
its limits, logs, failures, skips and --baseline interleaving, and leaves one tarball of its evidence."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import pytest

from tools.run import cli
from tools.run.plans import PLANS, multi_gpu
from tools.run.steps import PY, Plan, Step

ROOT = Path(__file__).resolve().parents[2]
DEVICE_CALL_LIMIT_S = 600


def _tool_files(step: Step) -> list[Path]:
    """The files a step's command runs: `-m tools.x.y` modules and .py scripts."""
    argv = list(step.argv)
    modules = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m" and argv[i + 1].startswith("tools.")]
    scripts = [a for a in argv if a.endswith(".py") and "/" in a]
    return [ROOT / (m.replace(".", "/") + ".py") for m in modules] + [ROOT / s for s in scripts]


def _exists(path: Path) -> bool:
    return path.is_file() or (path.with_suffix("") / "__main__.py").is_file()  # a module or a package with a main


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_plan_step_names_an_existing_tool_within_one_call(name):
    plan = PLANS[name]
    assert len(set(plan.names)) == len(plan.names), "step names must be unique"
    for step in plan.steps:
        assert all(_exists(f) for f in _tool_files(step)), step.argv
        assert step.limit_s <= DEVICE_CALL_LIMIT_S
    for group in plan.calls:
        assert set(group.split(",")) <= set(plan.names)


def test_the_named_plans_are_there():
    assert {"h200-models", "h200-transport", "h200-graphs", "compare-commit", "multi-gpu-4"} <= set(PLANS)
    compare = PLANS["compare-commit"]
    assert compare.baseline == ".baseline" and {"lingbot_official", "minimax_official"} <= set(compare.names)


def test_multi_gpu_plans_hold_only_what_fits_their_ranks():
    two, eight = multi_gpu(2), multi_gpu(8)
    assert {"lingbot_u2_dit", "lingbot_u2_e2e_ce-symm", "model_parity", "gpu_tests_symm"} <= set(two.names)
    assert not {"minimax_tp2_u2", "overlap_minimax", "lingbot_u4_dit"} & set(two.names)
    assert two.step("gpu_tests_ipc").argv[-2:] == ("-k", "not 4procs")
    launched = [s for s in two.steps if "torch.distributed.run" in s.argv]
    assert launched and all("--nproc-per-node=2" in s.argv for s in launched)
    assert {"lingbot_u8_dit", "minimax_tp2_u4", "overlap_lingbot"} <= set(eight.names)
    assert eight.env["NCCL_NVLS_ENABLE"] == "0"


def test_help_and_list_name_every_plan_and_step(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    for plan in PLANS.values():
        assert plan.name in text
        assert all(step in text for step in plan.names)
    assert cli.main(["--list", "--plan", "multi-gpu-4"]) == 0
    listed = capsys.readouterr().out
    assert "tf_kernel" in listed and "limit" in listed and "call 1: --steps" in listed


def test_an_unknown_step_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--plan", "h200-models", "--steps", "nope", "--out", str(tmp_path / "out")])
    assert "unknown step(s) ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _python(code: str) -> tuple[str, ...]:
    return (PY, "-c", code)


FAKE = Plan(
    "fake",
    "small python -c steps",
    (
        Step("setup", 30, _python("print('setting up')"), setup=True),
        Step(
            "ok",
            30,
            _python("import os; print('out', os.environ['FAKE_PLAN']); open('{out}/ok.json', 'w').write('{}')"),
        ),
        Step("fails", 30, _python("import sys; print('about to fail'); sys.exit(3)")),
        Step("slow", 1, _python("import time; print('sleeping', flush=True); time.sleep(30)")),
        Step("not_needed", 30, _python("raise SystemExit('must not run')"), skip_if=_python("pass")),
        Step("no_wheels", 30, (PY, "-m", "pip", "install", ".whl/none/*.whl")),
    ),
    gpus=0,
    env={"FAKE_PLAN": "yes"},
)


def test_a_plan_runs_every_step_with_its_limit_and_leaves_a_tarball(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["--plan", "fake", "--out", str(out), "--python", sys.executable], plans={"fake": FAKE})
    printed = capsys.readouterr().out
    assert rc == 1  # a step failed and one timed out: the run says so, and every step still ran
    assert "=== ok: rc=0" in printed and "out yes" in printed
    assert "=== fails: rc=3" in printed and "about to fail" in printed
    assert "=== slow: rc=timeout" in printed
    assert "=== not_needed: rc=skipped" in printed and "=== no_wheels: rc=skipped" in printed
    assert "failed: fails (tree), slow (tree)" in printed
    assert "ran past its limit of 1 s" in (out / "slow.log").read_text()
    assert (out / "ok.json").exists() and (out / "env.txt").exists()
    summary = (out / "summary.md").read_text()
    assert "| fails | tree | 3 |" in summary and "| slow | tree | timeout |" in summary
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"ok.log", "fails.log", "slow.log", "summary.md", "env.txt", "ok.json"} <= names


def test_steps_and_a_baseline_run_interleaved(tmp_path, capsys):
    baseline = tmp_path / "baseline"
    (baseline / "telefuser").mkdir(parents=True)
    out = tmp_path / "out"
    argv = ["--plan", "fake", "--steps", "setup,ok", "--out", str(out), "--baseline", str(baseline)]
    assert cli.main(argv, plans={"fake": FAKE}) == 0
    printed = capsys.readouterr().out
    order = [line.split(":")[0] for line in printed.splitlines() if line.startswith("=== ") and "rc=" in line]
    assert order == ["=== setup", "=== ok", f"=== ok in {baseline}"]  # setup once, each step then its baseline run
    assert (out / "ok.baseline.log").exists() and (out / "baseline" / "ok.json").exists()
    assert str(baseline) in (out / "ok.baseline.log").read_text()  # it ran there, with that checkout first on the path


def test_a_baseline_without_telefuser_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--plan", "fake", "--out", str(tmp_path), "--baseline", str(tmp_path / "nope")], plans={"fake": FAKE})
    assert "has no telefuser/" in capsys.readouterr().err
