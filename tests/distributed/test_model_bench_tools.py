"""The model benches and the overlap profiler, run on CPU under torchrun with gloo ranks.

The benches compare Ulysses transports in one process (`--transports portable,host-shm`: the portable all-to-all and
the copy-engine protocol over CPU shared memory); each run must finish on every rank and report both transports with
positive times. Their attention FLOPs by formula (what counts backends outside aten) must equal what torch's
FlopCounterMode saw dispatched to SDPA on the same rank, Ulysses padding, packed documents and the lean KV commit
included: integer counts, compared exactly. `vs-diffusers` runs on CPU with every row, diffusers' best settings
included (regional compilation with the eager backend: the same code path as inductor on the GPU, fast). The overlap
profiler runs every registered model's tiny DiT (one block, through its spec) and must record the V-first phase
ranges once per block call. Pure helpers (argument parsing, per-rank shapes, the transfer/compute split of a trace, the ceilings) are
checked in-process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from telefuser.models import registry
from telefuser.profiling import flop_rates
from tests.torchrun_launch import run_torchrun

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 150  # one torchrun job; they take 5-20 s on 2 cores


@pytest.fixture(scope="module")
def minimax_bench():
    return importlib.import_module("tools.bench.minimax_h3_dit_bench")


@pytest.fixture(scope="module")
def lingbot_bench():
    return importlib.import_module("tools.bench.lingbot_world_bench")


@pytest.fixture(scope="module")
def profiler():
    return importlib.import_module("tools.validation.profile_ulysses_overlap")


def torchrun(ranks: int, *args: str) -> str:
    """The combined output of a torchrun that must succeed (the transports come from the arguments only)."""
    rc, out = run_torchrun(ranks, *args, timeout=TIMEOUT_S, unset=("TELEFUSER_ULYSSES_TRANSPORT",))
    assert rc == 0, f"torchrun {' '.join(args)} exited {rc}:\n{out[-6000:]}"
    return out


TRANSPORTS = ["portable", "host-shm"]


def _check_by_transport(result: dict, time_key: str) -> None:
    assert result["transports"] == TRANSPORTS
    by = result["by_transport"]
    assert list(by) == TRANSPORTS
    for name in TRANSPORTS:
        assert by[name]["runs_on"] == name, by[name]  # host-shm is eligible on CPU: no silent fallback
        assert by[name][time_key] > 0
        assert by[name]["ratio_to_first"] > 0
    assert by["portable"]["ratio_to_first"] == 1.0
    assert result["ulysses_transport"] == "portable"


# -- torchrun runs -----------------------------------------------------------------------------------------------------
def test_lingbot_session_compares_transports(tmp_path):
    output = tmp_path / "lingbot.json"
    out = torchrun(
        2,
        "-m",
        "tools.bench.lingbot_world_bench",
        "session",
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--resolution",
        "64x48",
        "--chunks",
        "3",
        "--ulysses",
        "2",
        "--iters",
        "2",
        "--transports",
        ",".join(TRANSPORTS),
        "--output",
        str(output),
    )
    result = json.loads(output.read_text())
    _check_by_transport(result, "steady_dit_seconds_p50")
    for name in TRANSPORTS:
        row = result["by_transport"][name]
        assert row["steady_dit_fps"] > 0 and row["sessions"] == 2
    # the single-transport fields stay, from the first transport
    assert result["steady_dit_seconds_p50"] == result["by_transport"]["portable"]["steady_dit_seconds_p50"]
    assert len(result["chunks"]) == 3 and result["world"] == 2
    assert "Ulysses2: steady DiT per chunk" in out and "vs portable" in out
    for chunk in result["chunks"]:  # the window grows: chunk 0 attends to itself, chunk 2 to the sink and chunk 1 too
        assert chunk["attention_tflop_formula"] == chunk["attention_tflop_dispatched"] > 0, chunk
        assert chunk["tflop_this_rank"] == chunk["tflop_counted"] + chunk["attention_tflop_formula"]
        assert chunk["of_measured_matmul_ceiling"] is None and chunk["of_datasheet_bf16_dense"] is None  # CPU
    assert result["chunks"][0]["attention_tflop_formula"] < result["chunks"][2]["attention_tflop_formula"]


def test_minimax_compares_transports(tmp_path):
    output = tmp_path / "minimax.json"
    out = torchrun(
        2,
        "-m",
        "tools.bench.minimax_h3_dit_bench",
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--resolution",
        "64",
        "--duration",
        "1",
        "--ulysses",
        "2",
        "--iters",
        "2",
        "--transports",
        ",".join(TRANSPORTS),
        "--output",
        str(output),
    )
    result = json.loads(output.read_text())
    _check_by_transport(result, "seconds_per_call")
    assert result["seconds_per_call"] == result["by_transport"]["portable"]["seconds_per_call"]
    assert len(result["seconds_all"]) == 2 and result["world"] == 2 and result["tp"] == 1
    assert "MiniMax H3 Ulysses2: DiT time per call" in out
    assert result["attention_flops_formula"] == result["attention_flops_dispatched"] > 0  # rank 0 holds the prompt


def test_minimax_tp2_ulysses2_compares_transports(tmp_path):
    output = tmp_path / "minimax_tp2_u2.json"
    out = torchrun(
        4,
        "-m",
        "tools.bench.minimax_h3_dit_bench",
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--resolution",
        "64",
        "--duration",
        "1",
        "--tp",
        "2",
        "--ulysses",
        "2",
        "--iters",
        "2",
        "--transports",
        ",".join(TRANSPORTS),
        "--output",
        str(output),
    )
    result = json.loads(output.read_text())
    _check_by_transport(result, "seconds_per_call")
    assert (result["world"], result["tp"], result["ulysses"]) == (4, 2, 2)
    assert "MiniMax H3 TP2+Ulysses2: DiT time per call" in out
    assert result["attention_flops_formula"] == result["attention_flops_dispatched"] > 0


def test_lingbot_vs_diffusers_runs_every_row_on_cpu(tmp_path):
    output = tmp_path / "vs.json"
    command = [
        sys.executable,
        "-m",
        "tools.bench.lingbot_world_bench",
        "vs-diffusers",
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--resolution",
        "64x48",
        "--frames",
        "2",
        "--iters",
        "1",
        "--compile-backend",
        "eager",
        "--output",
        str(output),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    best = "diffusers best (native SDPA, compile_repeated_blocks (eager backend))"  # cuDNN attention on a GPU
    assert result["diffusers_best"] == best and result["diffusers_best_errors"] == {}
    assert [row["implementation"] for row in result["rows"]] == [
        "telefuser (cuDNN SDPA first)",
        "telefuser, eager elementwise chains",
        "diffusers (torch default SDPA order)",
        best,
    ]
    for row in result["rows"]:
        assert row["seconds"] > 0 and row["query_tokens"] == row["key_tokens"] == 2 * (48 // 16) * (64 // 16)
        assert row["attention_tflop_formula"] == row["attention_tflop_dispatched"] > 0, row
        assert row["of_measured_matmul_ceiling"] is None  # no ceilings for a CPU
    assert best in done.stdout and "of measured 786 | of datasheet 989" in done.stdout


COMPILING_PROFILER = """
import sys
sys.path.insert(0, {repo!r})
from telefuser.ops.regions import compile_regions_on
from tools.validation.profile_ulysses_overlap import main
with compile_regions_on("cpu", backend="aot_eager"):  # regions compile here, as they do on a GPU
    sys.exit(main(sys.argv[1:]))
