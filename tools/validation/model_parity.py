"""Every registered model under sequence (and tensor) parallelism against its dense execution, on any number of ranks.

    torchrun --standalone --nproc-per-node=4 tools/validation/model_parity.py --device cuda --output DIR
    torchrun --standalone --nproc-per-node=4 tools/validation/model_parity.py --device cuda --config official --layers 4
    torchrun --standalone --nproc-per-node=2 tools/validation/model_parity.py --device cpu --transport host-shm

Cases (``--cases``, comma-separated; default: every case that fits the world size W) come from the model registry:
for each model ``<name>_u2`` and ``<name>_u4`` (Ulysses 2 and 4), and ``<name>_tp2_u2`` (TP2 x Ulysses2, 4 ranks)
where the model's plan takes tensor parallelism (`ModelSpec.tensor_parallel`). ``--cases`` lists them.

Ranks. A case that needs N ranks runs on R = W // N replicas at once, over ranks [0, R*N): replica r owns ranks
[r*N, (r+1)*N) with the layout of `telefuser.distributed.mesh` inside it (TP innermost), so on 4 ranks a U2 case
runs on {0, 1} and on {2, 3} together (a group without global rank 0 is checked too). Leftover ranks (W % N) only
join the collectives that build the groups and gather the results. One torchrun call therefore covers every case
that fits; the groups come from one `DeviceMesh` ("replica", "ulysses", "tp") that every rank builds collectively.

Each participating rank builds the model's DiT of --config (`ModelSpec.config_of`, --layers blocks when given) from
the same seed (CPU generator on CPU; on CUDA the device generator, which draws the same numbers on identical GPUs --
checked: every rank reports an exact checksum of its weights and the case fails if they differ) and runs it dense.
It then frees it, builds it again from the seed (same checksum required; one model in memory at a time, so
``--config official`` at full depth fits), applies the model spec's plan over the case's replica
(``Runtime.parallelize(model, spec, communicator_factory=partial(UlyssesCommunicator, transport=--transport))``),
runs it on the same random, non-zero inputs and compares every output.

The run is the spec's example forward (`ModelSpec.example_forward`) at the spec's shape for --config
(`ModelSpec.example_shape`), built on each model from the same seed: each model's spec says what is worth running
(a packed sequence whose padding crosses rank borders, a KV window that has rolled, a CFG batch at two timesteps).

Error measures, per output and per rank: max |parallel - dense|, mean |parallel - dense| and the relative error
max |parallel - dense| / max |dense|. A case reports the worst over outputs and ranks, and each output's worst.

Tolerance on the relative error (override with --max-rel-error):
  * fp32 on CPU: 1e-5, the conformance suite's Ulysses bound (tests/conformance/test_conformance_ranks.py). Ulysses
    moves exact copies of rows and heads, so only the summation order of GEMMs over fewer rows, attention over fewer
    heads and TP's all-reduced partial sums differ. A wrong head, row, shard, window row or RoPE position is O(1e-2)
    or more.
  * bf16 on CUDA: 2e-2. Every GEMM and attention output is rounded to bf16 (relative step 2^-8 = 3.9e-3) and the
    parallel run rounds at different points (other reduction orders, split-K choices per shape, TP partial sums
    rounded before the all-reduce), so differences of a few bf16 ulps compound over a few layers; a wrong mapping is
    still O(1). The mean absolute error is reported beside it.

A case passes when every participating rank finished without an error, the ranks' weights are identical, every
output has the dense shape and is finite, the relative error is within the bound, and, when --transport names a
transport (anything but "auto"), the communicator really ran on it (a silent fallback to another transport fails
the case, with the communicator's reason). "auto" resolves to portable (all_to_all over gloo) on CPU; "host-shm"
runs the copy-engine protocol over CPU shared memory; ce-ipc / ce-symm need CUDA and tf-kernel.

Output: a table on rank 0 and, with --output DIR, DIR/model_parity.json. Exit status 0 when every case passes and
1 otherwise, the same on every rank (the failure flag is all-reduced). Arguments are checked identically on every
rank before any collective, so a bad argument exits 2 everywhere at once.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from telefuser.distributed.agreement import gather_from_ranks
from telefuser.distributed.mesh import ParallelConfig, ParallelConfigError, ParallelMesh
from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses.selection import TRANSPORTS
from telefuser.models.flags import SIZES
from telefuser.models.registry import get_spec, names
from telefuser.ops.fusion import set_fusion
from telefuser.runtime import Runtime

MAX_REL_ERROR = {"cpu": 1e-5, "cuda": 2e-2}
TOLERANCE_WHY = {
    "cpu": "fp32: only reduction order differs (tests measure <= 9e-7); a wrong head/row/shard is O(1e-2)+",
    "cuda": "bf16: rounding at other points (step 3.9e-3) compounds over the layers; a wrong mapping is O(1)",
}
CPU_TRANSPORTS = ("auto", "portable", "host-shm")
CUDA_TRANSPORTS = ("auto", "portable", "ce-ipc", "ce-symm")
INPUT_SEED_OFFSET = 101  # the inputs' seed, apart from the weights'


@dataclass(frozen=True)
class Case:
    model: str  # a registry name
    ulysses: int
    tp: int = 1

    @property
    def name(self) -> str:
        return f"{self.model}_tp{self.tp}_u{self.ulysses}" if self.tp > 1 else f"{self.model}_u{self.ulysses}"

    @property
    def ranks(self) -> int:
        return self.ulysses * self.tp

    @property
    def layout(self) -> str:
        return f"TP{self.tp}xU{self.ulysses}" if self.tp > 1 else f"U{self.ulysses}"

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(ulysses_degree=self.ulysses, tp_degree=self.tp)


def registry_cases() -> dict[str, Case]:
    """Every registered model at Ulysses 2 and 4, and at TP2 x Ulysses2 where its plan takes TP."""
    cases = []
    for model in names():
        cases += [Case(model, 2), Case(model, 4)]
        if get_spec(model).tensor_parallel:
            cases.append(Case(model, 2, 2))
    return {case.name: case for case in cases}


CASES = registry_cases()


# -- the model, through its spec --------------------------------------------------------------------------------------
def model_config(model: str, args):
    return get_spec(model).config_of(args.config, layers=args.layers)


def build_model(model: str, config, args, device: torch.device, dtype: torch.dtype):
    spec = get_spec(model)
    return spec.build_random(config, seed=args.seed, device=device, dtype=dtype, init_on_device=device.type == "cuda")


def run_example(model: str, dit, args) -> list[tuple[str, torch.Tensor]]:
    """(output name, output) of the spec's example forward at --config's shape, on inputs from --seed."""
    spec = get_spec(model)
    with torch.no_grad():
        example = spec.example_forward(dit, seed=args.seed + INPUT_SEED_OFFSET, **spec.example_shape(args.config))
        outputs = example.run()
    return list(zip(example.output_names(len(outputs)), outputs, strict=True))


# -- one case on one rank ---------------------------------------------------------------------------------------------
def weights_checksum(model: torch.nn.Module) -> str:
    """Exact: integer sums of every tensor's bits, hashed. Equal on two ranks iff (in practice) the weights are."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    sums = [
        t.detach().contiguous().view(ints[t.element_size()]).sum(dtype=torch.int64)
        for _, t in sorted([*model.named_parameters(), *model.named_buffers()], key=lambda kv: kv[0])
    ]
    return hashlib.sha256(str(torch.stack(sums).tolist()).encode()).hexdigest()[:16]


