"""Host overhead of a steady DiT forward (issue 24): compiled-function calls, host enqueue, device time, per path.

    python3 tools/bench/host_overhead_bench.py forward                        # LingBot, bf16 + FP8, 832x480 + 416x240
    python3 tools/bench/host_overhead_bench.py forward --variants fp8 --resolutions 416x240 --layers 8
    python3 tools/bench/host_overhead_bench.py session --layers 8              # DiT sessions, graphs off / on
    python3 tools/bench/host_overhead_bench.py call --model minimax_h3 --layers 8   # one DiT call, regions vs pieces
    python3 tools/bench/host_overhead_bench.py call --model wan2.2-ti2v-5b --config tiny --device cpu   # smoke
    torchrun --standalone --nproc-per-node=2 tools/bench/host_overhead_bench.py forward --ulysses 2 --layers 8
    python3 tools/bench/host_overhead_bench.py forward --config tiny --device cpu --resolutions 64x48   # smoke

LingBot-World v2 at the official width (random weights, said so), one forward over a full KV window: the session is
filled chunk by chunk (4 read-only steps and the commit each) until the window is full, then the steady read-only
forward is repeated. Three paths, each on its own fresh session:

- ``pieces``: the former path, each elementwise chain a compiled function of its own (`ops.fusion.cuda_fused`), the
  Ulysses exchange and the attention called from Python: what issue 24 measured (1,120 compiled calls per FP8
  forward);
- ``regions``: one compiled region per block (`ops.regions`), the exchange, attention and window write as opaque
  custom ops, run eagerly;
- ``graph``: the same forward replayed as a CUDA graph on pooled session buffers (`LingBotWorldV2DiT.enable_cuda_graphs`).

Columns: compiled-function calls per forward (`ops.compile_stats`; a graph replay makes none) and graphs compiled
during the timed calls (0 expected); ``enqueue``: host milliseconds until `forward_chunk` returns, the device idle
at the start (the call is then waited for, outside the measurement); ``device``: milliseconds of the synchronized
call (device-bound as long as enqueue < device); ``eager/graph``: the path's device time over the graph's. Under
torchrun --ulysses N every rank measures; rank 0 prints its own row and the per-rank maxima, and ``scatter calls``
counts the Python `scatter_heads` calls of one forward (0 in a replay).

``session``: whole DiT sessions (the camera modulation once per chunk, 4 denoising steps, the commit; no VAE), graphs
off and on, each after a warm-up session; steady seconds per chunk (p50, chunks after the first) and DiT FPS (16
frames per chunk). ``forward`` and ``session`` measure KV-window sessions, LingBot-World v2's (its spec gives the
config).

``call --model NAME``: any registered model's DiT called on its spec's example at --config's shape
(`ModelSpec.example_shape`: the official size's is the release's production call, e.g. MiniMax H3 at 768p 5 s), its
blocks as compiled regions against the former pieces: seconds per call, host enqueue, compiled calls. ``minimax`` is
``call --model minimax_h3``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from telefuser.models.flags import SIZES
from telefuser.models.registry import get_spec, names
from telefuser.ops.attention_registry import check_backend
from telefuser.ops.compile_stats import count_compiled
from telefuser.ops.regions import compile_regions_on
from telefuser.runtime import Runtime

CHUNK_FRAMES = 4
STEPS = (1000.0, 750.0, 500.0, 250.0)
PATHS = ("pieces", "regions", "graph")
VARIANTS = {"bf16": ("none", "sdpa"), "fp8": ("fp8", "cudnn_fp8")}  # (quantization, attention)
SESSION_MODEL = "lingbot_world_v2"  # what forward and session measure: a DiT with KV-window sessions
MODES = ("forward", "session", "call")
MODE_ALIASES = {"minimax": ("call", "minimax_h3")}  # mode -> (mode, --model), the spelling plans use


class Clock:
    """Synchronized timing on this rank; under Ulysses every measurement starts after a barrier."""

    def __init__(self, device: torch.device, parallel: bool):
        self.device, self.parallel = device, parallel

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _start(self) -> float:
        if self.parallel:
            dist.barrier()
        self.sync()
        return time.perf_counter()

    def enqueue(self, fn) -> float:
        start = self._start()
        fn()
        seconds = time.perf_counter() - start
        self.sync()
        return seconds

    def wall(self, fn) -> float:
        start = self._start()
        fn()
        self.sync()
        return time.perf_counter() - start


def parse_resolution(text: str) -> tuple[int, int]:
    width, height = (int(v) for v in text.lower().split("x"))
    if width % 16 or height % 16:
        raise SystemExit(f"resolution {text}: width and height must be multiples of 16")
    return width, height


@contextmanager
def path_of(name: str):
    """`pieces` keeps every region uncompiled (the blocks then take their reference path: compiled chains)."""
    with compile_regions_on() if name == "pieces" else compile_regions_on("cuda"):
        yield


# -- LingBot ----------------------------------------------------------------------------------------------------------
def lingbot_model(args, variant: str, runtime: Runtime):
    device, dtype = runtime.device, runtime.dtype
    spec = get_spec(SESSION_MODEL)
    config = spec.config_of(args.config, layers=args.layers)
    quantization, attn_impl = VARIANTS[variant]
    if device.type != "cuda":
        attn_impl = "sdpa"  # a CPU smoke run: cuDNN FP8 attention needs a GPU
    check_backend(attn_impl)
    model = spec.loader("random")(
        config, 0, device, dtype, attn_impl=attn_impl, init_on_device=device.type == "cuda"
    ).eval()
    runtime.parallelize(model, spec)
    model.quantize(quantization)
    return model


def chunk_data(config, width: int, height: int, device, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    grid_h, grid_w = height // 8, width // 8
    latents = torch.randn(1, config.in_dim, CHUNK_FRAMES, grid_h, grid_w, generator=g).to(device)
    tokens_per_frame = (grid_h // 2) * (grid_w // 2)
    camera = (torch.randn(1, CHUNK_FRAMES * tokens_per_frame, config.camera_feature_dim, generator=g) * 0.1).to(device)
    text = torch.randn(1, config.text_len, config.text_dim, generator=g).to(device)
    return latents, camera, text, tokens_per_frame


def run_chunk(model, session, latents, modulation, device) -> None:
    for t in STEPS:
        model.forward_chunk(session, latents, torch.full((1,), t, device=device), modulation, update_cache=False)
    model.commit_chunk(session, latents, torch.zeros(1, device=device), modulation)


def full_window_session(model, data, device):
    latents, camera, text, tokens_per_frame = data
    session = model.new_window(1, text.to(model.compute_dtype), tokens_per_frame=tokens_per_frame, device=device)
    modulation = model.camera_modulation(camera)
    while session.committed < session.capacity:
        run_chunk(model, session, latents, modulation, device)
    return session, modulation


def count_scatters(model):
    """A counter of the communicator's Python `scatter_heads` calls (None without Ulysses)."""
    comm = model.communicator
    if comm is None:
        return None
    calls = [0]
    real = comm.scatter_heads

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    comm.scatter_heads = counted
    return calls


