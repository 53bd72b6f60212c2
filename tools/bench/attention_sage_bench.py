"""SageAttention2's SM90 kernel (``sage_sm90``) against cuDNN bf16 SDPA and cuDNN FP8, side by side in one run.

    python -m tools.bench.attention_sage_bench --output sage_attention.json     # MiniMax H3 and LingBot shapes
    python -m tools.bench.attention_sage_bench --shapes lingbot --iters 50
    python -m tools.bench.attention_sage_bench --shape 1,4096,4096,24,128       # any B,S_q,S_kv,H,D

Per shape, on the same bf16 ``[B, S, H, D]`` inputs, CUDA-event timed, median of --iters calls after --warmup:

- ``sdpa_bf16``: `telefuser.ops.attention.sdpa` (torch SDPA, cuDNN first) on ``[B, H, S, D]`` views;
- ``cudnn_fp8``: `fp8_attention`, its quantization included (where nvidia-cudnn-frontend is installed);
- ``sage_<gran>``: `sage_sm90_attention` with our quantization of Q, K (smoothed) and V included, per_thread and
  per_warp;
- ``sage_<gran>_kernel``: the kernel alone on inputs quantized before timing (what a LingBot window that is kept
  quantized pays per call, less its queries);
- ``sage_<gran>_q_only``: the kernel plus the quantization of Q alone (the LingBot window path);
- ``sage_quantize``: the quantization of Q, K and V alone.

With --window-writes, also what a LingBot forward pays per layer to write its chunk's K/V (6,240 rows) into a full
28,080-row window at ring slots that do not align with 128-key blocks, eager and compiled (as in a block region):
a bf16 window, the FP8-key window of ``cudnn_fp8``, and the ``sage_sm90`` window (bf16 keys copied in, every touched
block requantized with fresh scales, values cast to e4m3 in the kernel's layout).

TFLOP/s counts 4·B·H·S_q·S_kv·D. Accuracy per input kind (``random`` N(0, 1); ``key-offset``: keys plus a per-channel
offset of 8; ``sharp``: that and queries times 4), on the first --ref-heads heads: cosine and relative L2 of each
implementation against an fp32 reference (SDPA in fp32 on those heads). Prints a markdown table. Needs an SM90 GPU
and the SM90 extensions built (ops/README.md); cuDNN FP8 rows are skipped without the cuDNN frontend.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from telefuser.profiling.timing import cuda_time_ms
from tools.bench.attention_rows import timed_rows

SHAPES = {  # name -> (B, S_q, S_kv, H, D)
    "minimax": (1, 37966, 37966, 56, 128),  # MiniMax H3, 768p 5 s, joint self-attention
    "lingbot": (1, 6240, 28080, 40, 128),  # a LingBot-World v2 chunk reading its full KV window
}
INPUTS = {"random": (0.0, 1.0), "key-offset": (8.0, 1.0), "sharp": (8.0, 4.0)}  # (key offset, query gain)
GRANULARITIES = ("per_thread", "per_warp")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["minimax", "lingbot"])
    p.add_argument("--shape", action="append", default=[], help="extra shape B,S_q,S_kv,H,D (repeatable)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ref-heads", type=int, default=2, help="heads compared against the fp32 reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window-writes", action="store_true", help="also time the LingBot window writes per layer")
    p.add_argument(
        "--profile-writes", action="store_true", help="with --window-writes: the sage window write's kernels, by time"
    )
    p.add_argument("--output", type=Path, default=None, help="write the rows and the setup as JSON")
    return p.parse_args(argv)


def make_inputs(shape, kind: str, seed: int):
    b, s_q, s_kv, h, d = shape
    offset, gain = INPUTS[kind]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=torch.bfloat16, generator=g) * gain
    k = torch.randn(b, s_kv, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = k + offset * torch.randn(d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, s_kv, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    o, r = out.float().flatten(), ref.float().flatten()
    return F.cosine_similarity(o, r, dim=0).item(), ((o - r).norm() / r.norm()).item()


def implementations(fp8: bool):
    from telefuser.ops.attention import sdpa
    from telefuser.ops.attention_sage import sage_sm90_attention

    impls = {"sdpa_bf16": lambda q, k, v: sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)}
    if fp8:
        from telefuser.ops.attention_fp8 import fp8_attention

        impls["cudnn_fp8"] = fp8_attention
    for gran in GRANULARITIES:
        impls[f"sage_{gran}"] = lambda q, k, v, gran=gran: sage_sm90_attention(q, k, v, granularity=gran)
    return impls


def accuracy(shape, impls, args) -> dict[str, dict[str, tuple[float, float]]]:
    """impl -> input kind -> (cosine, rel L2) against fp32 SDPA on the first --ref-heads heads."""
    heads = min(args.ref_heads, shape[3])
    found: dict[str, dict[str, tuple[float, float]]] = {name: {} for name in impls}
    for kind in INPUTS:
        q, k, v = make_inputs(shape, kind, args.seed)
        ref = F.scaled_dot_product_attention(*(t[:, :, :heads].float().transpose(1, 2) for t in (q, k, v)))
        ref = ref.transpose(1, 2)
        for name, fn in impls.items():
            out = fn(q, k, v)[:, :, :heads]
            found[name][kind] = compare(out, ref)
            del out
        del q, k, v, ref
        torch.cuda.empty_cache()
    return found


def bench_shape(name: str, shape, args, fp8: bool) -> list[dict]:
    from telefuser.ops.attention_sage import quantize, quantize_queries, sage_sm90_quantized

    impls = implementations(fp8)
    quality = accuracy(shape, impls, args)
    q, k, v = make_inputs(shape, "random", args.seed)
    first = {}
    for impl, fn in impls.items():  # the first call compiles the quantization / builds the cuDNN graph
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn(q, k, v)
        torch.cuda.synchronize()
        first[impl] = time.perf_counter() - start
    runs = [(impl, f"{impl} (quantization included)", lambda fn=fn: fn(q, k, v), True) for impl, fn in impls.items()]
    runs[0] = ("sdpa_bf16", "torch SDPA, cuDNN bf16", runs[0][2], True)
    for gran in GRANULARITIES:
        parts = quantize(q, k, v, gran)
        runs.append(
            (
                f"sage_{gran}_kernel",
                "kernel alone, inputs quantized before",
                lambda parts=parts, gran=gran: sage_sm90_quantized(*parts, out_dtype=q.dtype, granularity=gran),
                True,
            )
        )
        runs.append(
            (
                f"sage_{gran}_q_only",
                "kernel + Q's quantization (a window kept quantized)",
                lambda parts=parts, gran=gran: sage_sm90_quantized(
                    *quantize_queries(q, gran), *parts[2:], out_dtype=q.dtype, granularity=gran
                ),
                True,
            )
        )
    runs.append(("sage_quantize", "our quantization of Q, K, V alone", lambda: quantize(q, k, v), False))
    rows = timed_rows(name, shape, runs, warmup=args.warmup, iters=args.iters)
    for row in rows:
        row.update(first_call_s=first.get(row["impl"]), accuracy_vs_fp32=quality.get(row["impl"]))
    return rows


def bench_window_writes(args) -> list[dict]:
    """ms per layer to write a LingBot chunk's K/V into a full window, per window format, eager and compiled."""
    from telefuser.models.lingbot_world_v2.kv_cache import WindowSlots
    from telefuser.models.lingbot_world_v2.window_formats import FP8_KEY_WINDOW, PLAIN_WINDOW, SAGE_WINDOW

    tokens_per_frame, frames, sink, chunk_frames, h, d = 1560, 18, 6, 4, 40, 128
    capacity = frames * tokens_per_frame
    plan = WindowSlots(
        capacity, sink * tokens_per_frame, capacity, chunk_frames * tokens_per_frame, 3 * tokens_per_frame
    )
    slots = plan.slot_rows("cuda")
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    k, v = (torch.randn(1, plan.new_rows, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    formats = {  # kind -> (format, key scales)
        "bf16": (PLAIN_WINDOW, None),
        "fp8 keys": (FP8_KEY_WINDOW, [torch.ones(1, device="cuda")]),
        "sage_sm90": (SAGE_WINDOW, None),
    }
    rows = []
    for kind, (fmt, key_scales) in formats.items():
        buffers = fmt.allocate(
            1, (1, capacity, h, d), [], key_scales, device=torch.device("cuda"), dtype=torch.bfloat16
        )
        layer = buffers.layers[0]
        compiled = torch.compile(fmt.write, fullgraph=True)
        # a full window (plan.kept > 0): not a fresh write, so a sage window keeps its numbers
        for how, fn in (("eager", fmt.write), ("compiled", compiled)):
            ms, times = cuda_time_ms(lambda fn=fn, layer=layer: fn(layer, k, v, slots, False), args.warmup, args.iters)
            rows.append({"window": kind, "how": how, "rows": plan.new_rows, "ms": ms, "ms_all": times})
        if kind == "sage_sm90" and args.profile_writes:
            profile_write(lambda compiled=compiled, layer=layer: compiled(layer, k, v, slots, False))
        del buffers, layer, compiled
        torch.cuda.empty_cache()
    print("\n| window | write | ms per layer |\n|---|---|---|")
    for r in rows:
        print(f"| {r['window']} | {r['how']} | {r['ms']:.3f} |")
    return rows


def profile_write(write) -> None:
    """The CUDA kernels of 10 compiled sage window writes, by total time (where a write's time goes)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            write()
        torch.cuda.synchronize()
    print("\nsage window write, 10 calls, CUDA kernels by total time:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=90))


def print_table(rows: list[dict]) -> None:
    head = ["shape", "impl", "ms", "TFLOP/s", "× cuDNN bf16", *(f"cos / rel L2 {k}" for k in INPUTS), "what"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        acc = r["accuracy_vs_fp32"] or {}
        cells = [
            f"{r['shape']} {r['B']}×{r['S_q']}×{r['S_kv']}×{r['H']}×{r['D']}",
            r["impl"],
            f"{r['ms']:.2f}",
            f"{r['tflops']:.0f}" if r["tflops"] is not None else "-",
            f"{r['speedup_vs_sdpa_bf16']:.2f}" if r["speedup_vs_sdpa_bf16"] is not None else "-",
            *((f"{acc[k][0]:.5f} / {acc[k][1]:.2e}" if k in acc else "") for k in INPUTS),
            r["what"],
        ]
        print("| " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    args = parse_args(argv)
    from telefuser.ops.attention_fp8 import fp8_attention_available
    from telefuser.ops.attention_sage import sage_sm90_available, sage_sm90_build_info

    ok, why = sage_sm90_available()
    if not ok:
        print(f"attention_sage_bench: sage_sm90 is not usable here: {why}", file=sys.stderr)
        return 2
    fp8, fp8_why = fp8_attention_available()
    shapes = [(n, SHAPES[n]) for n in args.shapes]
    for text in args.shape:
        dims = tuple(int(x) for x in text.split(","))
        if len(dims) != 5:
            raise SystemExit(f"--shape takes B,S_q,S_kv,H,D, got {text!r}")
        shapes.append(("custom", dims))
    setup = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_cudnn": torch.backends.cudnn.version(),
        "sage_sm90": why,
        "sage_build": sage_sm90_build_info(),
        "cudnn_fp8": fp8_why,
        "python": platform.python_version(),
        "iters": args.iters,
        "warmup": args.warmup,
        "seed": args.seed,
        "ref_heads": args.ref_heads,
    }
    print(f"{setup['device']}, torch {setup['torch']} (CUDA {setup['torch_cuda']}); {why}; cudnn_fp8: {fp8_why}")
    print(f"median of {args.iters} CUDA-event-timed calls after {args.warmup} warm-up calls\n")
    rows = []
    for name, shape in shapes:
        rows.extend(bench_shape(name, shape, args, fp8))
        torch.cuda.empty_cache()
    print_table(rows)
    writes = bench_window_writes(args) if args.window_writes else None
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        report = {"setup": setup, "rows": rows, "window_writes": writes}
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
