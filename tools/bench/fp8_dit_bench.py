"""FP8 GEMMs against bf16 on one DiT call, side by side in one run, with the quality gate beside the speed.

    python tools/bench/fp8_dit_bench.py --model minimax_h3           # official MiniMax H3 call, 768p 5 s
    python tools/bench/fp8_dit_bench.py --model lingbot_world_v2     # official LingBot chunk reading a full window
    python tools/bench/fp8_dit_bench.py --model wan2.2-t2v-a14b      # one official Wan 2.2 CFG step, 720p 81 frames
    python tools/bench/fp8_dit_bench.py --model wan2.2-ti2v-5b --config tiny --device cpu --iters 1  # CPU smoke

--model takes any registered model whose DiT has FP8 linears (its spec lists the "fp8" quantization). The call is
the spec's example forward (`ModelSpec.example_forward`) at the spec's shape for --config (`example_shape`: the
official size's is the release's production call), on a random-weight model (said so); a copy of it with its block
GEMMs in FP8 (`quantize("fp8")`) takes the same seeded input, alternately, --iters times after a warm-up each. The
table gives each one's median seconds per call, the speed-up, and the FP8 output against bf16: relative L2 and
cosine (the gate: cosine >= --min-cosine).

--fp8-attention adds ``bf16+fp8-attn`` (bf16 GEMMs, attention in FP8: ``cudnn_fp8``, cuDNN frontend,
`ops.attention_fp8`) and ``fp8+fp8-attn`` (both in FP8); they need a Hopper GPU and nvidia-cudnn-frontend and face
the same gate. --sage adds ``bf16+sage`` and ``fp8+sage``: attention through SageAttention2's SM90 kernel
(``sage_sm90``, INT8 QK / FP8 PV, `ops.attention_sage`), which needs its SM90 build. --variants picks a subset of
those (bf16, the reference, always runs). An attention implementation this machine lacks ends the run at once with
the reason, before any model is built.

--sequential keeps one copy: bf16 runs its warm-up and --iters calls, then the same model is quantized in place and
FP8 runs the same. The official MiniMax H3 DiT and its activations at 768p 5 s do not fit twice on one 141 GB GPU
(a bf16 model beside its FP8 copy ran out of memory on the H200).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from telefuser.models.registry import get_spec, names
from telefuser.runtime import Runtime

VARIANTS = ("bf16", "bf16+fp8-attn", "bf16+sage", "fp8", "fp8+fp8-attn", "fp8+sage")  # a sequential run's order
ATTENTION = {"fp8-attn": "cudnn_fp8", "sage": "sage_sm90"}  # a variant's suffix -> its attention implementation
SEED = 0


def attention_of(variant: str) -> str:
    suffix = variant.partition("+")[2]
    return ATTENTION.get(suffix, "sdpa")


def fp8_models() -> list[str]:
    """The registered models whose DiT quantizes its block linears to FP8."""
    return [name for name in names() if "fp8" in get_spec(name).quantizations]


def build_model(spec, size: str, layers: int | None, device, dtype):
    """The spec's DiT of `size` (with `layers` blocks when given), seeded random weights, in eval mode."""
    config = spec.config_of(size, layers=layers)
    return spec.build_random(config, seed=SEED, device=device, dtype=dtype, init_on_device=device.type == "cuda").eval()


def preparer(spec, size: str):
    """model -> its call: the spec's example forward at `size`'s shape, the outputs flattened into one vector. The
    inputs are built (and any state the example keeps, such as a KV window, filled) here, untimed."""
    shape = spec.example_shape(size)

    def prepare(model):
        example = spec.example_forward(model, seed=SEED, **shape)
        return lambda: torch.cat([output.flatten().float() for output in example.run()])

    return prepare