def forward_row(model, path: str, data, device, clock: Clock, iters: int) -> dict:
    with path_of(path):
        model.enable_cuda_graphs(path == "graph")
        session, modulation = full_window_session(model, data, device)  # graph: captures every key on the way
        latents = data[0]
        t = torch.full((1,), 500.0, device=device)

        def forward():
            model.forward_chunk(session, latents, t, modulation, update_cache=False)

        forward()  # the steady forward once more (the graph captured above replays from here)
        scatters = count_scatters(model)
        with count_compiled() as stats:
            forward()
        calls, scatter_calls = stats.calls, (scatters[0] if scatters else None)
        with count_compiled() as timed_stats:
            enqueue = [clock.enqueue(forward) for _ in range(iters)]
            wall = [clock.wall(forward) for _ in range(iters)]
        session.close()
        if scatters is not None:
            del model.communicator.scatter_heads  # the instance attribute; the method is back
    model.enable_cuda_graphs(False)
    return {
        "path": path,
        "compiled_calls": calls,
        "compiles_while_timed": timed_stats.compiles,
        "enqueue_ms": 1e3 * statistics.median(enqueue),
        "device_ms": 1e3 * statistics.median(wall),
        "scatter_calls": scatter_calls,
    }


def with_rank_maxima(row: dict, parallel: bool, keys: tuple[str, ...]) -> dict:
    """Under Ulysses: rank 0's row with the maximum over every rank of each of `keys` added (``<key>_max``)."""
    if not parallel:
        return row
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    return {**row, **{f"{key}_max": max(r[key] for r in rows) for key in keys}}


