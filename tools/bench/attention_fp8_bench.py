"""cuDNN FP8 attention (``cudnn_fp8``) against torch's cuDNN bf16 SDPA, side by side in one run, on one GPU.

    python tools/bench/attention_fp8_bench.py                         # LingBot chunk and MiniMax H3 shapes
    python tools/bench/attention_fp8_bench.py --shapes lingbot --iters 50 --output fp8_attention.json
    python tools/bench/attention_fp8_bench.py --shape 1,4096,4096,24,128   # any B,S_q,S_kv,H,D

Per shape, on the same random bf16 ``[B, S, H, D]`` inputs (N(0, 1), fixed seed), CUDA-event timed, median of
--iters calls after --warmup calls:

- ``sdpa_bf16``: `telefuser.ops.attention.sdpa` (torch SDPA, cuDNN backend first) on the ``[B, H, S, D]`` views of
  the inputs, as `attention(impl="sdpa")` calls it (without its final ``.contiguous()``);
- ``cudnn_fp8``: `fp8_attention`, everything included: the three amax reductions, the e4m3 quantization of Q/K/V,
  the FP8 kernel and the dequantization of O back to bf16 ``[B, S_q, H, D]``;
- ``fp8_kernel``: the FP8 kernel alone (`fp8_attention_quantized` on inputs quantized once before timing);
- ``fp8_quantize``: the amax + quantization of Q, K and V alone.

TFLOP/s counts 4·B·H·S_q·S_kv·D per call for every row (the quantization row gets none). Accuracy: cosine and
relative L2 of ``cudnn_fp8``'s output against ``sdpa_bf16``'s. The first ``cudnn_fp8`` call builds the cuDNN graph;
its wall time is reported as ``first_call_s``. Needs a CUDA GPU (SM90+) and nvidia-cudnn-frontend.
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

from tools.bench.attention_rows import timed_rows

SHAPES = {  # name -> (B, S_q, S_kv, H, D)
    "lingbot": (1, 6240, 28080, 40, 128),  # a LingBot-World v2 chunk reading its full KV window
    "minimax": (1, 37966, 37966, 56, 128),  # MiniMax H3, 768p 5 s, joint self-attention
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["lingbot", "minimax"])
    p.add_argument("--shape", action="append", default=[], help="extra shape B,S_q,S_kv,H,D (repeatable)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, default=None, help="write the rows and the setup as JSON")
    return p.parse_args(argv)


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    o, r = out.float().flatten(), ref.float().flatten()
    return F.cosine_similarity(o, r, dim=0).item(), ((o - r).norm() / r.norm()).item()


def bench_shape(name: str, shape: tuple[int, ...], args) -> list[dict]:
    from telefuser.ops.attention import sdpa
    from telefuser.ops.attention_fp8 import O_HEADROOM, fp8_attention, fp8_attention_quantized, quantize_fp8

    b, s_q, s_kv, h, d = shape
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, s_kv, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, s_kv, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fp8_attention(q, k, v)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    ref = sdpa(qt, kt, vt).transpose(1, 2)
    cosine, rel_l2 = compare(out, ref)
    del out, ref

    (q8, _, dq), (k8, _, dk), (v8, sv, dv) = quantize_fp8(q), quantize_fp8(k), quantize_fp8(v)
    so = sv * O_HEADROOM
    runs = [
        ("sdpa_bf16", "torch SDPA, cuDNN bf16", lambda: sdpa(qt, kt, vt), True),
        ("cudnn_fp8", "FP8 incl. quantize + dequantize", lambda: fp8_attention(q, k, v), True),
        ("fp8_kernel", "FP8 kernel alone", lambda: fp8_attention_quantized(q8, k8, v8, dq, dk, dv, so), True),
        (
            "fp8_quantize",
            "amax + e4m3 of Q, K, V alone",
            lambda: (quantize_fp8(q), quantize_fp8(k), quantize_fp8(v)),
            False,
        ),
    ]
    rows = timed_rows(name, shape, runs, warmup=args.warmup, iters=args.iters)
    for row in rows:
        if row["impl"] == "cudnn_fp8":
            row.update(cosine=cosine, rel_l2=rel_l2, first_call_s=first_call_s)
    return rows


def print_table(rows: list[dict]) -> None:
    header = f"{'shape':<28} {'impl':<13} {'ms':>9} {'TFLOP/s':>8} {'x sdpa':>7} {'cosine':>8} {'rel L2':>7}  what"
    print(header)
    print("-" * len(header))
    for r in rows:
        shape = f"{r['shape']} {r['B']}x{r['S_q']}x{r['S_kv']}x{r['H']}x{r['D']}"
        tflops = f"{r['tflops']:.0f}" if r["tflops"] is not None else "-"
        speed = f"{r['speedup_vs_sdpa_bf16']:.2f}" if r["speedup_vs_sdpa_bf16"] is not None else "-"
        cos = f"{r['cosine']:.5f}" if "cosine" in r else ""
        rel = f"{r['rel_l2']:.4f}" if "rel_l2" in r else ""
        extra = f" (first call {r['first_call_s']:.2f} s, graph build included)" if "first_call_s" in r else ""
        print(
            f"{shape:<28} {r['impl']:<13} {r['ms']:>9.3f} {tflops:>8} {speed:>7} {cos:>8} {rel:>7}  {r['what']}{extra}"
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_fp8_bench: needs a CUDA GPU (SM90+ with nvidia-cudnn-frontend); none here", file=sys.stderr)
        return 2
    from telefuser.ops.attention_fp8 import fp8_attention_available

    ok, why = fp8_attention_available()
    if not ok:
        print(f"attention_fp8_bench: cudnn_fp8 is not usable here: {why}", file=sys.stderr)
        return 2
    shapes = [(n, SHAPES[n]) for n in args.shapes]
    for text in args.shape:
        dims = tuple(int(x) for x in text.split(","))
        if len(dims) != 5:
            raise SystemExit(f"--shape takes B,S_q,S_kv,H,D, got {text!r}")
        shapes.append(("custom", dims))
    setup = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "torch_cudnn": torch.backends.cudnn.version(),
        "fp8": why,
        "python": platform.python_version(),
        "iters": args.iters,
        "warmup": args.warmup,
        "seed": args.seed,
    }
    print(f"{setup['device']}, torch {setup['torch']} (cuDNN {setup['torch_cudnn']}), {why}")
    print(
        f"median of {args.iters} CUDA-event-timed calls after {args.warmup} warm-up calls; random N(0, 1) bf16 inputs\n"
    )
    rows = []
    for name, shape in shapes:
        rows.extend(bench_shape(name, shape, args))
        torch.cuda.empty_cache()  # the previous shape's inputs are gone
    print_table(rows)
    if args.output is not None:
        args.output.write_text(json.dumps({"setup": setup, "rows": rows}, indent=2) + "\n")
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
