"""Would the VAE work of a LingBot chunk, run beside the DiT of the next one, shorten a chunk on one GPU? Measured.

    python -m tools.bench.vae_overlap_bench                        # official sizes on the GPU, bf16
    python -m tools.bench.vae_overlap_bench --quantization fp8 --attn-impl cudnn_fp8
    python -m tools.bench.vae_overlap_bench --side decode          # the decode alone beside the DiT
    python -m tools.bench.vae_overlap_bench --config tiny --device cpu --resolution 64x48 --iters 1   # smoke run

One random-weight DiT (said so) reading a full KV window, as a steady chunk does, and the bf16 VAE as ``--vae-fast``
runs it. The side work (``--side``): ``decode`` (one chunk's decode), ``condition`` (the next chunk's condition
encode, the black frames after the image, never reusing a fixed point) or ``vae`` (both, the default: neither depends
on the DiT's next output, so both could leave the chunk's critical path). Per round, in a rotating order: the DiT
forward alone, the side work alone, and both at once on two streams. The table gives the medians and how much of the
side work the overlap hides: ``(dit + side - both) / side``. ``both`` runs the side work on a side stream of default
priority; ``both-dit-priority`` runs the DiT on a high-priority stream instead, so the side work only fills what the
DiT leaves (CUDA's lowest priority is the default one). Both compute on the same SMs, so expect a fraction, not all
of it; only a measured gain justifies restructuring the session.

``dit-graph`` replays the DiT forward captured once as a CUDA graph (its output checked against the eager forward's:
the same kernels on the same inputs, so they should agree exactly); a capture that fails is reported, not fatal.
``--host-profile N`` prints the N functions of the most host time in one DiT forward (cProfile).

``dit enqueue`` is how long the DiT forward takes to return on the host before the device finishes it: well under
the forward's device time means the GPU never waits for the CPU, and CUDA graphs could not shorten the forward.
On the CPU there are no streams: the smoke run measures the sequential sum and says so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from telefuser.models.flags import SIZES
from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from telefuser.runtime import Runtime

VARIANTS = ("dit", "side", "both", "both-dit-priority")
SIDES = ("vae", "decode", "condition")


def build(args, device, dtype):
    from dataclasses import replace

    from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit
    from telefuser.pipelines.wan.vae import WanVideoVAE
    from telefuser.pipelines.wan.vae_fusion import optimize_vae

    config = LingBotWorldV2Config() if args.config == "official" else LingBotWorldV2Config.tiny_session()
    config = replace(config, num_layers=args.layers) if args.layers else config
    dit = build_random_lingbot_dit(
        config, 0, device, dtype, attn_impl=args.attn_impl, init_on_device=device.type == "cuda"
    ).eval()
    dit.quantize(args.quantization)
    vae = WanVideoVAE.random(
        args.config, seed=0, device=device, dtype=torch.bfloat16 if device.type == "cuda" else dtype
    )
    if device.type == "cuda":
        optimize_vae(vae.model)
    width, height = (int(v) for v in args.resolution.lower().split("x"))
    grid = (height // 8, width // 8)
    tokens_per_frame = grid[0] * grid[1] // 4
    g = torch.Generator().manual_seed(0)
    text = torch.randn(1, min(64, config.text_len), config.text_dim, generator=g).to(device, dtype)
    frames = min(4, config.local_attn_size - config.sink_size)
    chunk = torch.randn(1, config.in_dim, frames, *grid, generator=g).to(device)
    camera = torch.randn(1, frames * tokens_per_frame, config.camera_feature_dim, generator=g).to(device, dtype)
    session = dit.new_window(1, text, tokens_per_frame=tokens_per_frame)
    fill = torch.randn(1, config.in_dim, 1, *grid, generator=g).to(device)
    with torch.inference_mode():
        for _ in range(config.local_attn_size - frames):  # a full window, as every steady chunk reads
            dit.commit_chunk(session, fill, torch.zeros(1, device=device), camera[:, :tokens_per_frame])
    modulation = dit.camera_modulation(camera)
    t = torch.full((1,), 500.0, device=device)
    decoder = vae.stream_decoder()
    latents = torch.randn(1, 16, frames, *grid, generator=g).to(device, torch.float32)
    image = torch.rand(3, height, width, generator=g).mul(2).sub(1)
    encoder = vae.stream_encoder(image, reuse_steady_state=False)  # keeps encoding: every round costs the same
    encoder.next(1)  # the image's own latent frame: later calls encode black frames, as a steady chunk does

    def run_dit():
        return dit.forward_chunk(session, chunk, t, modulation, update_cache=False)

    def run_side():
        if args.side in ("vae", "condition"):
            encoder.next(frames)
        if args.side in ("vae", "decode"):
            decoder.decode(latents)

    return run_dit, run_side


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def enqueue_seconds(fn, device) -> float:
    """Host seconds until `fn` returns, the device idle at the start (then waited for, outside the measurement)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return seconds


