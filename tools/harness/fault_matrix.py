"""The Ulysses fault matrix: faults confined to one rank (rows) on every transport (columns).

Every cell starts two fresh ranks (forked from a server that imported torch once), lets them agree on a first call,
then injects one fault on rank 1 and records what each rank saw: its result or its error, or its exit code and the
end of its stderr when it died (on a GPU the handshake watchdog ends a blocked rank). A cell holds when the outcome is
the one the communicator promises for that fault -- the same error everywhere, the same fallback everywhere, exact
data, or a clear timeout error on the waiting rank -- *and* it ended within its wall-time bound: the time from the
fault to the last rank's end, measured on the host's monotonic clock.

    rows     bad input at a new / at a repeated signature; a layout change on one rank; a transport or option
             mismatch; an out-of-memory at target allocation; a peer that raises before submitting; a peer killed
             mid-group; an exception in one rank's forward between groups; an agreed failure, then reset()
    columns  CPU: portable (gloo), host-shm.  GPU (processes sharing one GPU): portable (gloo, staged), ce-ipc.

`tools/validation/ulysses_fault_matrix.py` runs it and prints the table; tests/distributed/test_fault_matrix.py runs
the CPU columns in CI.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

FAULT_RANK = 1
WORLD = 2
TIMEOUT_ERRORS = {"UlyssesTimeoutError"}
WATCHDOG_EXIT = 75


# ---- what runs on each rank ----------------------------------------------------------------------------------------
@dataclass
class RankCtx:
    rank: int
    world: int
    device: str
    transport: str
    timeout_s: float
    results: object
    started: float | None = None

    def comm(self, **kwargs):
        from telefuser.distributed.ulysses import UlyssesCommunicator
        from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions

        options = kwargs.pop("options", None) or CopyEngineOptions(timeout_s=self.timeout_s)
        kwargs.setdefault("transport", self.transport)
        return UlyssesCommunicator(options=options, **kwargs)

    def inputs(self, seed, shape=None):
        import torch

        from tools.harness.ulysses_reference import rank_input

        shape = shape or (1, 4, 2 * self.world, 8)
        return [rank_input(seed, p, shape, torch.float32).to(self.device) for p in range(self.world)]

    def start(self) -> None:
        """The fault happens now: the cell's wall time is measured from here (sent at once: a rank may die)."""
        self.started = time.monotonic()
        self.results.put((self.rank, "start", self.started))

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()  # a rank blocked in a GPU handshake stays here until the watchdog ends it


def _exact(out, xs, rank) -> bool:
    import torch

    from tools.harness.ulysses_reference import expected_scatter

    return bool(torch.equal(out.cpu(), expected_scatter([x.cpu().contiguous() for x in xs], rank)))


def _group(comm, x):
    hv = comm.scatter_heads(x, tag="v", barrier=False)
    hk = comm.scatter_heads(x + 1, tag="k")
    return hv.wait(), hk.wait()


def cell_bad_input_new(ctx: RankCtx) -> dict:
    comm = ctx.comm()
    x = ctx.inputs(1)[ctx.rank]
    ctx.start()
    comm.scatter_heads(x.double() if ctx.rank == FAULT_RANK else x).wait()
    return {"backend": comm.transport}


def cell_bad_input_repeated(ctx: RankCtx) -> dict:
    comm = ctx.comm()
    x = ctx.inputs(2)[ctx.rank]
    comm.scatter_heads(x).wait()  # the signature is agreed; repeating it skips the exchange
    ctx.sync()
    ctx.start()
    comm.scatter_heads(x.double() if ctx.rank == FAULT_RANK else x).wait()
    ctx.sync()
    return {"backend": comm.transport}


def cell_layout_one_rank(ctx: RankCtx) -> dict:
    comm = ctx.comm()
    xs = ctx.inputs(3)
    first = _exact(comm.scatter_heads(xs[ctx.rank]).wait(), xs, ctx.rank)
    ctx.start()
    x = xs[ctx.rank]
    if ctx.rank == FAULT_RANK:  # the same values, heads strided within each row: the copy cannot read it as it lies
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    out = comm.scatter_heads(x).wait()
    return {"backend": comm.transport, "exact": first and _exact(out, xs, ctx.rank)}