"""


def test_overlap_profiler_keeps_its_ranges_where_regions_compile(tmp_path):
    """On a GPU the blocks' regions compile, and a compiled region has no phase range: the profiler reported zeros for
    Wan 2.2 on an H100 (2026-12-07). It now runs the blocks outside their regions. Here regions compile on the CPU
    (aot_eager) around the tool; without that the trace held 0 ranges of each phase (the negative control, run by
    hand: before the fix the tool ends with status 1, its trace holding no range)."""
    script = tmp_path / "compiling_profiler.py"
    script.write_text(COMPILING_PROFILER.format(repo=str(REPO)))
    args = ["--model", "wan2.2-t2v-a14b", "--config", "tiny", "--device", "cpu", "--transport", "host-shm"]
    torchrun(2, str(script), *args, "--iters", "2", "--output", str(tmp_path / "out"))
    summary = json.loads((tmp_path / "out" / "overlap.json").read_text())
    assert summary["phase_ranges"] == {"ulysses.scatter.v": 2, "ulysses.qk_norm_rope": 2}, summary


def test_a_trace_without_the_ranges_is_an_error_not_zeros():
    from tools.validation.profile_ulysses_overlap import missing_ranges

    assert missing_ranges({"ulysses.scatter.v": 2, "ulysses.qk_norm_rope": 2}) is None
    problem = missing_ranges({"ulysses.scatter.v": 0, "ulysses.qk_norm_rope": 0})
    assert "no ulysses.scatter.v or ulysses.qk_norm_rope range" in problem and "compiled region" in problem


@pytest.mark.parametrize("model", registry.names())
def test_overlap_profiler_runs_every_registered_model_on_cpu(model, tmp_path):
    out = torchrun(
        2,
        "-m",
        "tools.validation.profile_ulysses_overlap",
        "--model",
        model,
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--transport",
        "host-shm",
        "--iters",
        "2",
        "--output",
        str(tmp_path),
    )
    summary = json.loads((tmp_path / "overlap.json").read_text())
    assert summary["model"] == model and summary["transport"] == "host-shm" and summary["layers"] == 1
    ranges = summary["phase_ranges"]
    # one V-first range pair per block call (2 iterations x 1 block), more where other attention layers run dense
    assert ranges["ulysses.scatter.v"] == ranges["ulysses.qk_norm_rope"] >= 2, ranges
    if model != "minimax_h3":  # MiniMax H3's prompt refiner runs its attention dense, in the same ranges
        assert ranges["ulysses.scatter.v"] == 2, ranges
    assert summary["rank0_shape"]["ulysses"] == 2 and summary["rank0_shape"]["heads_after_scatter"] > 0
    assert summary["example_shape"] == registry.get_spec(model).example_shape("tiny")
    assert (tmp_path / "trace_rank0.json").is_file()
    assert f"{model} tiny, world 2 (TP1 x U2), host-shm" in out


# -- pure helpers ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bench", ["minimax_bench", "lingbot_bench"])
def test_transport_arguments(bench, request):
    module = request.getfixturevalue(bench)
    assert module.parse_transports("portable, host-shm") == ["portable", "host-shm"]
    for bad in ("", "portable,portable", "nvlink"):
        with pytest.raises(argparse.ArgumentTypeError):
            module.parse_transports(bad)
    assert [module.rotated(["a", "b", "c"], i) for i in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_bench_argument_parsing(minimax_bench, lingbot_bench, monkeypatch):
    monkeypatch.delenv("TELEFUSER_ULYSSES_TRANSPORT", raising=False)
    assert minimax_bench.parse_args(["--device", "cpu"]).transports == ["auto"]
    assert lingbot_bench.parse_args(["session"]).transports == ["auto"]
    monkeypatch.setenv("TELEFUSER_ULYSSES_TRANSPORT", "portable")  # the communicator's default, named
    assert minimax_bench.parse_args([]).transports == ["portable"]
    args = minimax_bench.parse_args(["--tp", "2", "--ulysses", "2", "--transports", "portable,auto"])
    assert (args.tp, args.ulysses, args.transports) == (2, 2, ["portable", "auto"])
    with pytest.raises(SystemExit):  # several transports need Ulysses ranks
        minimax_bench.parse_args(["--transports", "portable,auto"])
    with pytest.raises(SystemExit):
        lingbot_bench.parse_args(["vs-diffusers", "--ulysses", "2", "--transports", "portable,auto"])


def test_rates_give_both_h200_ceilings_and_none_elsewhere():
    report = flop_rates.rate(393e12, 1.0, "NVIDIA H200")
    assert report["achieved_tflops"] == 393.0
    assert report["of_measured_matmul_ceiling"] == 393.0 / 786.0 and report["of_datasheet_bf16_dense"] == 393.0 / 989.0
    assert flop_rates.describe(report) == "393.0 TFLOP/s (50% of the measured 786, 40% of the datasheet 989)"
    for device in ("cpu", "NVIDIA A100-SXM4-80GB"):  # no numbers of ours for those
        other = flop_rates.rate(1e12, 2.0, device)
        assert other["of_measured_matmul_ceiling"] is None and flop_rates.describe(other) == "0.5 TFLOP/s"
    assert flop_rates.attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11


def test_profiler_layouts_and_arguments(profiler, monkeypatch, capsys):
    layout = profiler.layout("lingbot_world_v2", "official", 4)
    assert (layout["heads"], layout["heads_after_scatter"], layout["ulysses"], layout["tp"]) == (40, 10, 4, 1)
    assert profiler.layout("minimax_h3", "official", 4, tp=2)["heads_after_scatter"] == 14  # 56 heads / TP2 / U2
    for refused in (
        ("lingbot_world_v2", "official", 3, 1),  # 40 heads do not split over 3 ranks
        ("lingbot_world_v2", "official", 4, 2),  # no TP plan
        ("minimax_h3", "official", 2, 2),  # Ulysses 1: nothing to profile
        ("minimax_h3", "official", 4, 3),
    ):
        with pytest.raises(ValueError):
            profiler.layout(*refused)
    monkeypatch.setenv("WORLD_SIZE", "4")
    args = profiler.parse_args(["--model", "lingbot_world_v2", "--device", "cpu", "--transport", "ce-ipc"])
    assert (args.model, args.config, args.tp, args.layers, args.device, args.transport) == (
        "lingbot_world_v2",
        "official",
        1,
        1,
        "cpu",
        "ce-ipc",
    )
    with pytest.raises(SystemExit):  # checked on every rank before any collective
        profiler.parse_args(["--model", "wan2.2-ti2v-5b", "--tp", "2"])
    assert "wan2.2-ti2v-5b's plan takes no tensor parallelism" in capsys.readouterr().err


def _x(name, cat, ts, dur, tid=1, corr=None):
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": tid}
    if corr is not None:
        event["args"] = {"correlation": corr}
    return event


def test_transfer_compute_split_of_a_lingbot_like_trace(profiler):
    """LingBot's V range also launches V's GEMM, its Q/K range the Q scatter's copies: the split counts only the V
    copies against only the Q/K kernels."""
    events = [
        _x("ulysses.scatter.v", "user_annotation", 100, 20),
        _x("cudaLaunchKernel", "cuda_runtime", 102, 1, corr=1),  # V GEMM
        _x("cudaMemcpy2DAsync", "cuda_runtime", 110, 1, corr=2),  # V copy
        _x("ulysses.qk_norm_rope", "user_annotation", 130, 40),
        _x("cudaLaunchKernel", "cuda_runtime", 132, 1, corr=3),  # Q GEMM
        _x("cudaMemcpy2DAsync", "cuda_runtime", 140, 1, corr=4),  # Q copy
        _x("cuLaunchKernel", "cuda_driver", 150, 1, corr=5),  # K norm (Triton)
        _x("nvjet_gemm", "kernel", 200, 50, tid=8, corr=1),
        _x("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 250, 100, tid=7, corr=2),
        _x("nvjet_gemm", "kernel", 260, 40, tid=8, corr=3),
        _x("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 350, 30, tid=7, corr=4),
        _x("triton_norm", "kernel", 330, 40, tid=8, corr=5),
    ]
    split = profiler.transfer_compute_overlap({"traceEvents": events})
    assert (split.v_copy_us, split.qk_prep_us, split.overlap_us) == (100, 80, 40 + 20)
    ranges = profiler.v_copy_overlap({"traceEvents": events})  # the phase reading counts the GEMM and Q copy too
    assert (ranges.v_copy_us, ranges.qk_prep_us) == (150, 90)
    assert profiler.phase_ranges({"traceEvents": events}) == {"ulysses.scatter.v": 1, "ulysses.qk_norm_rope": 1}
