"""A pool of long-lived ranks for multi-process tests.

Starting W processes that import torch costs seconds on a 2-core machine, so each world size gets one pool per test
session: W spawned workers with a gloo process group that run test functions on request. The parent hosts the
rendezvous TCPStore (the communicator's control exchanges run over it, and a TCPStore wait is event-driven where a
FileStore polls). A test
calls ``pool.run(fn, *args)``; every rank runs ``fn(ctx, *args)`` and the results come back indexed by rank. A rank
that raises fails the test with its traceback; a run that does not finish in time kills the pool (it is rebuilt for
the next test) and fails with a timeout error instead of hanging the suite.
"""

from __future__ import annotations

import os
import queue
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch.multiprocessing as mp


@dataclass
class RankContext:
    rank: int
    world_size: int

    @property
    def group(self):
        import torch.distributed as dist

        return dist.group.WORLD


class RankFailure(AssertionError):
    pass


def _worker(rank: int, world_size: int, store_port: int, device: str, tasks, results) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device == "cuda":  # ranks share GPU 0, or with TELEFUSER_TEST_GPU_PER_RANK=1 (multi-GPU hosts) get one each
        per_rank = os.environ.get("TELEFUSER_TEST_GPU_PER_RANK") == "1"
        torch.cuda.set_device(rank % torch.cuda.device_count() if per_rank else 0)
    store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    ctx = RankContext(rank, world_size)
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            results.put((rank, True, fn(ctx, *args, **kwargs)))
        except BaseException as exc:  # report everything, including assertion errors, to the parent
            results.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    dist.destroy_process_group()


class RankPool:
    def __init__(self, world_size: int, device: str = "cpu"):
        self.world_size = world_size
        self.device = device
        self._procs = []
        self._start()

    def _start(self) -> None:
        import torch.distributed as dist

        ctx = mp.get_context("spawn")
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, self.world_size, self._store.port, self.device, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def run(self, fn, *args, timeout: float = 180.0, **kwargs) -> list:
        """Run fn(ctx, *args, **kwargs) on every rank; return the per-rank results."""
        if not self.alive:
            self.close()
            self._start()
        for q in self._tasks:
            q.put((fn, args, kwargs))
        results: dict[int, tuple[bool, object]] = {}
        try:
            while len(results) < self.world_size:
                rank, ok, payload = self._results.get(timeout=timeout)
                results[rank] = (ok, payload)
        except queue.Empty:
            missing = sorted(set(range(self.world_size)) - set(results))
            self.close()
            raise RankFailure(
                f"{fn.__name__}: ranks {missing} did not finish within {timeout:.0f}s (hang); answers: {results}"
            ) from None
        failures = {r: msg for r, (ok, msg) in results.items() if not ok}
        if failures:
            self.close()  # peers of a failed rank may be stuck in a collective
            raise RankFailure("\n".join(f"--- rank {r} ---\n{m}" for r, m in sorted(failures.items())))
        return [results[r][1] for r in range(self.world_size)]

    def close(self) -> None:
        for q in getattr(self, "_tasks", []):
            try:
                q.put(None)
            except Exception:
                pass
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []
        self._store = None