def cell_transport_mismatch(ctx: RankCtx) -> dict:
    other = "portable" if ctx.transport != "portable" else ("host-shm" if ctx.device == "cpu" else "ce-ipc")
    os.environ["TELEFUSER_ULYSSES_TRANSPORT"] = other if ctx.rank == FAULT_RANK else ctx.transport
    comm = ctx.comm(transport=None)
    ctx.start()
    comm.scatter_heads(ctx.inputs(4)[ctx.rank]).wait()
    return {"backend": comm.transport}


def cell_option_mismatch(ctx: RankCtx) -> dict:
    from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions

    bits = 32 if ctx.rank == FAULT_RANK else 64
    comm = ctx.comm(options=CopyEngineOptions(timeout_s=ctx.timeout_s, flag_bits=bits))
    ctx.start()
    comm.scatter_heads(ctx.inputs(5)[ctx.rank]).wait()
    return {"backend": comm.transport}


def cell_oom_at_target(ctx: RankCtx) -> dict:
    import torch.distributed as dist

    from tools.harness.transport_cases import _LocalOutOfMemory, real_mapping

    def factory(channel, device):
        inner = real_mapping(ctx.transport, channel, dist.group.WORLD, device)
        return _LocalOutOfMemory(inner, fail_at=3) if ctx.rank == FAULT_RANK else inner  # 1 flags, 2 probe, 3 target

    comm = ctx.comm(mapping_factory=factory)
    xs = ctx.inputs(6)
    ctx.start()
    out = comm.scatter_heads(xs[ctx.rank], tag="v").wait()
    return {"backend": comm.transport, "exact": _exact(out, xs, ctx.rank), "reasons": dict(comm.fallback_reasons)}


def _fault_between_v_and_k(ctx: RankCtx, seed: int, fault: Callable[[], None]) -> dict:
    comm = ctx.comm()
    x = ctx.inputs(seed)[ctx.rank]
    _group(comm, x)
    ctx.sync()
    ctx.start()
    comm.scatter_heads(x, tag="v", barrier=False)
    if ctx.rank == FAULT_RANK:
        fault()
    comm.scatter_heads(x, tag="k").wait()
    ctx.sync()
    return {"backend": comm.transport}


def _raise() -> None:
    raise RuntimeError("injected: rank 1 raised before submitting its K")


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def cell_raise_before_submit(ctx: RankCtx) -> dict:
    return _fault_between_v_and_k(ctx, 7, _raise)


def cell_killed_mid_group(ctx: RankCtx) -> dict:
    return _fault_between_v_and_k(ctx, 8, _die)


def cell_forward_error(ctx: RankCtx) -> dict:
    comm = ctx.comm()
    x = ctx.inputs(9)[ctx.rank]
    _group(comm, x)
    ctx.sync()
    ctx.start()
    _group(comm, x)  # one more complete group on both ranks
    if ctx.rank == FAULT_RANK:
        raise RuntimeError("injected: rank 1's forward raised between groups")
    _group(comm, x)
    ctx.sync()
    return {"backend": comm.transport}


def cell_reset_after_failure(ctx: RankCtx) -> dict:
    import types

    import torch.distributed as dist

    from tools.harness import transport_cases as cases

    rank_ctx = types.SimpleNamespace(rank=ctx.rank, world_size=ctx.world, group=dist.group.WORLD)
    ctx.start()
    failed_on, _, did_reset, _, request2 = cases.case_reset_reopens_copy_engine(rank_ctx, ctx.transport, ctx.device)
    return {"backend": request2, "failed_on": failed_on, "reset": did_reset, "exact": True}


# ---- the matrix --------------------------------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    fault: str
    run: Callable[[RankCtx], dict]
    expect: str  # "same error" | "same fallback" | "exact" | "clear timeout" | "reset"
    error: str = ""  # the error type every rank raises ("same error"), or the faulting rank's own ("clear timeout")
    copy_engine_only: bool = False


