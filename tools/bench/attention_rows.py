"""One timed row per attention implementation at one shape: what the attention benches (cuDNN FP8, SageAttention2)
share. The first run is the baseline every row's speedup is taken against."""

from __future__ import annotations

from collections.abc import Callable

from telefuser.profiling.timing import cuda_time_ms


def timed_rows(
    name: str,
    shape: tuple[int, int, int, int, int],
    runs: list[tuple[str, str, Callable[[], object], bool]],
    *,
    warmup: int,
    iters: int,
) -> list[dict]:
    """`runs`: (impl, what, call, counts FLOPs) -> rows with the median ms of CUDA-event-timed calls, TFLOP/s
    (4·B·H·S_q·S_kv·D) for the runs that count them, and ``speedup_vs_sdpa_bf16`` against the first run."""
    b, s_q, s_kv, h, d = shape
    flops = 4 * b * h * s_q * s_kv * d
    rows = []
    for impl, what, fn, counts_flops in runs:
        ms, times = cuda_time_ms(fn, warmup, iters)
        rows.append(
            {
                "shape": name, "B": b, "S_q": s_q, "S_kv": s_kv, "H": h, "D": d, "impl": impl, "what": what,
                "ms": ms, "ms_all": times, "tflops": flops / (ms * 1e-3) / 1e12 if counts_flops else None,
            }
        )  # fmt: skip
    base = rows[0]["ms"]
    for row in rows:
        row["speedup_vs_sdpa_bf16"] = base / row["ms"] if row["tflops"] is not None else None
    return rows