def graphed(fn, device):
    """`fn` captured once as a CUDA graph: (replay, a note with max |graph - eager| of the output), or (None, the
    error)."""
    try:
        capture_stream = torch.cuda.Stream(device)
        capture_stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(capture_stream):  # warm-up on the capture stream, as torch.cuda.graphs asks
            fn()
        torch.cuda.current_stream(device).wait_stream(capture_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn()
        graph.replay()
        eager = fn()
        torch.cuda.synchronize(device)
        return graph.replay, f"max |graph - eager| = {(captured.float() - eager.float()).abs().max().item():g}"
    except Exception as exc:  # noqa: BLE001 - whatever stops the capture is the finding
        return None, f"{type(exc).__name__}: {exc}"


def host_profile(fn, device, top: int) -> str:
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    fn()  # host time only: the device may still be working when this returns
    profiler.disable()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def concurrent(run_dit, run_side, device, *, dit_priority: bool):
    """The two at once: the side work on a side stream and the DiT on the current one, or (`dit_priority`) the DiT
    on a high-priority side stream and the side work on the current one. Each side stream starts after what the
    current stream queued, and the current stream waits for it."""
    if device.type != "cuda":
        return lambda: (run_side(), run_dit())
    _, highest = torch.cuda.Stream.priority_range()
    side = torch.cuda.Stream(device, priority=highest if dit_priority else 0)
    on_side, on_current = (run_dit, run_side) if dit_priority else (run_side, run_dit)

    def both():
        current = torch.cuda.current_stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            on_side()
        on_current()
        current.wait_stream(side)

    return both


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=SIZES, default="official")
    p.add_argument("--layers", type=int, default=None, help="override num_layers")
    p.add_argument("--resolution", default="832x480", help="WIDTHxHEIGHT, multiples of 16")
    LINGBOT_WORLD_V2.add_flags(p, only=("quantization", "attn_impl"))  # declared once, in the model's spec
    p.add_argument("--side", choices=SIDES, default="vae", help="the VAE work beside the DiT (default: vae, both)")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--host-profile", type=int, default=0, metavar="N", help="print the top N host functions")
    p.add_argument("--device", default=None)
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    width, height = (int(v) for v in args.resolution.lower().split("x"))
    if width % 16 or height % 16:
        p.error(f"--resolution must be multiples of 16, got {args.resolution}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from telefuser.ops.attention_registry import check_backend

    check_backend(args.attn_impl)
    runtime = Runtime.launch(device=args.device)
    device, dtype = runtime.device, runtime.dtype
    with torch.inference_mode():
        run_dit, run_side = build(args, device, dtype)
        calls = {
            "dit": run_dit,
            "side": run_side,
            "both": concurrent(run_dit, run_side, device, dit_priority=False),
            "both-dit-priority": concurrent(run_dit, run_side, device, dit_priority=True),
        }
        for call in calls.values():  # warm-up: compilation, cuDNN plans, the decoder's cache
            call()
        graph_note = "CPU: no CUDA graphs"
        if device.type == "cuda":
            replay, graph_note = graphed(run_dit, device)
            if replay is not None:
                calls["dit-graph"] = replay
        seconds = {name: [] for name in calls}
        enqueue = []
        names = list(calls)
        for r in range(args.iters):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                seconds[name].append(timed(calls[name], device))
            enqueue.append(enqueue_seconds(run_dit, device))
    median = {name: statistics.median(v) for name, v in seconds.items()}
    dit, side = median["dit"], median["side"]
    where = "CUDA streams" if device.type == "cuda" else "CPU: no streams, 'both' runs the two in sequence"
    print(
        f"\nLingBot-World v2 ({args.config}, {args.resolution}, {dtype}, {args.quantization}, {args.attn_impl}; "
        f"side work: {args.side}; {where})"
    )
    print("| run | s (median) | side work hidden |\n|---|---|---|")
    report = {}
    for name in names:
        hidden = (dit + side - median[name]) / side if name.startswith("both") else None
        report[name] = {"median_s": median[name], "seconds": seconds[name], "side_hidden": hidden}
        print(f"| {name} | {median[name]:.4f} | {'-' if hidden is None else f'{hidden:.0%}'} |")
    print(f"| dit + side, in sequence | {dit + side:.4f} | 0% |")
    report["dit_enqueue"] = {"median_s": statistics.median(enqueue), "seconds": enqueue}
    print(f"| dit enqueue (host, until the call returns) | {statistics.median(enqueue):.4f} | - |")
    print(f"CUDA graph of the DiT forward: {graph_note}")
    if args.host_profile:
        with torch.inference_mode():
            print(host_profile(run_dit, device, args.host_profile))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "runs": report, "dit_graph": graph_note}, indent=2
            )
            + "\n"
        )
    runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