def compare(dense, parallel) -> list[dict]:
    rows = []
    for (name, d), (_, p) in zip(dense, parallel, strict=True):
        row = {"name": name}
        if p.shape != d.shape:
            row["problem"] = f"shape {tuple(p.shape)} != dense {tuple(d.shape)}"
        else:
            d, p = d.float(), p.float()
            diff = (p - d).abs()
            ref = d.abs().max().item()
            row.update(
                max_abs=diff.max().item(),
                sum_abs=diff.sum(dtype=torch.float64).item(),
                numel=diff.numel(),
                max_ref=ref,
                relative=diff.max().item() / ref if ref > 0 else math.inf,
            )
            if not (torch.isfinite(d).all() and torch.isfinite(p).all()):
                row["problem"] = "non-finite values"
            elif ref == 0:
                row["problem"] = "the dense output is all zeros"
        rows.append(row)
    return rows


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_case(case: Case, runtime: Runtime, args) -> dict:
    """Dense, then parallel over `runtime`'s mesh (this rank's replica of the case)."""
    device, dtype = runtime.device, runtime.dtype
    result = {"rank": dist.get_rank(), "error": None}
    try:
        config = model_config(case.model, args)
        model = build_model(case.model, config, args, device, dtype)
        result["weights"] = weights_checksum(model)
        start = time.perf_counter()
        dense = run_example(case.model, model, args)
        sync(device)
        result["dense_s"] = time.perf_counter() - start
        # The parallel model is built again from the seed rather than copied: one model in memory at a time (the
        # official MiniMax H3 is 62 GB in bf16), and the checksum proves the second draw equals the first.
        del model
        free_memory(device)
        model = build_model(case.model, config, args, device, dtype)
        result["rebuilt_weights"] = weights_checksum(model)
        transport = partial(UlyssesCommunicator, transport=args.transport)
        runtime.parallelize(model, get_spec(case.model), communicator_factory=transport)
        if args.perturb:
            with torch.no_grad():
                for param in model.blocks[0].parameters():
                    param.mul_(1 + args.perturb)
        start = time.perf_counter()
        parallel = run_example(case.model, model, args)
        sync(device)
        result["parallel_s"] = time.perf_counter() - start
        result["transport"] = model.communicator.transport
        result["fallback_reasons"] = dict(model.communicator.fallback_reasons)
        model.close()
        del model
        result["outputs"] = compare(dense, parallel)
    except Exception as exc:  # reported with the case; peers stuck in a collective hit the group timeout
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    return result