def lingbot_cases(args, runtime):
    """(variant, model, resolution, chunk data) for every variant and canvas asked for; one model per variant."""
    device = runtime.device
    for variant in args.variants:
        model = lingbot_model(args, variant, runtime)
        for resolution in args.resolutions:
            yield variant, model, resolution, chunk_data(model.config, *parse_resolution(resolution), device)
        model.enable_cuda_graphs(False)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def forward_mode(args, runtime, clock) -> list[dict]:
    device, parallel = runtime.device, runtime.mesh is not None
    results = []
    for variant, model, resolution, data in lingbot_cases(args, runtime):
        for path in args.paths:
            if path == "graph" and device.type != "cuda":
                continue
            row = forward_row(model, path, data, device, clock, args.iters)
            row = with_rank_maxima(row, parallel, ("enqueue_ms", "device_ms"))
            row.update(variant=variant, resolution=resolution, layers=model.config.num_layers)
            results.append(row)
            say(runtime, f"  {variant} {resolution} {path}: {json.dumps(row)}")
    graph = {(r["variant"], r["resolution"]): r["device_ms"] for r in results if r["path"] == "graph"}
    for row in results:
        reference = graph.get((row["variant"], row["resolution"]))
        row["eager_over_graph"] = row["device_ms"] / reference if reference else None
    return results


def forward_table(results: list[dict], parallel: bool) -> str:
    head = (
        "| variant | size | layers | path | compiled calls / forward | compiles while timed | enqueue ms | device ms |"
    )
    head += " eager / graph |" + (" scatter calls | max enqueue ms (ranks) |" if parallel else "")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in results:
        ratio = f"{r['eager_over_graph']:.2f}" if r.get("eager_over_graph") else "-"
        line = (
            f"| {r['variant']} | {r['resolution']} | {r['layers']} | {r['path']} | {r['compiled_calls']} | "
            f"{r['compiles_while_timed']} | {r['enqueue_ms']:.1f} | {r['device_ms']:.1f} | {ratio} |"
        )
        if parallel:
            line += f" {r['scatter_calls']} | {r['enqueue_ms_max']:.1f} |"
        lines.append(line)
    return "\n".join(lines)


def timed_session(model, data, device, clock: Clock, chunks: int) -> list[float]:
    latents, camera, text, tokens_per_frame = data
    session = model.new_window(1, text.to(model.compute_dtype), tokens_per_frame=tokens_per_frame, device=device)
    seconds = []
    try:
        for _ in range(chunks):
            seconds.append(
                clock.wall(lambda: run_chunk(model, session, latents, model.camera_modulation(camera), device))
            )
    finally:
        session.close()
    return seconds


def session_mode(args, runtime, clock) -> list[dict]:
    device = runtime.device
    results = []
    for variant, model, resolution, data in lingbot_cases(args, runtime):
        for graphs in (False, True) if device.type == "cuda" else (False,):
            model.enable_cuda_graphs(graphs)
            timed_session(model, data, device, clock, args.chunks)  # warm-up: compiles, captures
            with count_compiled() as stats:
                seconds = timed_session(model, data, device, clock, args.chunks)
            steady = seconds[1:] or seconds
            row = {
                "variant": variant,
                "resolution": resolution,
                "layers": model.config.num_layers,
                "graphs": graphs,
                "chunks": args.chunks,
                "p50_s_per_chunk": statistics.median(steady),
                "dit_fps": 4 * CHUNK_FRAMES * len(steady) / sum(steady),
                "compiles": stats.compiles,
                "seconds": seconds,
            }
            results.append(row)
            say(runtime, f"  {json.dumps(row)}")
    return results