def timed(call, on_gpu: bool) -> tuple[float, torch.Tensor]:
    if on_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = call()
    if on_gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=fp8_models(), required=True, help="a registered model with FP8 linears")
    p.add_argument("--config", default="official", help="a DiT size of the model's spec (tiny, official)")
    p.add_argument("--layers", type=int, default=None, help="override the DiT's block count")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--min-cosine", type=float, default=0.99)
    p.add_argument("--device", default=None)
    p.add_argument("--sequential", action="store_true", help="one copy of the model: bf16 first, then FP8 in place")
    p.add_argument("--fp8-attention", action="store_true", help="add bf16+fp8-attn and fp8+fp8-attn (cuDNN FP8)")
    p.add_argument("--sage", action="store_true", help="add bf16+sage and fp8+sage (SageAttention2 SM90)")
    p.add_argument("--variants", default=None, help=f"comma-separated subset of {', '.join(VARIANTS)}")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    sizes = get_spec(args.model).sizes
    if args.config not in sizes:
        p.error(f"--config {args.config}: {args.model} has the sizes {', '.join(sizes)}")
    if args.variants is None:
        extra = {"fp8-attn": args.fp8_attention, "sage": args.sage}
        args.variants = [v for v in VARIANTS if "+" not in v or extra[v.partition("+")[2]]]
    else:
        chosen = {v.strip() for v in args.variants.split(",") if v.strip()}
        if chosen - set(VARIANTS):
            p.error(f"--variants: unknown {sorted(chosen - set(VARIANTS))}; choose from {', '.join(VARIANTS)}")
        args.variants = [v for v in VARIANTS if v in chosen | {"bf16"}]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from telefuser.ops.attention_registry import check_backend

    for impl in sorted({attention_of(v) for v in args.variants}):
        try:
            check_backend(impl)  # before any model time is spent
        except (RuntimeError, ValueError) as exc:
            raise SystemExit(f"fp8_dit_bench: {exc}") from None
    runtime = Runtime.launch(device=args.device)
    device, dtype, on_gpu = runtime.device, runtime.dtype, runtime.device.type == "cuda"
    spec = get_spec(args.model)
    model = build_model(spec, args.config, args.layers, device, dtype)
    prepare = preparer(spec, args.config)
    print(f"{args.model} ({args.config}, {dtype}, random weights: timings and error figures only)", flush=True)
    seconds = {name: [] for name in args.variants}
    outputs = {}
    with torch.inference_mode():
        if args.sequential:
            quantized = False
            for name, times in seconds.items():  # VARIANTS order: the bf16-GEMM ones before the model is quantized
                if name.startswith("fp8") and not quantized:
                    model.quantize("fp8")
                    quantized = True
                model.attn_impl = attention_of(name)
                call = prepare(model)
                outputs[name] = call()  # warm-up: allocator, kernels, compilation
                for _ in range(args.iters):
                    s, outputs[name] = timed(call, on_gpu)
                    times.append(s)
                del call
        else:
            fp8 = None
            if any(name.startswith("fp8") for name in args.variants):
                fp8 = copy.deepcopy(model)
                fp8.quantize("fp8")

            def with_attention(m, impl):  # shares m's modules; only the attention implementation differs
                other = copy.copy(m)
                other.attn_impl = impl
                return other

            calls = {
                name: prepare(with_attention(fp8 if name.startswith("fp8") else model, attention_of(name)))
                for name in args.variants
            }
            for name, call in calls.items():  # warm-up: allocator, kernels, compilation
                outputs[name] = call()
            for _ in range(args.iters):
                for name, call in calls.items():
                    s, outputs[name] = timed(call, on_gpu)
                    seconds[name].append(s)
    quality = {}
    for name in seconds:
        if name != "bf16":
            a, b = outputs[name].double(), outputs["bf16"].double()
            quality[name] = {
                "relative_l2": ((a - b).norm() / b.norm()).item(),
                "cosine": torch.nn.functional.cosine_similarity(a, b, dim=0).item(),
            }
    median = {name: statistics.median(v) for name, v in seconds.items()}
    print("\n| variant | s/call (median) | vs bf16 | rel. L2 vs bf16 | cosine vs bf16 |\n|---|---|---|---|---|")
    for name in seconds:
        q = quality.get(name)
        errors = f"{q['relative_l2']:.3e} | {q['cosine']:.5f}" if q else "- | -"
        print(f"| {name} | {median[name]:.4f} | {median['bf16'] / median[name]:.3f}x | {errors} |")
    gate = all(q["cosine"] >= args.min_cosine for q in quality.values())
    for name, q in quality.items():
        passed = q["cosine"] >= args.min_cosine
        print(
            f"\n{name} against bf16: relative L2 {q['relative_l2']:.3e}, cosine {q['cosine']:.5f} "
            f"({'passes' if passed else 'FAILS'} the gate cosine >= {args.min_cosine})"
        )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "mode": "sequential" if args.sequential else "alternating",
                    "seconds": seconds,
                    "median_s": median,
                    "relative_l2": quality.get("fp8", {}).get("relative_l2"),
                    "cosine": quality.get("fp8", {}).get("cosine"),
                    "quality": quality,
                    "gate_passed": gate,
                },
                indent=2,
            )
            + "\n"
        )
    runtime.close()
    return 0 if gate else 1


if __name__ == "__main__":
    sys.exit(main())