def case_mesh(case: Case, device: torch.device) -> ParallelMesh | None:
    """This rank's mesh for the case (None outside every replica). Collective over the world."""
    world, rank, n = dist.get_world_size(), dist.get_rank(), case.ranks
    replicas = world // n
    grid = torch.arange(replicas * n).view(replicas, case.ulysses, case.tp)
    device_mesh = DeviceMesh(device.type, grid, mesh_dim_names=("replica", "ulysses", "tp"))
    if rank >= replicas * n:
        return None
    sub = device_mesh["ulysses", "tp"]
    return ParallelMesh(case.parallel, sub, rank % n, n, device)


# -- merging the ranks' results ---------------------------------------------------------------------------------------
def _merge(rows: list[dict]) -> dict:
    """Worst over rows (outputs x ranks): max abs, relative; mean abs over every element."""
    numel = sum(r["numel"] for r in rows)
    return {
        "max_abs": max(r["max_abs"] for r in rows),
        "mean_abs": sum(r["sum_abs"] for r in rows) / numel,
        "relative": max(r["relative"] for r in rows),
        "max_abs_dense": max(r["max_ref"] for r in rows),
    }


def summarize(case: Case, results: list[dict | None], args, bound: float) -> dict:
    ranks = [r for r in results if r is not None]
    n = case.ranks
    summary = {
        "case": case.name,
        "model": case.model,
        "title": get_spec(case.model).title,
        "layout": case.layout,
        "ulysses": case.ulysses,
        "tp": case.tp,
        "groups": [list(range(s, s + n)) for s in range(0, len(ranks), n)],
        "requested_transport": args.transport,
        "max_rel_error_bound": bound,
        "problems": [],
    }
    problems = summary["problems"]
    for r in ranks:
        if r["error"]:
            problems.append(f"rank {r['rank']}: {r['error']}")
    if problems:
        summary["tracebacks"] = {r["rank"]: r["traceback"] for r in ranks if r["error"]}
        summary["passed"] = False
        return summary
    transports = sorted({r["transport"] for r in ranks})
    summary["transport"] = transports[0] if len(transports) == 1 else "mixed: " + ", ".join(transports)
    summary["fallback_reasons"] = ranks[0]["fallback_reasons"]
    if args.transport != "auto" and transports != [args.transport]:
        problems.append(
            f"--transport {args.transport} asked for, ran on {summary['transport']} "
            f"({summary['fallback_reasons'] or 'no reason given'})"
        )
    if len({r["weights"] for r in ranks}) != 1:
        problems.append("the ranks drew different weights: " + ", ".join(f"{r['rank']}:{r['weights']}" for r in ranks))
    if any(r["rebuilt_weights"] != r["weights"] for r in ranks):
        problems.append("building the model again from the seed gave other weights (non-deterministic draw)")
    rows = [row for r in ranks for row in r["outputs"]]
    problems += sorted({f"{row['name']}: {row['problem']}" for row in rows if "problem" in row})
    numeric = [row for row in rows if "max_abs" in row]
    if len(numeric) == len(rows):
        summary.update(_merge(numeric))
        summary["outputs"] = {
            name: _merge([row for row in numeric if row["name"] == name])
            for name in dict.fromkeys(row["name"] for row in numeric)
        }
        if not summary["relative"] <= bound:
            problems.append(f"relative error {summary['relative']:.3g} > bound {bound:g}")
    summary["dense_s"] = max(r["dense_s"] for r in ranks)
    summary["parallel_s"] = max(r["parallel_s"] for r in ranks)
    summary["passed"] = not problems
    return summary


