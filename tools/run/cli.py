"""`python -m tools.run`: run a named plan's steps, each with its own limit and log, and bring back one tarball."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

from tools.run.environment import describe
from tools.run.execute import Checkout, StepResult, run_step, tail
from tools.run.plans import PLANS
from tools.run.record import write_summary, write_tarball
from tools.run.steps import Plan

REPO = Path(__file__).resolve().parents[2]

USAGE = """\
Each step is a subprocess in its own process group, with its own time limit; its output goes to OUT/<step>.log and
a failing or timed-out step is recorded while the next one runs. After every step OUT/summary.md (status, seconds,
the tail of every log) and OUT/logs.tar.gz (everything under OUT but media) are rewritten: fetch the tarball.

--baseline DIR runs every chosen step (setup steps excepted) in DIR too, right after the tree's run of it, so both
checkouts are measured on the same machine in the same call. DIR holds an earlier commit, for example:
    mkdir .baseline && git archive HEAD~1 telefuser tools examples | tar -x -C .baseline
Its logs are OUT/<step>.baseline.log and its JSON goes under OUT/baseline/. .baseline/ is ignored by git: name it in
the device call's carried paths. The baseline runs against this machine's setup (carried wheels, tf-kernel build).

A device call has a time limit: pick --steps so that their limits fit one call, and repeat the setup steps in each
call (a machine that went idle comes back bare).
"""


def describe_plans(plans: dict[str, Plan]) -> str:
    lines = ["plans and their steps (--list shows each step's limit and what it measures):"]
    for plan in plans.values():
        lines.append(f"  {plan.name}: {plan.what}")
        lines += textwrap.wrap(", ".join(plan.names), 116, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def list_plan(plan: Plan) -> str:
    lines = [f"{plan.name} ({plan.gpus} GPU{'s' if plan.gpus != 1 else ''}): {plan.what}"]
    if plan.baseline:
        lines.append(f"  also runs every step in {plan.baseline}/ unless --baseline says otherwise")
    for step in plan.steps:
        setup = " [setup]" if step.setup else ""
        lines.append(f"  {step.name:28s} limit {step.limit_s:4d} s{setup}  {step.what}")
    lines.append(f"  sum of the limits: {sum(s.limit_s for s in plan.steps)} s")
    lines += [f"  call {n}: --steps {group}" for n, group in enumerate(plan.calls, 1)]
    return "\n".join(lines)


def parse_args(argv: list[str] | None, plans: dict[str, Plan]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(
        prog="python -m tools.run",
        description=__doc__ + "\n\n" + USAGE,
        epilog=describe_plans(plans),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--plan", choices=sorted(plans), help="the plan to run (see below)")
    p.add_argument("--steps", default=None, help="comma-separated steps of the plan, in the plan's order (default all)")
    p.add_argument("--list", action="store_true", help="print the plans (or --plan's) with limits, and exit")
    p.add_argument("--out", type=Path, default=None, help="folder for the logs, JSON and the tarball")
    p.add_argument("--baseline", type=Path, default=None, help="an earlier checkout to run every step in too")
    p.add_argument("--no-baseline", action="store_true", help="run a plan that has a default baseline without it")
    p.add_argument("--python", default=sys.executable, help="the interpreter of every step (default: this one)")
    p.add_argument("--tail", type=int, default=12, help="log lines printed after each step (default 12)")
    return p, p.parse_args(argv)


def chosen_steps(p: argparse.ArgumentParser, plan: Plan, steps: str | None) -> list:
    if steps is None:
        return list(plan.steps)
    wanted = [s for s in steps.split(",") if s]
    unknown = [s for s in wanted if s not in plan.names]
    if unknown:
        p.error(f"unknown step(s) {unknown} in plan {plan.name}; its steps: {', '.join(plan.names)}")
    return [s for s in plan.steps if s.name in wanted]


def baseline_root(p: argparse.ArgumentParser, args: argparse.Namespace, plan: Plan) -> Path | None:
    if args.no_baseline:
        return None
    root = args.baseline or (Path(plan.baseline) if plan.baseline else None)
    if root is None:
        return None
    root = root if root.is_absolute() else Path.cwd() / root
    if not (root / "telefuser").is_dir():
        p.error(f"the baseline {root} has no telefuser/ (see the description for how to make one)")
    return root


def check_gpus(p: argparse.ArgumentParser, plan: Plan, python: str) -> None:
    if plan.gpus <= 1:
        return
    probe = [python, "-c", "import torch; print(torch.cuda.device_count())"]
    done = subprocess.run(probe, capture_output=True, text=True, check=False, timeout=120)
    count = int(done.stdout.strip() or 0) if done.returncode == 0 else 0
    if count < plan.gpus:
        p.error(f"plan {plan.name} needs {plan.gpus} GPUs; {count} CUDA devices are visible")


def say(text: str) -> None:
    print(text, flush=True)


def run_plan(plan: Plan, steps: list, out: Path, baseline: Path | None, python: str, tail_lines: int) -> bool:
    out.mkdir(parents=True, exist_ok=True)
    (out / "env.txt").write_text(describe(python, REPO))
    checkouts = [Checkout("tree", REPO, out)]
    if baseline is not None:
        checkouts.append(Checkout("baseline", baseline, out / "baseline"))
    results: list[StepResult] = []
    try:
        for step in steps:
            for checkout in checkouts[:1] if step.setup else checkouts:
                where = "" if checkout.label == "tree" else f" in {checkout.root}"
                say(f"=== {step.name}{where} (limit {step.limit_s} s): {step.what}")
                result = run_step(step, checkout, python=python, log_dir=out, plan_env=dict(plan.env))
                results.append(result)
                note = f" ({result.note})" if result.note else ""
                say(f"=== {step.name}{where}: rc={result.status} in {result.seconds:.0f} s{note}")
                if result.status != "skipped":
                    say(tail(out / result.log, tail_lines))
                write_summary(out, plan.name, results)
                write_tarball(out)
    finally:
        write_summary(out, plan.name, results)
        write_tarball(out)
    failed = [f"{r.step} ({r.checkout})" for r in results if not r.ok]
    say(f"=== {plan.name}: {len(results) - len(failed)} of {len(results)} ran clean; summary {out / 'summary.md'}")
    if failed:
        say(f"=== failed: {', '.join(failed)}")
    return not failed


def main(argv: list[str] | None = None, plans: dict[str, Plan] | None = None) -> int:
    plans = PLANS if plans is None else plans
    p, args = parse_args(argv, plans)
    if args.list:
        chosen = [plans[args.plan]] if args.plan else list(plans.values())
        say("\n\n".join(list_plan(plan) for plan in chosen))
        return 0
    if args.plan is None or args.out is None:
        p.error("--plan and --out are needed to run (or --list)")
    plan = plans[args.plan]
    steps = chosen_steps(p, plan, args.steps)
    baseline = baseline_root(p, args, plan)
    check_gpus(p, plan, args.python)
    return 0 if run_plan(plan, steps, args.out.resolve(), baseline, args.python, args.tail) else 1
