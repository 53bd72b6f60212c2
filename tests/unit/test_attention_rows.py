"""The attention benches' shared rows (tools/bench/attention_rows.py) on the CPU, the CUDA-event timer replaced by a
fixed one: TFLOP/s from the formula for the runs that count FLOPs, speedups against the first run."""

from __future__ import annotations

import pytest

from tools.bench import attention_rows


def test_rows_carry_the_formula_tflops_and_the_speedup_against_the_first_run(monkeypatch):
    times = {"base": 8.0, "fast": 4.0, "quantize": 1.0}
    calls = []

    def fake_timer(fn, warmup, iters):
        name = fn()
        calls.append((name, warmup, iters))
        return times[name], [times[name]] * iters

    monkeypatch.setattr(attention_rows, "cuda_time_ms", fake_timer)
    runs = [
        ("sdpa_bf16", "baseline", lambda: "base", True),
        ("sage", "faster kernel", lambda: "fast", True),
        ("quantize", "no FLOPs", lambda: "quantize", False),
    ]
    rows = attention_rows.timed_rows("lingbot", (1, 6240, 28080, 40, 128), runs, warmup=2, iters=5)
    assert calls == [("base", 2, 5), ("fast", 2, 5), ("quantize", 2, 5)]
    flops = 4 * 40 * 6240 * 28080 * 128
    assert [r["impl"] for r in rows] == ["sdpa_bf16", "sage", "quantize"]
    assert rows[0]["tflops"] == pytest.approx(flops / 8e-3 / 1e12) and rows[2]["tflops"] is None
    assert [r["speedup_vs_sdpa_bf16"] for r in rows] == [1.0, 2.0, None]
    assert rows[1]["ms_all"] == [4.0] * 5 and (rows[1]["S_q"], rows[1]["S_kv"], rows[1]["D"]) == (6240, 28080, 128)
