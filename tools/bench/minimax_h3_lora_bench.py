"""LoRA merge, unmerge and switch times on the MiniMax H3 DiT (models/minimax_h3/lora.py), bf16 or FP8.

    python -m tools.bench.minimax_h3_lora_bench --device cuda                      # official DiT, bf16, rank 64
    python -m tools.bench.minimax_h3_lora_bench --device cuda --quantization fp8   # FP8: re-quantized from dense
    python -m tools.bench.minimax_h3_lora_bench --write-lora /tmp/a.safetensors     # only write a LoRA file
    python -m tools.bench.minimax_h3_lora_bench --config tiny --device cpu --rank 4 # smoke

Random weights and random LoRA factors (said so): the time of a merge depends on the shapes, not the numbers. The
LoRA files are written in ai-toolkit's format (``diffusion_model.<name>.lora_A/B.weight``, bf16) at `--rank` over
`--targets` of every joint block (default: the attention and MLP linears, what published H3 Turbo LoRAs train), and
read back through diffusers' converter like any user file. Timed (the device synchronized around each):
``read`` (the file through diffusers into this model's layout), ``first merge`` (reversible: it also copies every
touched weight's original to host memory, once per process, which a service may do at start-up with
`lora.keep_originals`), ``unmerge`` (copies back from host), ``merge`` (reversible, originals kept: what a service
switching LoRAs pays), ``switch`` (`apply` from LoRA A to LoRA B: unmerge + merge), ``merge once`` (not reversible:
what ``run_t2va.py --lora`` does at load). Unmerging is checked
bit for bit against host copies of two blocks' weights taken before the first merge.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from telefuser.models.flags import SIZES
from telefuser.models.minimax_h3.checkpoint import build_random_minimax_h3_dit
from telefuser.models.minimax_h3.config import MiniMaxH3Config
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.models.minimax_h3.dit import MiniMaxH3DiT
from telefuser.models.minimax_h3.lora import BLOCK_LINEARS, apply, merge, read_lora, unmerge

DEFAULT_TARGETS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")


def config_for(name: str) -> MiniMaxH3Config:
    return MiniMaxH3Config.tiny() if name == "tiny" else MiniMaxH3Config()


def target_shapes(config: MiniMaxH3Config, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """(out, in) of each targeted linear of every joint block, read off the model built on the meta device."""
    with torch.device("meta"):
        model = MiniMaxH3DiT(config)
    return {
        f"blocks.{i}.{suffix}": tuple(model.get_submodule(f"blocks.{i}.{suffix}").weight.shape)
        for i in range(len(model.blocks))
        for suffix in targets
    }


def write_lora(path: Path, shapes: dict[str, tuple[int, int]], rank: int, seed: int, device: str) -> int:
    """An ai-toolkit LoRA file over `shapes`; the update B @ A is about 0.01x a N(0, 1/in) weight. Returns its bytes."""
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, (rows, columns) in shapes.items():
        down = torch.randn(rank, columns, generator=g, device=device) / columns**0.5
        up = torch.randn(rows, rank, generator=g, device=device) * (0.01 / rank**0.5)
        tensors[f"diffusion_model.{name}.lora_A.weight"] = down.to(torch.bfloat16).cpu()
        tensors[f"diffusion_model.{name}.lora_B.weight"] = up.to(torch.bfloat16).cpu()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path.stat().st_size


def build_dit(config: MiniMaxH3Config, device: str, quantization: str) -> MiniMaxH3DiT:
    """The DiT in bf16 with random weights; FP8 quantizes each block as it is drawn, keeping its dense linears in
    host memory first (what a LoRA merge re-quantizes from), as the pipeline's loader does."""
    from telefuser.pipelines.minimax_h3.loading import Where

    finish = Where(keep_dense=quantization == "fp8").finish_block(quantization)
    return build_random_minimax_h3_dit(
        config,
        0,
        device,
        torch.bfloat16,
        init_on_device=torch.device(device).type == "cuda",
        after_block=finish,
    )


def timed(device: str, work) -> float:
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    work()
    sync()
    return time.perf_counter() - start


