r"""LingBot-World v2 DiT on one GPU (or a Ulysses group): chunk-by-chunk session timing with achieved TFLOP/s, and
one forward side by side with diffusers' WanTransformer3DModel.

    python tools/bench/lingbot_world_bench.py session                  # official config, 832x480, 8 chunks
    python tools/bench/lingbot_world_bench.py vs-diffusers             # 32,760 and 6,240 tokens, Q = K
    torchrun --standalone --nproc-per-node=2 tools/bench/lingbot_world_bench.py session --layers 8 --ulysses 2
    torchrun --standalone --nproc-per-node=4 tools/bench/lingbot_world_bench.py session --ulysses 4 \
        --transports portable,auto                                    # both transports side by side
    python tools/bench/lingbot_world_bench.py session --config tiny --device cpu --resolution 64x48 --chunks 3

session: every chunk is the DiT work of the session pipeline: the camera modulation once, 4 denoising calls that read
the KV window, and the clean-KV commit at t=0 (`commit_chunk`: the last block stops after its K/V, no head); no VAE,
no text encoder (`examples/lingbot_world_v2/run_i2v.py` times those too). A first session counts each chunk's FLOPs;
a second, identical one is timed with synchronized boundaries. Steady figures exclude chunk 0, as the seed defines
them.

FLOPs (telefuser/profiling/flop_rates.py): matmuls and convolutions as torch's FlopCounterMode sees them dispatched,
plus attention by formula (4·B·H·Sq·Sk·D per call, from the window plan: self-attention over the window, cross-attention
over the 512 prompt rows), so backends outside aten (flash-attn-4, SageAttention) are counted like SDPA. With torch
SDPA the counter's own attention count is reported beside the formula's (they agree; CI checks it). Rates are given
against both ceilings: the lent H200's measured bf16 matmul rate (786 TFLOP/s) and the H200 datasheet's dense bf16
(989 TFLOP/s).

session --transports a,b,... (with --ulysses N under torchrun) compares Ulysses transports (auto, portable, ce-symm,
ce-ipc, host-shm) in one process: the model opens one communicator per transport (in the order given, on every rank
alike) and warms each up with a short session; then --iters rounds each time one whole session per transport, the order
rotating every round, so every transport sees the same clocks and neighbours. Every session is made after its
transport is switched in. Each communicator is opened once and kept: re-opening it per switch would put its setup
(buffers, peer mappings) into the timed session. The table gives each transport's steady DiT p50 s/chunk and FPS over
all its rounds and the ratio to the first transport; "runs on" is the transport the communicator actually selected
(a copy-engine transport that a group cannot use falls back to portable). With one transport one session is timed.

vs-diffusers: our DiT (an empty session and one chunk, so queries = keys = the chunk's tokens) against diffusers'
WanTransformer3DModel built at the same dimensions, timed alternately in one process. diffusers calls torch SDPA with
torch's default backend order; ours puts cuDNN first and runs its elementwise chains as compiled kernels (ops.fusion).
diffusers is also run with cuDNN first, so the table separates the attention backend from everything else, and at its
best settings: diffusers' own cuDNN attention backend (`set_attention_backend("_native_cudnn")`) and regional
compilation (`compile_repeated_blocks`, torch.compile of each WanTransformerBlock), on a second instance sharing the
same weights (on CPU: diffusers' native SDPA, and `--compile-backend eager` makes a quick smoke run). Every row counts
its own matmuls as dispatched in an eager call (diffusers recomputes the prompt's cross-attention K/V in every forward;
ours holds them in the session) and attention by the same formula.

Random bf16 weights (said so).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import replace

import torch
import torch.distributed as dist

from telefuser.models.flags import SIZES
from telefuser.distributed.ulysses.selection import TRANSPORTS
from telefuser.models.lingbot_world_v2.config import LingBotWorldV2Config
from telefuser.models.registry import get_spec
from telefuser.ops.attention import CUDA_SDPA_PRIORITY
from telefuser.ops.fusion import set_fusion
from telefuser.profiling.flop_rates import (
    NO_ATTENTION_IMPLS,
    attention_flops,
    counted_flops,
    describe,
    dispatched_attention_flops,
    flop_counter,
    rate,
)
from telefuser.runtime import Runtime
from tools.bench.transport_ab import TransportSwitch, agree_on_arguments, default_transports, parse_transports, rotated

MODEL = get_spec("lingbot_world_v2")
LATENT_FRAMES_PER_CHUNK = 4
DENOISING_TIMESTEPS = (1000.0, 750.0, 500.0, 250.0)  # four reads of the window; the commit runs at t=0


def parse_resolution(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--resolution must look like 832x480, got {text!r}") from None
    if width % 16 or height % 16 or width <= 0 or height <= 0:
        raise SystemExit(f"--resolution {text}: width and height must be positive multiples of 16")
    return width, height


class Runner:
    """Device, dtype, optional Ulysses mesh and a synchronized stopwatch."""

    def __init__(self, args):
        self.on_gpu = args.device == "cuda"
        if self.on_gpu and not torch.cuda.is_available():
            raise SystemExit("--device cuda asked for, but no CUDA GPU is visible; use --device cpu --config tiny")
        runtime = Runtime.launch(ulysses_degree=args.ulysses, device=args.device)
        if runtime.mesh is not None:
            agree_on_arguments(args)
        self.runtime = runtime
        self.mesh, self.device, self.dtype, self.rank = runtime.mesh, runtime.device, runtime.dtype, runtime.rank
        self.world = runtime.world_size

    def sync(self):
        if self.on_gpu:
            torch.cuda.synchronize()

    def timed(self, fn):
        if self.mesh is not None:
            dist.barrier()
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - start

    def say(self, text: str):
        if self.rank == 0:
            print(text, flush=True)

    def close(self):
        if self.mesh is not None:
            dist.destroy_process_group()


def dit_config(args) -> LingBotWorldV2Config:
    config = LingBotWorldV2Config() if args.config == "official" else LingBotWorldV2Config.tiny_session()
    return replace(config, num_layers=args.layers) if args.layers else config


def chunk_inputs(config, runner, width, height, frames, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    grid_h, grid_w = height // 8, width // 8  # VAE stride 8; the patch (1, 2, 2) halves it again
    latents = torch.randn(1, config.in_dim, frames, grid_h, grid_w, generator=g).to(runner.device)
    tokens = frames * (grid_h // 2) * (grid_w // 2)
    camera = (torch.randn(1, tokens, config.camera_feature_dim, generator=g) * 0.1).to(runner.device)
    text = torch.randn(1, config.text_len, config.text_dim, generator=g).to(runner.device, runner.dtype)
    return latents, camera, text, (grid_h // 2) * (grid_w // 2)


def forward_attention_flops(config, new_rows: int, key_rows: int, world: int, layers: int, attn_impl: str) -> int:
    """One forward over `layers` blocks on this rank, by formula: self-attention of the chunk's rows over the window
    (this rank's heads after the Ulysses scatter, the padding rows dropped), cross-attention of this rank's rows
    (padding included) over the text_len prompt rows with every head."""
    if attn_impl in NO_ATTENTION_IMPLS:
        return 0
    local_rows = -(-new_rows // world)
    per_layer = attention_flops(1, config.num_heads // world, new_rows, key_rows, config.head_dim) + attention_flops(
        1, config.num_heads, local_rows, config.text_len, config.head_dim
    )
    return per_layer * layers


def chunk_attention_flops(config, plan, world: int, attn_impl: str) -> int:
    """A chunk's 4 reads (every block) and its commit (`commit_chunk`: the last block stops after its K/V)."""
    full = forward_attention_flops(config, plan.new_rows, plan.total, world, config.num_layers, attn_impl)
    commit = forward_attention_flops(config, plan.new_rows, plan.total, world, config.num_layers - 1, attn_impl)
    return len(DENOISING_TIMESTEPS) * full + commit


def run_session(model, runner, args, width, height, *, count_flops: bool):
    """Per chunk: seconds and (if counted) FLOPs, over args.chunks chunks of one fresh session."""
    config = model.config
    latents, camera, text, tokens_per_frame = chunk_inputs(config, runner, width, height, LATENT_FRAMES_PER_CHUNK, 1)
    session = model.new_window(1, text, tokens_per_frame=tokens_per_frame, device=runner.device)
    world = session.ulysses_degree
    rows = []
    try:
        for _ in range(args.chunks):
            counter = flop_counter() if count_flops else nullcontext()
            plan = session.plan(LATENT_FRAMES_PER_CHUNK)  # the window this chunk attends to (read-only)

            def chunk():  # the pipeline's DiT work for one chunk
                modulation = model.camera_modulation(camera)
                for t in DENOISING_TIMESTEPS:
                    model.forward_chunk(session, latents, torch.full((1,), t), modulation, update_cache=False)
                model.commit_chunk(session, latents, torch.zeros(1), modulation)

            with counter:
                _, seconds = runner.timed(chunk)
            row = {"seconds": seconds}
            if count_flops:
                row.update(
                    counted=counted_flops(counter),
                    attention_dispatched=dispatched_attention_flops(counter),
                    attention_formula=chunk_attention_flops(config, plan, world, model.attn_impl),
                )
                row["flops"] = row["counted"] + row["attention_formula"]
            rows.append(row)
    finally:
        session.close()
    return rows


def replace_chunks(args, chunks: int):
    copy = argparse.Namespace(**vars(args))
    copy.chunks = chunks
    return copy


def steady_rows(sessions: list[list[dict]]) -> list[dict]:
    """The steady chunks of every timed session (chunk 0 excluded, unless it is the only one)."""
    return [row for rows in sessions for row in (rows[1:] or rows)]


def steady_figures(sessions: list[list[dict]]) -> tuple[float, float, float]:
    """(p50 s/chunk, max s/chunk, DiT FPS) over the steady chunks of all `sessions`."""
    seconds = sorted(row["seconds"] for row in steady_rows(sessions))
    frames_per_chunk = 4 * LATENT_FRAMES_PER_CHUNK  # 16 video frames per 4-latent chunk after chunk 0
    return statistics.median(seconds), seconds[-1], frames_per_chunk * len(seconds) / sum(seconds)


def session_mode(args, runner) -> dict:
    width, height = parse_resolution(args.resolution)
    config = dit_config(args)
    t0 = time.perf_counter()
    model = MODEL.loader("random")(
        config, 0, runner.device, runner.dtype, attn_impl=args.attn_impl, init_on_device=runner.on_gpu
    ).eval()
    init_s = time.perf_counter() - t0
    transports = args.transports
    # collective: one communicator per transport, in order
    switch = TransportSwitch(model, MODEL, runner.runtime, transports)
    variants = ["fused", "eager"] if args.fusion == "both" else [args.fusion]
    rounds = args.iters if len(transports) > 1 else 1  # one transport: one timed session, as always
    sessions = {(name, variant): [] for name in transports for variant in variants}
    with torch.inference_mode():
        switch.use(transports[0])
        set_fusion(False)  # count in eager mode: the dispatch mode and compiled kernels do not mix
        counted = run_session(model, runner, args, width, height, count_flops=True)  # also the eager warm-up
        for name in transports:
            switch.use(name)
            for variant in variants:
                set_fusion(variant == "fused")
                if variant == "fused" or name != transports[0]:  # compile; set the communicator up
                    run_session(model, runner, replace_chunks(args, 2), width, height, count_flops=False)
        if runner.on_gpu:
            torch.cuda.reset_peak_memory_stats()
        for index in range(rounds):
            for name in rotated(transports, index):  # whole sessions alternate: the same clocks and neighbours
                switch.use(name)  # the session is made under this transport's communicator
                for variant in variants:
                    set_fusion(variant == "fused")
                    sessions[name, variant].append(run_session(model, runner, args, width, height, count_flops=False))
    first = transports[0]
    transport = switch.runs_on(first)
    by_transport = {}
    for name in transports:
        p50, worst, fps = steady_figures(sessions[name, variants[0]])
        by_transport[name] = {
            "runs_on": switch.runs_on(name),
            "fallback_reasons": switch.fallback_reasons(name),
            "sessions": rounds,
            "steady_dit_seconds_p50": p50,
            "steady_dit_seconds_max": worst,
            "steady_dit_fps": fps,
            "steady_dit_seconds_p50_by_fusion": {v: steady_figures(sessions[name, v])[0] for v in variants},
            "steady_dit_fps_by_fusion": {v: steady_figures(sessions[name, v])[2] for v in variants},
        }
    for row in by_transport.values():
        row["ratio_to_first"] = row["steady_dit_seconds_p50"] / by_transport[first]["steady_dit_seconds_p50"]
    switch.close()
    timed = sessions[first, variants[0]]
    device_name = torch.cuda.get_device_name() if runner.on_gpu else "cpu"
    chunks = []
    for index, c in enumerate(counted):
        seconds = statistics.median(rows[index]["seconds"] for rows in timed)  # the one session's, with one round
        chunks.append(
            {
                "index": index,
                "dit_seconds": seconds,
                "tflop_this_rank": c["flops"] / 1e12,
                "tflop_counted": c["counted"] / 1e12,
                "attention_tflop_formula": c["attention_formula"] / 1e12,
                "attention_tflop_dispatched": c["attention_dispatched"] / 1e12,
                **rate(c["flops"], seconds, device_name),
            }
        )
    steady_counted = counted[1:] or counted
    steady = rate(
        sum(c["flops"] for c in steady_counted) * len(timed),
        sum(row["seconds"] for row in steady_rows(timed)),
        device_name,
    )
    p50, worst, fps = steady_figures(timed)
    result = {
        "mode": "session",
        "config": args.config,
        "layers": config.num_layers,
        "resolution": f"{width}x{height}",
        "device": device_name,
        "world": runner.world,
        "ulysses_transport": transport,
        "weights": "random (no checkpoint)",
        "weight_init_s": init_s,
        "attn_impl": args.attn_impl,
        "chunks": chunks,
        "steady_dit_seconds_p50": p50,
        "steady_dit_seconds_max": worst,
        "steady_dit_fps": fps,
        "steady_achieved_tflops": steady["achieved_tflops"],
        "steady_of_measured_matmul_ceiling": steady["of_measured_matmul_ceiling"],
        "steady_of_datasheet_bf16_dense": steady["of_datasheet_bf16_dense"],
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if runner.on_gpu else None,
        "fusion": variants[0],
        "steady_dit_seconds_p50_by_fusion": by_transport[first]["steady_dit_seconds_p50_by_fusion"],
        "transports": transports,
        "timed_rounds": rounds,
        "by_transport": by_transport,
    }
    runner.say(
        "chunk | DiT s (4 reads + commit) | TFLOP (this rank) | of which attention | TFLOP/s | of measured 786 "
        "| of datasheet 989"
    )
    for c in chunks:
        runner.say(
            f"{c['index']:5d} | {c['dit_seconds']:24.3f} | {c['tflop_this_rank']:17.3f} | "
            f"{c['attention_tflop_formula']:18.3f} | {c['achieved_tflops']:7.1f} | "
            f"{fraction(c['of_measured_matmul_ceiling']):>15s} | {fraction(c['of_datasheet_bf16_dense']):>16s}"
        )
    runner.say(
        f"LingBot-World v2 DiT ({args.config}, {config.num_layers} layers, random weights) {width}x{height}: "
        f"steady DiT p50 {result['steady_dit_seconds_p50']:.3f} s/chunk -> {result['steady_dit_fps']:.2f} FPS "
        f"(DiT only), {describe(steady)}, Ulysses transport: {transport}, fusion: {variants[0]}"
    )
    if len(variants) > 1:
        runner.say(
            "fusion side by side (steady DiT p50 s/chunk): "
            + ", ".join(f"{v} {t:.3f}" for v, t in result["steady_dit_seconds_p50_by_fusion"].items())
        )
    if len(transports) > 1:
        runner.say(transport_table(result, args, variants))
    return result


def fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def transport_table(result: dict, args, variants: list[str]) -> str:
    first = result["transports"][0]
    lines = [
        f"LingBot-World v2 Ulysses{result['world']}: steady DiT per chunk ({result['config']}, {result['layers']} "
        f"layers, {result['resolution']}, {result['timed_rounds']} sessions of {args.chunks} chunks "
        "per transport)",
        "transport | runs on  | " + " | ".join(f"p50 s/chunk ({v}) | FPS ({v})" for v in variants) + f" | vs {first}",
    ]
    for name, row in result["by_transport"].items():
        cells = " | ".join(
            f"{row['steady_dit_seconds_p50_by_fusion'][v]:{len(f'p50 s/chunk ({v})')}.3f} | "
            f"{row['steady_dit_fps_by_fusion'][v]:{len(f'FPS ({v})')}.2f}"
            for v in variants
        )
        lines.append(f"{name:9s} | {row['runs_on']:8s} | {cells} | {row['ratio_to_first']:.2f}x")
    return "\n".join(lines)


def print_top_kernels(title: str, fn, rows: int = 14) -> None:
    """One profiled call: the GPU kernels that took the most time, summed by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print(f"--- {title}: top GPU kernels of one call")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70))


def build_diffusers_wan(config: LingBotWorldV2Config, device, dtype):
    try:
        from diffusers import WanTransformer3DModel
    except ImportError:
        raise SystemExit("vs-diffusers needs diffusers (pip install diffusers)") from None
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise straight in bf16: no fp32 copy of a 14B model
    try:
        with torch.device(device):
            model = WanTransformer3DModel(
                patch_size=config.patch_size,
                num_attention_heads=config.num_heads,
                attention_head_dim=config.head_dim,
                in_channels=config.in_dim,
                out_channels=config.out_dim,
                text_dim=config.text_dim,
                freq_dim=config.freq_dim,
                ffn_dim=config.ffn_dim,
                num_layers=config.num_layers,
                cross_attn_norm=True,
                qk_norm="rms_norm_across_heads",
                eps=config.eps,
                image_dim=None,
            )
    finally:
        torch.set_default_dtype(previous)
    # as from_pretrained(torch_dtype=bf16) leaves it: the modules diffusers keeps in fp32 go back to fp32
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, module in model.named_modules():
        if keep.intersection(name.split(".")):
            module.float()
    return model.eval()


def sharing_copy(model):
    """A second instance of `model` whose parameters and buffers are the same tensors (no second copy of the weights),
    to be compiled and given another attention backend while `model` stays as it is."""
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def diffusers_best(plain, runner, compile_backend: str):
    """diffusers at its best settings: its own cuDNN attention backend (on CUDA; its native SDPA on CPU) and
    regional compilation of the repeated blocks. Returns (label, model)."""
    best = sharing_copy(plain)
    backend, attention = ("_native_cudnn", "cuDNN attention") if runner.on_gpu else ("native", "native SDPA")
    best.set_attention_backend(backend)
    # set_attention_backend also sets diffusers' process-wide default: pin the plain model to torch's default order
    plain.set_attention_backend("native")
    best.compile_repeated_blocks(backend=compile_backend)
    compiled = "compile_repeated_blocks" + ("" if compile_backend == "inductor" else f" ({compile_backend} backend)")
    return f"diffusers best ({attention}, {compiled})", best


def dense_attention_flops(config, tokens: int, attn_impl: str = "sdpa") -> int:
    """One forward with an empty window (queries = keys = the chunk's tokens), and the text_len prompt rows."""
    return forward_attention_flops(config, tokens, tokens, 1, config.num_layers, attn_impl)


def vs_diffusers_mode(args, runner) -> dict:
    if runner.world > 1:
        raise SystemExit("vs-diffusers runs on one device; start it without torchrun")
    width, height = parse_resolution(args.resolution)
    device_name = torch.cuda.get_device_name() if runner.on_gpu else "cpu"
    # a window as long as the longest chunk, no sink: an empty session attends within the chunk, so queries = keys
    base = replace(dit_config(args), local_attn_size=max(args.frames), sink_size=0)
    results, best_errors = [], {}
    diffusers_model = build_diffusers_wan(base, runner.device, runner.dtype)
    best_label, best_model = diffusers_best(diffusers_model, runner, args.compile_backend)
    ours = MODEL.loader("random")(
        base, 0, runner.device, runner.dtype, attn_impl=args.attn_impl, init_on_device=runner.on_gpu
    ).eval()
    ours_fp8 = None
    if args.with_fp8:  # the same seed: the same weights as `ours`, then quantized
        ours_fp8 = MODEL.loader("random")(
            base, 0, runner.device, runner.dtype, attn_impl="cudnn_fp8", init_on_device=runner.on_gpu
        ).eval()
        ours_fp8.quantize("fp8")
    fp8_label = "telefuser FP8 (GEMMs + cuDNN FP8 attention)"
    fp8_quality = {}
    set_fusion(True)
    for frames in args.frames:
        config = base
        latents, _, text, tokens_per_frame = chunk_inputs(config, runner, width, height, frames, 2)
        t = torch.full((1,), 500.0)
        session = ours.new_window(1, text, tokens_per_frame=tokens_per_frame, device=runner.device)
        cudnn_first = lambda: torch.nn.attention.sdpa_kernel(CUDA_SDPA_PRIORITY, set_priority=True)  # noqa: E731

        def ours_eager_chains():
            set_fusion(False)
            try:
                return ours.forward_chunk(session, latents, t, None, update_cache=False)
            finally:
                set_fusion(True)

        def run_diffusers(model):
            return model(
                hidden_states=latents.to(runner.dtype),
                timestep=t.to(runner.device),
                encoder_hidden_states=text,
                return_dict=False,
            )

        # name -> (call, eager twin that does the same arithmetic: whose FLOPs are counted, attention impl)
        variants = {
            "telefuser (cuDNN SDPA first)": (
                lambda: ours.forward_chunk(session, latents, t, None, update_cache=False),
                ours_eager_chains,
                args.attn_impl,
            ),
            "telefuser, eager elementwise chains": (ours_eager_chains, ours_eager_chains, args.attn_impl),
            "diffusers (torch default SDPA order)": (
                lambda: run_diffusers(diffusers_model),
                lambda: run_diffusers(diffusers_model),
                "sdpa",
            ),
        }
        if runner.on_gpu:

            def diffusers_cudnn():
                with cudnn_first():
                    return run_diffusers(diffusers_model)

            variants["diffusers (cuDNN SDPA first)"] = (diffusers_cudnn, diffusers_cudnn, "sdpa")
        variants[best_label] = (lambda: run_diffusers(best_model), lambda: run_diffusers(diffusers_model), "sdpa")
        tokens = frames * tokens_per_frame
        with torch.inference_mode():
            try:
                variants[best_label][0]()  # warm-up and compilation: a failure is reported, the other rows still run
            except Exception as exc:  # noqa: BLE001 - any compile or backend error: named in the output and JSON
                best_errors[frames] = f"{type(exc).__name__}: {exc}"
                runner.say(f"{best_label} failed at {frames} latent frames and is left out: {best_errors[frames]}")
                del variants[best_label]
            measured = {name: {"seconds": [], "peak_gib": None} for name in variants}
            for name, (fn, eager_twin, attn_impl) in variants.items():
                fn()  # warm-up (and compilation)
                set_fusion(False)  # count in eager mode: the dispatch mode and compiled kernels do not mix
                with flop_counter() as counter:
                    eager_twin()
                set_fusion(True)
                measured[name].update(
                    counted=counted_flops(counter),
                    attention_dispatched=dispatched_attention_flops(counter),
                    attention_formula=dense_attention_flops(config, tokens, attn_impl),
                )
                if runner.on_gpu:
                    base_mem = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    fn()
                    measured[name]["peak_gib"] = (torch.cuda.max_memory_allocated() - base_mem) / 2**30
            for _ in range(args.iters):
                for name, (fn, _, _) in variants.items():
                    measured[name]["seconds"].append(runner.timed(fn)[1])
            if args.profile and runner.on_gpu:
                for name, (fn, _, _) in variants.items():
                    print_top_kernels(f"{name}, {frames} latent frames", fn)
            if ours_fp8 is not None:  # the FP8 row's reference, before its session goes
                reference = ours.forward_chunk(session, latents, t, None, update_cache=False).float().flatten()
        session.close()
        if ours_fp8 is not None:  # after the bf16 session is gone: two full windows at 32,760 tokens do not fit
            if runner.on_gpu:
                torch.cuda.empty_cache()
            fp8_session = ours_fp8.new_window(1, text, tokens_per_frame=tokens_per_frame, device=runner.device)
            with torch.inference_mode():
                run_fp8 = lambda: ours_fp8.forward_chunk(fp8_session, latents, t, None, update_cache=False)  # noqa: E731
                out = run_fp8().float().flatten()  # also the warm-up
                fp8_quality[frames] = {
                    "cosine": torch.nn.functional.cosine_similarity(out, reference, dim=0).item(),
                    "relative_l2": ((out - reference).norm() / reference.norm()).item(),
                }
                runner.say(f"{fp8_label} against telefuser bf16, {frames} latent frames: {fp8_quality[frames]}")
                telefuser_row = next(n for n in measured if n.startswith("telefuser ("))
                # FLOPs counted as the bf16 twin's (the same work, in FP8); timed after the other rows, same process
                measured[fp8_label] = {**measured[telefuser_row], "peak_gib": None}
                measured[fp8_label]["seconds"] = [runner.timed(run_fp8)[1] for _ in range(args.iters)]
            fp8_session.close()
        for name, m in measured.items():
            seconds = statistics.median(m["seconds"])
            flops = m["counted"] + m["attention_formula"]
            results.append(
                {
                    "implementation": name,
                    "latent_frames": frames,
                    "query_tokens": tokens,
                    "key_tokens": tokens,
                    "seconds": seconds,
                    "seconds_all": m["seconds"],
                    "tflop": flops / 1e12,
                    "tflop_counted": m["counted"] / 1e12,
                    "attention_tflop_formula": m["attention_formula"] / 1e12,
                    "attention_tflop_dispatched": m["attention_dispatched"] / 1e12,
                    **rate(flops, seconds, device_name),
                    "activation_peak_gib": m["peak_gib"],
                }
            )
    ours.close()
    if ours_fp8 is not None:
        ours_fp8.close()
    width = max(len(row["implementation"]) for row in results)
    runner.say(
        f"tokens (Q = K) | {'implementation':{width}s} | s/forward |  TFLOP | TFLOP/s | of measured 786 | "
        "of datasheet 989 | vs telefuser"
    )
    for row in results:
        ref = next(
            r
            for r in results
            if r["latent_frames"] == row["latent_frames"] and r["implementation"].startswith("telefuser (")
        )
        runner.say(
            f"{row['query_tokens']:14d} | {row['implementation']:{width}s} | {row['seconds']:9.3f} | "
            f"{row['tflop']:6.2f} | {row['achieved_tflops']:7.1f} | "
            f"{fraction(row['of_measured_matmul_ceiling']):>15s} | "
            f"{fraction(row['of_datasheet_bf16_dense']):>16s} | {row['seconds'] / ref['seconds']:.2f}x"
        )
    return {
        "mode": "vs-diffusers",
        "config": args.config,
        "layers": base.num_layers,
        "resolution": f"{width}x{height}",
        "device": device_name,
        "weights": "random (no checkpoint)",
        "diffusers_best": best_label,
        "diffusers_best_errors": {str(k): v for k, v in best_errors.items()},
        "fp8_vs_telefuser_bf16": {str(k): v for k, v in fp8_quality.items()},
        "rows": results,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["session", "vs-diffusers"])
    p.add_argument("--config", choices=SIZES, default="official")
    p.add_argument("--layers", type=int, default=None, help="override num_layers (fit several ranks on one GPU)")
    p.add_argument("--resolution", default="832x480", help="WIDTHxHEIGHT in pixels, multiples of 16")
    p.add_argument(
        "--chunks", type=int, default=8, help="session: chunks of 4 latent frames (the window rolls from the 5th)"
    )
    p.add_argument("--frames", type=int, nargs="+", default=[21, 4], help="vs-diffusers: latent frames per forward")
    p.add_argument(
        "--fusion",
        choices=["fused", "eager", "both"],
        default="fused",
        help="session: elementwise chains as compiled CUDA kernels or eager ops; 'both' times each",
    )
    p.add_argument("--profile", action="store_true", help="vs-diffusers: print each one's top GPU kernels")
    p.add_argument(
        "--with-fp8",
        action="store_true",
        help="vs-diffusers: one more row, ours with FP8 GEMMs and cuDNN FP8 attention (nvidia-cudnn-frontend), "
        "and its output's cosine and relative L2 against ours in bf16",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="vs-diffusers: torch.compile backend of diffusers' compile_repeated_blocks (eager: CPU smoke)",
    )
    p.add_argument("--ulysses", type=int, default=1)
    p.add_argument(
        "--transports",
        type=parse_transports,
        default=None,
        help=f"session: comma-separated Ulysses transports to time side by side ({', '.join(TRANSPORTS)}); "
        "default: the communicator's default ($TELEFUSER_ULYSSES_TRANSPORT, else auto)",
    )
    # the model's --attn-impl, plus the attention-free one that times everything else
    MODEL.flag("attn_impl").add_to(p, choices=(*MODEL.attention_impls, *NO_ATTENTION_IMPLS))
    p.add_argument(
        "--iters",
        type=int,
        default=3,
        help="vs-diffusers: timed forwards each; session with several transports: timed rounds",
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--output", default=None, help="JSON file for the result")
    args = p.parse_args(argv)
    if args.transports is None:
        args.transports = default_transports()
    if args.chunks < 1 or args.iters < 1:
        raise SystemExit("--chunks and --iters must be at least 1")
    if len(args.transports) > 1 and (args.mode != "session" or args.ulysses < 2):
        p.error(
            "--transports with several transports compares Ulysses transports: session mode with --ulysses 2 "
            "or more under torchrun"
        )
    if len(args.transports) > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        raise SystemExit("--transports with several transports needs Ulysses ranks: start it with torchrun")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    runner = Runner(args)
    try:
        result = session_mode(args, runner) if args.mode == "session" else vs_diffusers_mode(args, runner)
        if runner.rank == 0 and args.output:
            with open(args.output, "w") as f:
                json.dump(result, f, indent=2)
    finally:
        runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
