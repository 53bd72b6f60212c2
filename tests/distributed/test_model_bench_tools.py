"""The model benches and the overlap profiler, run on CPU under torchrun with gloo ranks.

The benches compare Ulysses transports in one process (`--transports portable,host-shm`: the portable all-to-all and
the copy-engine protocol over CPU shared memory); each run must finish on every rank and report both transports with
positive times. The overlap profiler runs the real LingBot-World v2 attention layer (tiny preset) and must record the
V-first phase ranges once per call. Pure helpers (argument parsing, per-rank shapes, the transfer/compute split of a
trace) are checked in-process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from tests.torchrun_launch import run_torchrun

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 150  # one torchrun job; they take 5-20 s on 2 cores


def _load(relative: str):
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def minimax_bench():
    return _load("tools/bench/minimax_h3_dit_bench.py")


@pytest.fixture(scope="module")
def lingbot_bench():
    return _load("tools/bench/lingbot_world_bench.py")


@pytest.fixture(scope="module")
def profiler():
    return _load("tools/validation/profile_ulysses_overlap.py")


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
    out = torchrun(2, "tools/bench/lingbot_world_bench.py", "session", "--config", "tiny", "--device", "cpu",
                   "--resolution", "64x48", "--chunks", "3", "--ulysses", "2", "--iters", "2",
                   "--transports", ",".join(TRANSPORTS), "--output", str(output))
    result = json.loads(output.read_text())
    _check_by_transport(result, "steady_dit_seconds_p50")
    for name in TRANSPORTS:
        row = result["by_transport"][name]
        assert row["steady_dit_fps"] > 0 and row["sessions"] == 2
    # the single-transport fields stay, from the first transport
    assert result["steady_dit_seconds_p50"] == result["by_transport"]["portable"]["steady_dit_seconds_p50"]
    assert len(result["chunks"]) == 3 and result["world"] == 2
    assert "Ulysses2: steady DiT per chunk" in out and "vs portable" in out


def test_minimax_compares_transports(tmp_path):
    output = tmp_path / "minimax.json"
    out = torchrun(2, "tools/bench/minimax_h3_dit_bench.py", "--config", "tiny", "--device", "cpu",
                   "--resolution", "64", "--duration", "1", "--ulysses", "2", "--iters", "2",
                   "--transports", ",".join(TRANSPORTS), "--output", str(output))
    result = json.loads(output.read_text())
    _check_by_transport(result, "seconds_per_call")
    assert result["seconds_per_call"] == result["by_transport"]["portable"]["seconds_per_call"]
    assert len(result["seconds_all"]) == 2 and result["world"] == 2 and result["tp"] == 1
    assert "MiniMax H3 Ulysses2: DiT time per call" in out


def test_minimax_tp2_ulysses2_compares_transports(tmp_path):
    output = tmp_path / "minimax_tp2_u2.json"
    out = torchrun(4, "tools/bench/minimax_h3_dit_bench.py", "--config", "tiny", "--device", "cpu",
                   "--resolution", "64", "--duration", "1", "--tp", "2", "--ulysses", "2", "--iters", "2",
                   "--transports", ",".join(TRANSPORTS), "--output", str(output))
    result = json.loads(output.read_text())
    _check_by_transport(result, "seconds_per_call")
    assert (result["world"], result["tp"], result["ulysses"]) == (4, 2, 2)
    assert "MiniMax H3 TP2+Ulysses2: DiT time per call" in out


def test_overlap_profiler_runs_the_lingbot_layer_on_cpu(tmp_path):
    out = torchrun(2, "tools/validation/profile_ulysses_overlap.py", "--preset", "lingbot_tiny", "--device", "cpu",
                   "--transport", "host-shm", "--iters", "2", "--output", str(tmp_path))
    summary = json.loads((tmp_path / "overlap.json").read_text())
    assert summary["layer"] == "lingbot_world_v2" and summary["transport"] == "host-shm"
    assert summary["phase_ranges"] == {"ulysses.scatter.v": 2, "ulysses.qk_norm_rope": 2}
    assert summary["rank0_shape"]["rows"] == 5 and summary["rank0_shape"]["padded_rows"] == 10
    assert (tmp_path / "trace_rank0.json").is_file()
    assert "lingbot_tiny, world 2, host-shm" in out


# -- pure helpers ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bench", ["minimax_bench", "lingbot_bench"])
def test_transport_arguments(bench, request):
    module = request.getfixturevalue(bench)
    assert module.parse_transports("portable, host-shm") == ["portable", "host-shm"]
    for bad in ("", "portable,portable", "nvlink"):
        with pytest.raises(argparse.ArgumentTypeError):
            module.parse_transports(bad)
    assert [module.rotated(["a", "b", "c"], i) for i in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


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


def test_profiler_shapes_and_arguments(profiler):
    shape = profiler.local_shape("lingbot_u4", 3, 4)
    assert (shape["first_row"], shape["rows"], shape["chunk_rows"]) == (4680, 1560, 6240)
    assert (shape["heads"], shape["heads_after_scatter"], shape["head_dim"], shape["dim"]) == (40, 10, 128, 5120)
    assert profiler.local_shape("minimax_h3_tp2_u2", 1, 2)["heads_after_scatter"] == 14
    with pytest.raises(ValueError):
        profiler.local_shape("lingbot_u4", 0, 3)  # 40 heads do not split over 3 ranks
    args = profiler.parse_args(["--preset", "lingbot_u4", "--device", "cpu", "--transport", "ce-ipc"])
    assert (args.preset, args.device, args.transport) == ("lingbot_u4", "cpu", "ce-ipc")


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