ROWS = [
    Row(
        "bad_input_new", "rank 1 passes fp64 at a new signature", cell_bad_input_new, "same error", "UlyssesInputError"
    ),
    Row(
        "bad_input_repeated",
        "rank 1 passes fp64 at a repeated signature",
        cell_bad_input_repeated,
        "clear timeout",
        "UlyssesTimeoutError",
    ),
    Row("layout_one_rank", "rank 1 alone passes heads strided within rows", cell_layout_one_rank, "exact"),
    Row(
        "transport_mismatch",
        "TELEFUSER_ULYSSES_TRANSPORT differs on rank 1",
        cell_transport_mismatch,
        "same error",
        "UlyssesConfigError",
    ),
    Row(
        "option_mismatch",
        "CopyEngineOptions.flag_bits=32 on rank 1",
        cell_option_mismatch,
        "same error",
        "UlyssesConfigError",
    ),
    Row(
        "oom_at_target",
        "out of memory at rank 1's first target",
        cell_oom_at_target,
        "same fallback",
        copy_engine_only=True,
    ),
    Row(
        "raise_before_submit",
        "rank 1 raises after V, before K",
        cell_raise_before_submit,
        "clear timeout",
        "RuntimeError",
    ),
    Row("killed_mid_group", "rank 1 is killed after V, before K", cell_killed_mid_group, "clear timeout", "SIGKILL"),
    Row("forward_error", "rank 1's forward raises between groups", cell_forward_error, "clear timeout", "RuntimeError"),
    Row(
        "reset_after_failure",
        "agreed setup failure mid-group, then reset()",
        cell_reset_after_failure,
        "reset",
        copy_engine_only=True,
    ),
]
COLUMNS = {"cpu": ("portable", "host-shm"), "cuda": ("portable", "ce-ipc")}


def _child(rank, world, port, device, row_name, transport, timeout_s, results, log_path):
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 2)  # the parent reads a dead rank's last words (the watchdog's message) from here
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(0)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    ctx = RankCtx(rank, world, device, transport, timeout_s, results)
    row = next(r for r in ROWS if r.name == row_name)
    try:
        outcome = {"kind": "ok", **row.run(ctx)}
    except BaseException as exc:
        outcome = {"kind": "error", "types": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    outcome["end"] = time.monotonic()
    results.put((rank, "outcome", outcome))
    sys.stderr.flush()
    if outcome["kind"] == "error":
        time.sleep(
            timeout_s + 2
        )  # a rank that raised stays alive, as in a server: its peers must time out, not see it go
    os._exit(0)  # no teardown: a peer may be gone, and destroying the group could wait for it


@dataclass
class CellResult:
    row: Row
    transport: str
    outcomes: dict = field(default_factory=dict)
    wall_s: float | None = None
    bound_s: float = 0.0
    holds: bool = False
    summary: str = ""


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["torch", "torch.distributed", "tools.harness.fault_matrix", "telefuser.distributed.ulysses"]
    )
    return ctx