# -- the report -------------------------------------------------------------------------------------------------------
def _ranges(groups: list[list[int]]) -> str:
    return ", ".join(f"{g[0]}-{g[-1]}" for g in groups)


CASE_WIDTH = max(15, *(len(name) for name in CASES))


def table(report: dict) -> str:
    head = (
        f"{'case':<{CASE_WIDTH}} {'layout':<7} {'ranks':<12} {'transport':<10} {'max|err|':>9} {'mean|err|':>9} "
        f"{'rel err':>9} {'bound':>7}  result"
    )
    lines = [
        f"Model parity, parallel vs dense: world {report['world_size']}, {report['device_name']}, {report['dtype']}, "
        f"config {report['config']} ({report['layers']}), transport {report['transport']}, fusion {report['fusion']}",
        f"bound on max|parallel - dense| / max|dense|: {report['max_rel_error']:g} ({report['tolerance_why']})",
        head,
        "-" * len(head),
    ]
    for s in report["cases"]:
        if "relative" in s:
            numbers = f"{s['max_abs']:>9.2e} {s['mean_abs']:>9.2e} {s['relative']:>9.2e}"
        else:
            numbers = f"{'-':>9} {'-':>9} {'-':>9}"
        lines.append(
            f"{s['case']:<{CASE_WIDTH}} {s['layout']:<7} {_ranges(s['groups']):<12} {s.get('transport', '-'):<10} "
            f"{numbers} {s['max_rel_error_bound']:>7.0e}  {'PASS' if s['passed'] else 'FAIL'}"
        )
        outputs = s.get("outputs", {})
        for name, o in outputs.items() if len(outputs) > 1 else ():
            label = f"  {name}"  # under the case's numbers: past the case, layout, ranks and transport columns
            lines.append(f"{label:<{CASE_WIDTH + 32}} {o['max_abs']:>9.2e} {o['mean_abs']:>9.2e} {o['relative']:>9.2e}")
        for problem in s["problems"]:
            lines.append(f"  ! {problem}")
    lines.append(f"overall: {'PASS' if report['passed'] else 'FAIL'}")
    return "\n".join(lines)


