r"""Profile a registered model's V-first attention layers (attention replaced by identity) and measure the V-copy /
Q-K prep overlap.

The model's own DiT runs, through its spec: `--config`'s size (`ModelSpec.config_of`) cut to `--layers` blocks
(default 1), seeded random weights, attention ``identity`` (so the trace shows what surrounds attention), split by
the spec's plan over the torchrun world (TP `--tp` innermost, Ulysses over the rest), and called on the spec's
example at that size (`ModelSpec.example_shape`: the official size's is the release's production call; a model
with a KV window reads a chunk after filling it). Each block makes one V-first exchange per call; the figures are per
block call. Attention layers that run dense (MiniMax H3's prompt refiner) open the same phase ranges without an
exchange: `phase_ranges` counts them, and their few rows' Q/K work adds to the Q/K figures.

    torchrun --standalone --nproc-per-node=2 -m tools.validation.profile_ulysses_overlap --model minimax_h3 \
        --output /tmp/overlap
    torchrun --standalone --nproc-per-node=4 -m tools.validation.profile_ulysses_overlap --model minimax_h3 --tp 2
    torchrun --standalone --nproc-per-node=4 -m tools.validation.profile_ulysses_overlap --model lingbot_world_v2
    torchrun --standalone --nproc-per-node=2 -m tools.validation.profile_ulysses_overlap --model lingbot_world_v2 \
        --config tiny --device cpu --transport host-shm --output /tmp/overlap_cpu

`--device cpu` with `--config tiny` is a smoke run of the same code over gloo (the portable or host-shm transport;
a CPU trace has no GPU activity, so the overlap figures are 0 there).

The blocks run outside their compiled regions (the elementwise chains inside them still fused): the phase ranges are
host ranges, and a compiled region has none (dynamo drops them), so a trace of compiled blocks holds no range to
measure. A trace without the ranges ends the run with status 1 instead of reporting zeros.

Runs unchanged with processes sharing one GPU (CUDA IPC) or one GPU per rank. Rank 0 exports a Chrome trace
(`trace_rank0.json`, open it in chrome://tracing or Perfetto) and prints, per layer call, how long the V scatter's
copies ran on the GPU at the same time as the Q/K preparation kernels. Two readings:

* phase ranges (`telefuser.profiling.overlap.v_copy_overlap`): all GPU work started inside a layer's
  `ulysses.scatter.v` range against all GPU work started inside its `ulysses.qk_norm_rope` range. Where a model
  projects inside the ranges (V's GEMM in the V range; Q's and K's GEMMs, norms and the Q scatter's copies in the
  Q/K range), they count here too;
* transfer vs compute (`transfer_compute_overlap`): only the V range's transfers (copies, NCCL kernels) against
  only the Q/K range's compute kernels, i.e. how much of the V transfer hides behind Q/K work. Where the ranges hold
  only the V copies and the Q/K norm + RoPE kernels, it equals the first reading.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from telefuser.distributed.mesh import ParallelConfig, init_distributed
from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.schedule import PHASE_QK_PREP, PHASE_SCATTER_V
from telefuser.distributed.ulysses.selection import TRANSPORTS
from telefuser.models.flags import SIZES
from telefuser.models.registry import get_spec, names
from telefuser.ops.regions import compile_regions_on
from telefuser.profiling.overlap import (
    OverlapReport,
    gpu_intervals_of_phase,
    intersection_length,
    union,
    v_copy_overlap,
)

_GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def layout(model: str, size: str, world: int, tp: int = 1) -> dict:
    """How `world` ranks split the model's heads at `size`: TP `tp` innermost, Ulysses over the rest. A pure function
    (no devices, no process group); a split the heads or the world do not allow raises ValueError."""
    spec = get_spec(model)
    if tp < 1 or world % tp:
        raise ValueError(f"--tp {tp} does not divide the world of {world} ranks")
    if tp > 1 and not spec.tensor_parallel:
        raise ValueError(f"{model}'s plan takes no tensor parallelism (--tp {tp})")
    ulysses = world // tp
    if ulysses < 2:
        raise ValueError(f"Ulysses degree {ulysses} (world {world} / tp {tp}): the profile needs an exchange")
    heads = spec.num_heads(spec.config_of(size))
    ParallelConfig(ulysses_degree=ulysses, tp_degree=tp).check_heads(heads)  # ParallelConfigError, a ValueError
    return dict(model=model, size=size, tp=tp, ulysses=ulysses, heads=heads, heads_after_scatter=heads // world)


def build_call(args, mesh, device: torch.device, dtype: torch.dtype):
    """(call, model): the model's example forward at --config's shape on this rank's share of the split DiT, with
    --layers blocks and identity attention; the same weights and inputs on every rank."""
    spec = get_spec(args.model)
    config = spec.config_of(args.config, layers=args.layers)
    init_on_device = device.type == "cuda"
    model = spec.build_random(
        config, seed=0, device=device, dtype=dtype, attn_impl="identity", init_on_device=init_on_device
    )
    transport = partial(UlyssesCommunicator, transport=args.transport)
    model = spec.parallelize(model.eval(), mesh, communicator_factory=transport)
    example = spec.example_forward(model, seed=1, **spec.example_shape(args.config))
    return example.run, model


def _is_transfer(event: dict) -> bool:
    nccl = "nccl" in event.get("name", "").lower()
    return event.get("cat") == "gpu_memcpy" or (event.get("cat") == "kernel" and nccl)


def _is_compute(event: dict) -> bool:
    return event.get("cat") == "kernel" and "nccl" not in event.get("name", "").lower()


def transfer_compute_overlap(trace: dict | str | Path) -> OverlapReport:
    """Like `v_copy_overlap`, but only the V range's transfers (copies, NCCL kernels) against only the Q/K range's
    compute kernels (not the Q scatter's copies, which LingBot's Q/K range starts too)."""
    if not isinstance(trace, dict):
        trace = json.loads(Path(trace).read_text())
    events = trace["traceEvents"] if "traceEvents" in trace else trace

    def keeping(keep):  # CPU events all stay (they carry the ranges and correlation ids); GPU events if `keep`
        return [e for e in events if e.get("cat") not in _GPU_CATEGORIES or keep(e)]

    v = gpu_intervals_of_phase(keeping(_is_transfer), PHASE_SCATTER_V)
    qk = gpu_intervals_of_phase(keeping(_is_compute), PHASE_QK_PREP)
    return OverlapReport(
        v_copy_us=sum(i.length for i in union(v)),
        qk_prep_us=sum(i.length for i in union(qk)),
        overlap_us=intersection_length(v, qk),
    )


def phase_ranges(trace: dict) -> dict[str, int]:
    """How often the trace holds each phase range of the V-first schedule (one per layer call, when the layer ran
    with a communicator and the profiler saw it)."""
    events = trace["traceEvents"] if "traceEvents" in trace else trace
    names = (PHASE_SCATTER_V, PHASE_QK_PREP)
    counts = dict.fromkeys(names, 0)
    for e in events:
        if e.get("ph") == "X" and e.get("name") in counts and e.get("cat") in ("user_annotation", "cpu_op"):
            counts[e["name"]] += 1
    return counts


def missing_ranges(ranges: dict[str, int]) -> str | None:
    """Why a trace cannot be measured (a phase range it never holds), or None."""
    absent = [name for name, count in ranges.items() if count == 0]
    if not absent:
        return None
    return (
        f"the trace holds no {' or '.join(absent)} range, so there is nothing to measure: did the blocks run inside "
        "a compiled region, or without a Ulysses exchange?"
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=names(), required=True, help="a registered model")
    p.add_argument("--config", choices=SIZES, default="official", help="the DiT size (use tiny with --device cpu)")
    p.add_argument("--tp", type=int, default=1, help="TP degree (innermost), for a model whose plan takes it")
    p.add_argument("--layers", type=int, default=1, help="blocks in the profiled DiT (one V-first exchange each)")
    p.add_argument("--transport", choices=TRANSPORTS, default="auto")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: a smoke run of the same code over gloo (use --config tiny; no GPU overlap to see)",
    )
    p.add_argument("--output", type=Path, default=Path("outputs/overlap"))
    args = p.parse_args(argv)
    if args.iters < 1:
        p.error("--iters must be at least 1")
    if args.layers < 1:
        p.error("--layers must be at least 1")
    try:  # a bad split fails on every rank before any collective
        args.layout = layout(args.model, args.config, int(os.environ.get("WORLD_SIZE", "1")), args.tp)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    on_gpu = args.device == "cuda"
    if on_gpu:
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda asked for, but no CUDA GPU is visible; use --device cpu --config tiny")
        one_gpu_per_rank = torch.cuda.device_count() >= world
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) if one_gpu_per_rank else 0)
        device, dtype = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
        backend = "cpu:gloo,cuda:nccl" if one_gpu_per_rank else "gloo"
    else:
        one_gpu_per_rank = False
        device, dtype, backend = torch.device("cpu"), torch.float32, "gloo"
    shape = args.layout
    mesh = init_distributed(ParallelConfig(ulysses_degree=shape["ulysses"], tp_degree=args.tp), backend=backend)
    rank = dist.get_rank()
    call, model = build_call(args, mesh, device, dtype)

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    with torch.inference_mode(), compile_regions_on():  # no device compiles regions: the ranges stay in the trace
        for _ in range(3):
            call()
        sync()
        dist.barrier()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=activities) as prof:
            for _ in range(args.iters):
                call()
            sync()
    backend = model.communicator.transport
    model.close()
    problem = None
    if rank == 0:
        args.output.mkdir(parents=True, exist_ok=True)
        trace = args.output / "trace_rank0.json"
        prof.export_chrome_trace(str(trace))
        trace_events = json.loads(trace.read_text())
        ranges = phase_ranges(trace_events)
        problem = missing_ranges(ranges)
        calls = args.iters * args.layers  # block calls in the trace, one exchange each
        per_call = {k: v / calls for k, v in vars(v_copy_overlap(trace_events)).items()}
        split = {k: v / calls for k, v in vars(transfer_compute_overlap(trace_events)).items()}
        summary = {
            "model": args.model,
            "config": args.config,
            "layers": args.layers,
            "world": world,
            "transport": backend,
            "one_gpu_per_rank": one_gpu_per_rank,
            "device": torch.cuda.get_device_name() if on_gpu else "cpu",
            "iters": args.iters,
            "example_shape": get_spec(args.model).example_shape(args.config),
            "rank0_shape": shape,
            "phase_ranges": ranges,
            "per_layer_call_us": per_call,
            "transfer_vs_compute_per_layer_call_us": split,
        }
        (args.output / "overlap.json").write_text(json.dumps(summary, indent=2) + "\n")
        label = f"{args.model} {args.config}, world {world} (TP{args.tp} x U{shape['ulysses']}), {backend}"
        print(
            f"{label}, {shape['heads_after_scatter']} heads per rank after the scatter: per layer call: V range "
            f"{per_call['v_copy_us']:.1f} us, Q/K range {per_call['qk_prep_us']:.1f} us, overlap "
            f"{per_call['overlap_us']:.1f} us -> {trace}"
        )
        print(
            f"{label}, transfer vs compute: V transfer {split['v_copy_us']:.1f} us, Q/K compute kernels "
            f"{split['qk_prep_us']:.1f} us, overlap {split['overlap_us']:.1f} us"
            + ("" if on_gpu else " (CPU run: no GPU activity in the trace)")
        )
    dist.destroy_process_group()
    if rank == 0 and problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