def snapshot(model: MiniMaxH3DiT, blocks: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Host copies of every tensor of `blocks` (FP8 codes and scales included)."""
    prefixes = tuple(f"blocks.{i}." for i in blocks)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k.startswith(prefixes)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=SIZES, default="official", help="DiT sizes (default official)")
    p.add_argument("--device", default="cuda", help="where the DiT lives (default cuda)")
    MINIMAX_H3.add_flags(p, only=("quantization",))  # declared once, in the model's spec
    p.add_argument("--rank", type=int, default=64, help="LoRA rank (default 64)")
    p.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"linears of every joint block the LoRA trains, from {', '.join(BLOCK_LINEARS)} (default: %(default)s)",
    )
    p.add_argument("--lora-dir", type=Path, default=Path("/tmp/telefuser-lora-bench"), help="where the files go")
    p.add_argument("--write-lora", type=Path, default=None, help="only write one LoRA file here, then exit")
    p.add_argument("--output", type=Path, default=None, help="a JSON file for the numbers")
    args = p.parse_args(argv)
    args.targets = tuple(t for t in args.targets.split(",") if t)
    unknown = [t for t in args.targets if t not in BLOCK_LINEARS]
    if unknown:
        p.error(f"unknown --targets {unknown}; choose from {', '.join(BLOCK_LINEARS)}")
    if args.rank < 1:
        p.error("--rank must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    config = config_for(args.config)
    shapes = target_shapes(config, args.targets)
    draw_on = args.device if torch.device(args.device).type == "cuda" else "cpu"
    if args.write_lora is not None:
        size = write_lora(args.write_lora, shapes, args.rank, 1, draw_on)
        print(f"wrote {args.write_lora}: rank {args.rank}, {len(shapes)} linears, {size / 2**20:.0f} MiB")
        return 0

    files = [args.lora_dir / f"lora_{name}_r{args.rank}.safetensors" for name in ("a", "b")]
    for seed, path in enumerate(files, 1):
        write_lora(path, shapes, args.rank, seed, draw_on)
    print(f"LoRAs: rank {args.rank} over {', '.join(args.targets)} of {len(config_blocks(shapes))} blocks, random")

    start = time.perf_counter()
    model = build_dit(config, args.device, args.quantization)
    built_s = time.perf_counter() - start
    print(
        f"DiT: {args.config}, bf16{', fp8 GEMMs' if args.quantization == 'fp8' else ''}, random weights "
        f"(built in {built_s:.1f} s)"
    )
    checked = (0, len(model.blocks) - 1)
    before = snapshot(model, checked)

    loras = {}
    rows = {}
    rows["read (one file)"] = timed(args.device, lambda: loras.update(a=read_lora(files[0])))
    loras["b"] = read_lora(files[1])
    rows["first merge (reversible, originals to host)"] = timed(
        args.device, lambda: merge(model, [(loras["a"], 1.0)], reversible=True)
    )
    rows["unmerge"] = timed(args.device, lambda: unmerge(model))
    exact = all(torch.equal(v, before[k]) for k, v in snapshot(model, checked).items())
    rows["merge (reversible, originals kept)"] = timed(args.device, lambda: merge(model, [(loras["a"], 1.0)]))
    rows["switch A -> B (apply)"] = timed(args.device, lambda: apply(model, [(loras["b"], 1.0)]))
    unmerge(model)
    exact = exact and all(torch.equal(v, before[k]) for k, v in snapshot(model, checked).items())
    rows["merge once (not reversible)"] = timed(
        args.device, lambda: merge(model, [(loras["a"], 1.0)], reversible=False)
    )

    peak = torch.cuda.max_memory_reserved() / 2**30 if torch.device(args.device).type == "cuda" else None
    card = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else "cpu"
    print(f"\n{card}; peak {peak:.1f} GiB reserved" if peak is not None else "\ncpu")
    print("| step | s |\n| --- | ---: |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.3f} |")
    print(f"unmerge restored blocks {checked} bit for bit: {exact}")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "config": args.config,
            "quantization": args.quantization,
            "rank": args.rank,
            "targets": list(args.targets),
            "device": card,
            "peak_reserved_gib": peak,
            "seconds": rows,
            "unmerge_exact": exact,
        }
        args.output.write_text(json.dumps(record, indent=2))
    return 0 if exact else 1


def config_blocks(shapes: dict[str, tuple[int, int]]) -> set[str]:
    return {name.split(".")[1] for name in shapes}


if __name__ == "__main__":
    sys.exit(main())