# -- arguments, checked on every rank before any collective -----------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cases", default=None, help=f"comma-separated, of {', '.join(CASES)} (default: all that fit)")
    p.add_argument("--config", choices=SIZES, default="tiny", help="the DiT size (each model's spec defines it)")
    p.add_argument("--layers", type=int, default=None, help="override the block count (official width, few layers)")
    p.add_argument("--transport", choices=TRANSPORTS, default="auto")
    p.add_argument(
        "--fusion",
        choices=["fused", "eager"],
        default="fused",
        help="elementwise chains compiled on CUDA (the production path) or eager",
    )
    p.add_argument("--max-rel-error", type=float, default=None, help="override the bound (see the tolerances above)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--perturb",
        type=float,
        default=0.0,
        help="testing this tool: scale the parallel model's first block by 1 + PERTURB (>= 1e-2 for bf16, "
        "whose step near 1 is 3.9e-3); every case must then fail",
    )
    p.add_argument(
        "--timeout-s", type=float, default=300.0, help="process-group timeout: a stuck collective fails after it"
    )
    p.add_argument("--output", default=None, help="folder for model_parity.json")
    args = p.parse_args(argv)

    if "WORLD_SIZE" not in os.environ:
        p.error("launch with torchrun, e.g. torchrun --standalone --nproc-per-node=4 " + p.prog)
    world = int(os.environ["WORLD_SIZE"])
    if args.cases is None:
        cases = [c for c in CASES.values() if c.ranks <= world]
        if not cases:
            p.error(f"world size {world}: every case needs at least 2 ranks")
    else:
        names = [n.strip() for n in args.cases.split(",") if n.strip()]
        unknown = [n for n in names if n not in CASES]
        if unknown or not names:
            p.error(f"unknown case(s) {unknown if unknown else repr(args.cases)}; choose from {', '.join(CASES)}")
        cases = [CASES[n] for n in dict.fromkeys(names)]
        too_big = [f"{c.name} needs {c.ranks} ranks" for c in cases if c.ranks > world]
        if too_big:
            p.error(f"world size {world} is too small: {'; '.join(too_big)}")
    if args.layers is not None and args.layers < 1:
        p.error(f"--layers must be >= 1, got {args.layers}")
    if args.max_rel_error is not None and not args.max_rel_error > 0:
        p.error(f"--max-rel-error must be > 0, got {args.max_rel_error}")
    if not args.timeout_s > 0:
        p.error(f"--timeout-s must be > 0, got {args.timeout_s}")
    allowed = CUDA_TRANSPORTS if args.device == "cuda" else CPU_TRANSPORTS
    if args.transport not in allowed:
        p.error(f"--transport {args.transport} does not run on {args.device}; choose from {', '.join(allowed)}")
    if args.device == "cuda":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if not torch.cuda.is_available() or torch.cuda.device_count() < local_world:
            p.error(
                f"--device cuda needs one GPU per rank: {local_world} ranks on this host, "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} GPUs visible"
            )
    for case in cases:
        try:
            case.parallel.check_heads(get_spec(case.model).num_heads(model_config(case.model, args)))
        except ParallelConfigError as exc:
            p.error(f"{case.name}: {exc}")
    if args.output is not None:
        try:
            Path(args.output).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            p.error(f"--output {args.output}: {exc}")
    return args, cases


def main(argv=None) -> int:
    args, cases = parse_args(argv)
    on_gpu = args.device == "cuda"
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    set_fusion(args.fusion == "fused")
    dist.init_process_group("cpu:gloo,cuda:nccl" if on_gpu else "gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    bound = args.max_rel_error or MAX_REL_ERROR[device.type]

    summaries = []
    for case in cases:
        mesh = case_mesh(case, device)  # the case's replica: each case has a launch context of its own
        local = run_case(case, Runtime(mesh, device, dtype), args) if mesh is not None else None
        free_memory(device)
        summaries.append(summarize(case, gather_from_ranks(local, None), args, bound))
        if rank == 0:
            print(f"[model_parity] {case.name}: {'PASS' if summaries[-1]['passed'] else 'FAIL'}", flush=True)

    layers = {m: get_spec(m).num_layers(model_config(m, args)) for m in dict.fromkeys(c.model for c in cases)}
    report = {
        "tool": "tools/validation/model_parity.py",
        "world_size": world,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(device) if on_gpu else f"cpu ({os.cpu_count()} cores)",
        "backend": str(dist.get_backend()),
        "dtype": str(dtype).removeprefix("torch."),
        "config": args.config,
        "layers": ", ".join(f"{m} {n} layers" for m, n in layers.items()),
        "transport": args.transport,
        "fusion": args.fusion if on_gpu else "n/a (cpu)",
        "seed": args.seed,
        "perturb": args.perturb,
        "torch": torch.__version__,
        "max_rel_error": bound,
        "tolerance_why": TOLERANCE_WHY[device.type] if args.max_rel_error is None else "set by --max-rel-error",
        "cases": summaries,
        "passed": all(s["passed"] for s in summaries),
    }
    failed = not report["passed"]
    if rank == 0:
        print(table(report), flush=True)
        if args.output is not None:
            path = Path(args.output) / "model_parity.json"
            try:
                path.write_text(json.dumps(report, indent=2) + "\n")
                print(f"wrote {path}", flush=True)
            except OSError as exc:
                print(f"could not write {path}: {exc}", file=sys.stderr, flush=True)
                failed = True
    flag = torch.tensor([int(failed)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank exits with the same status
    dist.destroy_process_group()
    return int(flag.item())


if __name__ == "__main__":
    sys.exit(main())