def session_table(results: list[dict]) -> str:
    lines = [
        "| variant | size | layers | CUDA graphs | steady s / chunk (p50) | DiT FPS | off / on | compiles |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    on = {(r["variant"], r["resolution"]): r["p50_s_per_chunk"] for r in results if r["graphs"]}
    for r in results:
        ratio = on.get((r["variant"], r["resolution"]))
        ratio = f"{r['p50_s_per_chunk'] / ratio:.3f}" if ratio and not r["graphs"] else "-"
        lines.append(
            f"| {r['variant']} | {r['resolution']} | {r['layers']} | {'on' if r['graphs'] else 'off'} | "
            f"{r['p50_s_per_chunk']:.4f} | {r['dit_fps']:.2f} | {ratio} | {r['compiles']} |"
        )
    return "\n".join(lines)


# -- one call of any model ------------------------------------------------------------------------------------------
def call_mode(args, runtime, clock) -> list[dict]:
    device, dtype = runtime.device, runtime.dtype
    spec = get_spec(args.model)
    config = spec.config_of(args.config, layers=args.layers)
    model = spec.build_random(config, seed=0, device=device, dtype=dtype, init_on_device=device.type == "cuda")
    model = runtime.parallelize(model.eval(), spec)
    quantization = "fp8" if "fp8" in args.variants else "none"
    model.quantize(quantization)
    results = []
    with torch.inference_mode():
        call = spec.example_forward(model, seed=0, **spec.example_shape(args.config)).run
        for path in ("pieces", "regions"):
            with path_of(path):
                call()  # compiles
                with count_compiled() as stats:
                    call()
                with count_compiled() as timed_stats:
                    enqueue = [clock.enqueue(call) for _ in range(args.iters)]
                    wall = [clock.wall(call) for _ in range(args.iters)]
            row = {
                "model": args.model,
                "path": path,
                "layers": spec.num_layers(config),
                "quantization": quantization,
                "compiled_calls": stats.calls,
                "compiles_while_timed": timed_stats.compiles,
                "enqueue_s": statistics.median(enqueue),
                "seconds_per_call": statistics.median(wall),
            }
            results.append(with_rank_maxima(row, runtime.mesh is not None, ("enqueue_s", "seconds_per_call")))
            say(runtime, f"  {json.dumps(row)}")
    return results


def call_table(results: list[dict]) -> str:
    lines = [
        "| model | path | layers | GEMMs | compiled calls / call | compiles while timed | enqueue s | s / call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['path']} | {r['layers']} | {r['quantization']} | {r['compiled_calls']} | "
            f"{r['compiles_while_timed']} | {r['enqueue_s']:.4f} | {r['seconds_per_call']:.4f} |"
        )
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------------------------------
def say(runtime, text: str) -> None:
    if runtime.rank == 0:
        print(text, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=[*MODES, *MODE_ALIASES])
    p.add_argument("--model", choices=names(), default=None, help="call: the registered model to call")
    p.add_argument("--config", choices=SIZES, default="official")
    p.add_argument("--layers", type=int, default=None, help="override the DiT's block count")
    p.add_argument("--variants", default="bf16,fp8", help="bf16 and/or fp8 (FP8 GEMMs + cuDNN FP8 attention)")
    p.add_argument("--resolutions", default="832x480,416x240", help="LingBot canvases WIDTHxHEIGHT")
    p.add_argument("--paths", default=",".join(PATHS), help=f"forward: which of {', '.join(PATHS)}")
    p.add_argument("--iters", type=int, default=5, help="timed calls per row (medians)")
    p.add_argument("--chunks", type=int, default=8, help="session: chunks per timed session")
    p.add_argument("--ulysses", type=int, default=1, help="Ulysses degree (under torchrun)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--output", type=Path, default=None, help="JSON file for the rows")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.resolutions = [r for r in args.resolutions.split(",") if r]
    args.paths = [x for x in args.paths.split(",") if x]
    unknown = [v for v in args.variants if v not in VARIANTS] + [x for x in args.paths if x not in PATHS]
    if unknown:
        p.error(f"unknown variants or paths: {unknown}")
    if args.mode in MODE_ALIASES:
        if args.model is not None:
            p.error(f"{args.mode} names its model; use call --model {args.model}")
        args.mode, args.model = MODE_ALIASES[args.mode]
    if (args.mode == "call") != (args.model is not None):
        p.error("call needs --model" if args.mode == "call" else f"{args.mode} measures {SESSION_MODEL}; no --model")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    runtime = Runtime.launch(ulysses_degree=args.ulysses, device=args.device)
    clock = Clock(runtime.device, runtime.mesh is not None)
    parallel = runtime.mesh is not None
    try:
        with torch.no_grad():
            if args.mode == "forward":
                rows = forward_mode(args, runtime, clock)
                table = forward_table(rows, parallel)
            elif args.mode == "session":
                rows = session_mode(args, runtime, clock)
                table = session_table(rows)
            else:
                rows = call_mode(args, runtime, clock)
                table = call_table(rows)
        weights = "random weights" + (f", Ulysses {args.ulysses}" if parallel else "")
        say(
            runtime,
            f"\n{args.mode} ({args.config}, {weights}, {torch.cuda.get_device_name() if runtime.device.type == 'cuda' else 'CPU'}):\n{table}",
        )
        if args.output and runtime.rank == 0:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(
                json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2)
            )
    finally:
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
