"""The multi-GPU validation run: every check and measurement of the 4- and 8-GPU issues, as one command per call.

    python3 tools/validation/multi_gpu_validation.py --gpus 4 --out /tmp/mgpu                 # every step
    python3 tools/validation/multi_gpu_validation.py --gpus 4 --out /tmp/mgpu --steps correctness,ab_bench
    python3 tools/validation/multi_gpu_validation.py --list

Each step is a subprocess with its own time limit and log (`OUT/<step>.log`, plus any JSON/trace it writes under
`OUT/<step>/`). A failing or timed-out step is recorded and the next one runs. At the end `OUT/summary.md` holds a
table (step, exit status, seconds, command) and the tail of every log, so that the raw evidence and the table can be
committed under docs/perf as they are. Device time is scarce: split the steps over calls with --steps, each call
well under the 10-minute limit (the estimates below are the expected wall times on H200s). At 4 GPUs, for example:

    call 1: build,correctness,gpu_tests_symm,model_parity,ab_bench            (~630 s with the machine's start)
    call 2: build,ab_bench_nccl_zero_cta,overlap_minimax,overlap_lingbot,minimax_tp2_u2,lingbot_u4_dit
    call 3: build,lingbot_u4_e2e_ce-symm,lingbot_u4_e2e_portable,gpu_tests_ipc

(build is repeated because a machine that went idle comes back bare.)

Ranks get one GPU each (NCCL, Symmetric Memory). NVLink multicast stays off, as the device notes ask.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


@dataclass
class Step:
    name: str
    command: list[str]
    limit_s: int
    estimate_s: int
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""


def torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]


def build_steps(gpus: int, out: Path) -> list[Step]:
    py = sys.executable
    d = lambda name: str(out / name)  # noqa: E731  (a step's output folder)
    # at 2 GPUs (the kind lent most often) LingBot runs Ulysses2; at 4 and 8 the degrees the issues name
    lingbot_degrees = [2] if gpus == 2 else [w for w in (4, 8) if w <= gpus]
    # 4-rank test cases need 4 GPUs when each rank has its own
    pytest_select = [] if gpus >= 4 else ["-k", "not 4procs"]
    test_ranks = "2 and 4 ranks" if gpus >= 4 else "2 ranks"
    steps = [
        Step("build", ["make", "build-sm90", f"PYTHON={py}"], 300, 60, what="tf-kernel for this interpreter"),
        Step(
            "correctness",
            torchrun(gpus)
            + [
                "tools/validation/ulysses_correctness.py",
                "--transports",
                "portable,ce-ipc,ce-symm",
                "--iterations",
                "64",
            ],
            300,
            60,
            what=f"exact grouped V/Q/K scatter + gather with rank skew, {gpus} ranks, NCCL / CUDA IPC / Symmetric Memory",
        ),
        Step(
            "gpu_tests_symm",
            [
                py,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "tests/gpu/test_copy_engine_cuda.py",
                *pytest_select,
            ],
            420,
            150,
            env={"TELEFUSER_TEST_GPU_PER_RANK": "1", "TELEFUSER_TEST_GPU_TRANSPORT": "ce-symm"},
            what=f"tests/gpu with {test_ranks}, one GPU each, Symmetric Memory",
        ),
        Step(
            "gpu_tests_ipc",
            [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/gpu", *pytest_select],
            420,
            150,
            env={"TELEFUSER_TEST_GPU_PER_RANK": "1", "TELEFUSER_TEST_GPU_TRANSPORT": "ce-ipc"},
            what=f"tests/gpu with {test_ranks}, one GPU each, CUDA IPC (stress with skew, cache bound, fallback, "
            "failure after group start, missing-peer timeout, fused kernels, Ctrl-C of serve-stream)",
        ),
        Step(
            "model_parity",
            torchrun(gpus) + ["tools/validation/model_parity.py", "--device", "cuda", "--output", d("model_parity")],
            420,
            120,
            what="MiniMax H3 U2/U4/TP2+U2 and LingBot U2/U4 against dense (the cases that fit), bf16",
        ),
        Step(
            "ab_bench",
            torchrun(gpus)
            + [
                "tools/bench/ulysses_transport_bench.py",
                "--backends",
                "portable,ce-ipc,ce-symm,ce-nocache,ce-pack-flat,"
                "ce-handshake-per-tensor,ce-normal-priority,ce-flags32,ce-symm-barrier",
                "--repeats",
                "5",
                "--output",
                d("ab_bench") + ".json",
            ],
            540,
            240,
            what="grouped scatter per layer, every backend and ablation, seed shapes + Wan-720p",
        ),
        # alone: NCCL's zero-CTA path segfaulted under torch 2.11 / NCCL 2.28.9 on 2xH200, and a crash must not
        # take the other rows with it
        Step(
            "ab_bench_nccl_zero_cta",
            torchrun(gpus)
            + [
                "tools/bench/ulysses_transport_bench.py",
                "--backends",
                "portable,nccl-zero-cta",
                "--repeats",
                "3",
                "--output",
                d("ab_bench_nccl_zero_cta") + ".json",
            ],
            240,
            60,
            what="NCCL zero-CTA copy-engine all-to-all on symmetric buffers, if this torch/NCCL allows it",
        ),
    ]
    if gpus < 4:  # the MiniMax TP2+U2 layer and the LingBot U4 layer need 4 ranks
        return steps + lingbot_steps(lingbot_degrees, d)
    steps += [
        Step(
            "overlap_minimax",
            torchrun(min(gpus, 4))
            + [
                "tools/validation/profile_ulysses_overlap.py",
                "--preset",
                "minimax_h3_tp2_u2",
                "--output",
                d("overlap_minimax"),
            ],
            240,
            40,
            what="V copy vs Q/K norm+RoPE overlap in a MiniMax H3 layer",
        ),
        Step(
            "overlap_lingbot",
            torchrun(min(gpus, 4))
            + [
                "tools/validation/profile_ulysses_overlap.py",
                "--preset",
                "lingbot_u4",
                "--output",
                d("overlap_lingbot"),
            ],
            240,
            40,
            what="the same in a LingBot-World v2 layer",
        ),
        Step(
            "minimax_tp2_u2",
            torchrun(4)
            + [
                "tools/bench/minimax_h3_dit_bench.py",
                "--ulysses",
                "2",
                "--tp",
                "2",
                "--transports",
                "ce-symm,ce-ipc,portable",
                "--iters",
                "3",
                "--output",
                d("minimax_tp2_u2") + ".json",
            ],
            540,
            150,
            what="MiniMax H3 official DiT call, TP2+Ulysses2, transports toggled in one process",
        ),
    ]
    if gpus >= 8:
        steps.append(
            Step(
                "minimax_tp2_u4",
                torchrun(8)
                + [
                    "tools/bench/minimax_h3_dit_bench.py",
                    "--ulysses",
                    "4",
                    "--tp",
                    "2",
                    "--transports",
                    "ce-symm,portable",
                    "--iters",
                    "3",
                    "--output",
                    d("minimax_tp2_u4") + ".json",
                ],
                540,
                120,
                what="MiniMax H3 official DiT call, TP2xUlysses4",
            )
        )
    return steps + lingbot_steps(lingbot_degrees, d)


def lingbot_steps(degrees: list[int], d) -> list[Step]:
    steps = []
    for w in degrees:
        steps.append(
            Step(
                f"lingbot_u{w}_dit",
                torchrun(w)
                + [
                    "tools/bench/lingbot_world_bench.py",
                    "session",
                    "--ulysses",
                    str(w),
                    "--transports",
                    "ce-symm,ce-ipc,portable",
                    "--output",
                    d(f"lingbot_u{w}_dit") + ".json",
                ],
                540,
                200,
                what=f"LingBot-World v2 DiT session 832x480, Ulysses{w}, transports toggled in one process",
            )
        )
        for transport in ("ce-symm", "portable"):
            steps.append(
                Step(
                    f"lingbot_u{w}_e2e_{transport}",
                    torchrun(w)
                    + [
                        "examples/lingbot_world_v2/run_i2v.py",
                        "--config",
                        "official",
                        "--ulysses-degree",
                        str(w),
                        "--no-progress",
                        "--output",
                        d(f"lingbot_u{w}_e2e_{transport}") + "/session.mp4",
                    ],
                    420,
                    120,
                    env={"TELEFUSER_ULYSSES_TRANSPORT": transport},
                    what=f"LingBot-World v2 end to end 832x480 77 frames, Ulysses{w}, {transport}",
                )
            )
    return steps


def run_step(step: Step, out: Path) -> dict:
    log = out / f"{step.name}.log"
    env = {
        **os.environ,
        **NO_MULTICAST,
        **step.env,
        "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    print(f"=== {step.name} (limit {step.limit_s} s): {step.what}", flush=True)
    start = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {' '.join(step.command)}\n# env: {step.env}\n")
        f.flush()
        try:
            rc = subprocess.run(
                step.command,
                cwd=REPO,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=step.limit_s,
                start_new_session=True,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    seconds = time.monotonic() - start
    print(f"=== {step.name}: rc={rc} in {seconds:.0f} s", flush=True)
    return {
        "step": step.name,
        "rc": rc,
        "seconds": seconds,
        "log": log.name,
        "what": step.what,
        "command": " ".join(step.command),
        "env": step.env,
    }


def write_summary(results: list[dict], out: Path, gpus: int) -> Path:
    lines = [
        f"# Multi-GPU validation, {gpus} GPUs ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "| step | rc | s | what |",
        "| --- | --- | ---: | --- |",
    ]
    lines += [f"| {r['step']} | {r['rc']} | {r['seconds']:.0f} | {r['what']} |" for r in results]
    for r in results:
        tail = (out / r["log"]).read_text(errors="replace").splitlines()[-30:]
        lines += ["", f"## {r['step']}", "", f"`{r['command']}` {r['env'] or ''}", "", "```", *tail, "```"]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=4, choices=(2, 4, 8))
    p.add_argument("--out", type=Path, default=Path("outputs/multi_gpu"))
    p.add_argument("--steps", default="all", help="comma-separated step names (see --list), or all")
    p.add_argument("--list", action="store_true", help="print the steps with their estimated times and exit")
    args = p.parse_args()
    steps = build_steps(args.gpus, args.out)
    if args.list:
        for s in steps:
            print(f"{s.name:28s} ~{s.estimate_s:4d} s (limit {s.limit_s:3d})  {s.what}")
        print(f"total estimate: {sum(s.estimate_s for s in steps)} s")
        return 0
    names = [s.name for s in steps]
    wanted = names if args.steps == "all" else args.steps.split(",")
    unknown = [w for w in wanted if w not in names]
    if unknown:
        p.error(f"unknown steps {unknown}; choose from {', '.join(names)}")
    import torch

    if torch.cuda.device_count() < args.gpus:
        p.error(f"--gpus {args.gpus} but only {torch.cuda.device_count()} CUDA devices are visible")
    args.out.mkdir(parents=True, exist_ok=True)
    results = [run_step(s, args.out) for s in steps if s.name in wanted]
    print(f"summary: {write_summary(results, args.out, args.gpus)}")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