def run_cell(mp_ctx, row: Row, transport: str, device: str, timeout_s: float, bounds: dict) -> CellResult:
    import torch.distributed as dist

    result = CellResult(row, transport)
    if row.copy_engine_only and transport == "portable":
        result.holds, result.summary = True, "n/a (no copy-engine setup)"
        return result
    result.bound_s = bounds["timeout"] if row.expect == "clear timeout" else bounds["fast"]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = mp_ctx.SimpleQueue()  # a put is written at once: a rank may die right after it
    logs = tempfile.mkdtemp(prefix="fault-matrix-")
    procs = [
        mp_ctx.Process(
            target=_child,
            args=(r, WORLD, store.port, device, row.name, transport, timeout_s, results, f"{logs}/rank{r}.log"),
        )
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    starts: dict[int, float] = {}
    deadline = time.monotonic() + 60 + result.bound_s  # process start-up included; a hang is reported, never waited out
    while len(result.outcomes) < WORLD and time.monotonic() < deadline:
        while not results.empty():
            rank, what, payload = results.get()
            if what == "start":
                starts[rank] = payload
            else:
                result.outcomes[rank] = payload
        time.sleep(0.02)
        for r, p in enumerate(procs):
            if r not in result.outcomes and p.exitcode is not None and results.empty():
                time.sleep(0.1)  # let a last message through the queue
                if results.empty():
                    with open(f"{logs}/rank{r}.log", errors="replace") as f:
                        tail = f.read()[-1500:]
                    result.outcomes[r] = {"kind": "exit", "code": p.exitcode, "stderr": tail, "end": time.monotonic()}
    for r, p in enumerate(procs):
        if r not in result.outcomes:
            result.outcomes[r] = {"kind": "hang", "end": time.monotonic()}
        if p.is_alive():
            p.kill()
        p.join(timeout=5)
    if starts:
        result.wall_s = max(o["end"] for o in result.outcomes.values()) - min(starts.values())
    result.holds, result.summary = judge(row, transport, device, result.outcomes)
    if result.wall_s is None or result.wall_s > result.bound_s:
        result.holds = False
        result.summary += f"; wall {result.wall_s} s over the {result.bound_s:g} s bound"
    return result


def _is_error(outcome: dict, name: str) -> bool:
    return outcome["kind"] == "error" and name in outcome["types"]


def _clear_timeout(outcome: dict, device: str, transport: str) -> bool:
    if outcome["kind"] == "error":
        return bool(TIMEOUT_ERRORS & set(outcome["types"])) and "did not" in outcome["message"]
    watchdog = device == "cuda" and transport.startswith("ce-")
    return (
        watchdog
        and outcome["kind"] == "exit"
        and outcome["code"] == WATCHDOG_EXIT
        and "did not complete" in outcome["stderr"]
    )


def _short(outcome: dict) -> str:
    if outcome["kind"] == "error":
        return f"{outcome['types'][0]}: {outcome['message'][:90]}"
    if outcome["kind"] == "exit":
        return f"exit {outcome['code']}"
    return outcome["kind"] + (f" on {outcome.get('backend')}" if outcome.get("backend") else "")


def judge(row: Row, transport: str, device: str, outcomes: dict) -> tuple[bool, str]:
    ranks = [outcomes[r] for r in range(WORLD)]
    waiting = [o for r, o in enumerate(ranks) if r != FAULT_RANK]
    fault = ranks[FAULT_RANK]
    if row.expect == "same error":
        ok = all(_is_error(o, row.error) for o in ranks) and len({o["message"] for o in ranks}) == 1
        return ok, f"same {row.error} on every rank" if ok else "; ".join(_short(o) for o in ranks)
    if row.expect == "same fallback":
        ok = all(o["kind"] == "ok" and o["backend"] == "portable" and o["exact"] for o in ranks)
        ok = ok and len({repr(o["reasons"]) for o in ranks}) == 1
        return ok, "same fallback to portable, exact" if ok else "; ".join(_short(o) for o in ranks)
    if row.expect == "exact":
        ok = all(o["kind"] == "ok" and o["exact"] and o["backend"] == transport for o in ranks)
        return ok, f"exact on {transport} everywhere" if ok else "; ".join(_short(o) for o in ranks)
    if row.expect == "reset":
        ok = all(
            o["kind"] == "ok" and o["reset"] and o["failed_on"] == transport and o["backend"] == transport
            for o in ranks
        )
        return ok, f"request 2 on {transport} after reset()" if ok else "; ".join(_short(o) for o in ranks)
    own = (
        (fault["kind"] == "exit" and fault["code"] == -signal.SIGKILL)
        if row.error == "SIGKILL"
        else _is_error(fault, row.error)
    )
    ok = own and all(_clear_timeout(o, device, transport) for o in waiting)
    how = "watchdog exit 75" if device == "cuda" and transport.startswith("ce-") else "UlyssesTimeoutError"
    return ok, f"rank 1: {row.error}; rank 0: {how}" if ok else "; ".join(_short(o) for o in ranks)


def run_matrix(device: str, timeout_s: float, bounds: dict, rows=None, columns=None) -> list[CellResult]:
    mp_ctx = _context()
    chosen = [r for r in ROWS if rows is None or r.name in rows]
    return [run_cell(mp_ctx, row, t, device, timeout_s, bounds) for row in chosen for t in (columns or COLUMNS[device])]


def format_table(cells: list[CellResult], device: str, timeout_s: float) -> str:
    columns = list(dict.fromkeys(c.transport for c in cells))
    lines = [
        f"Ulysses fault matrix, device={device}, 2 ranks, timeout_s={timeout_s:g} (fault on rank 1)",
        "| fault | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join("---" for _ in columns) + " |",
    ]
    for row in dict.fromkeys(c.row.name for c in cells):
        row_cells = [c for c in cells if c.row.name == row]
        texts = []
        for c in row_cells:
            wall = f", {c.wall_s:.1f} s (bound {c.bound_s:g})" if c.wall_s is not None else ""
            texts.append(f"{'holds' if c.holds else 'FAILS'}: {c.summary}{wall}")
        lines.append(f"| {row_cells[0].row.fault} | " + " | ".join(texts) + " |")
    return "\n".join(lines)
