"""Multi-rank video serving: rank 0 runs HTTP and the queue; the other ranks replay each job on their model shard.

This reuses followers.py unchanged: a `VideoRunner` is presented to it as a `SessionFactory` in which one job is one
session whose single "chunk" is the whole generation. `FollowingFactory` broadcasts create -> next_chunk -> close
(the `VideoSpec` travels as the session config), heartbeats while idle and stops the followers at shutdown;
`follow()` is the followers' loop.

Cancellation must be the same decision on every rank, or the ranks would leave the denoising loop at different steps
and the next collective would hang. So `hooks.cancelled()`, which the runner asks once before every DiT call on every
rank, is itself a broadcast: rank 0 sends its answer, the followers receive it (on the same gloo control group,
inside the create/next_chunk exchange, so the message order stays identical on all ranks).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from .followers import FollowingFactory, _broadcast, follow
from .video_runner import JobCancelled, RunHooks, RunOutcome, VideoPlan, VideoRunner, VideoSpec

log = logging.getLogger("telefuser.serving")


class _JobSession:
    total_chunks = 1

    def __init__(self, runner: VideoRunner, spec: VideoSpec, output: Path | None, hooks: RunHooks):
        self._runner, self._spec, self._output, self._hooks = runner, spec, output, hooks

    def next_chunk(self, keys: list[str]) -> RunOutcome | None:
        return self._runner.run(self._spec, self._output, self._hooks)

    def close(self) -> None:
        return None


class _FollowerSession(_JobSession):
    def next_chunk(self, keys: list[str]) -> RunOutcome | None:
        try:
            return super().next_chunk(keys)
        except JobCancelled as exc:  # rank 0 cancelled it: expected, not a follower error
            log.info("follower: job cancelled after %d step(s)", exc.step)
            return None


class _RunnerAsFactory:
    """The `SessionFactory` view of a runner. On rank 0 (`leader`), `bind()` hands it the output path and hooks of the
    job about to be created; followers get `output=None` and a `cancelled()` that receives rank 0's answer."""

    def __init__(self, runner: VideoRunner, group, *, leader: bool):
        self._runner, self._group, self._leader = runner, group, leader
        self._bound: tuple[Path | None, RunHooks] | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        return self._runner.metadata

    def bind(self, output: Path | None, hooks: RunHooks) -> None:
        self._bound = (output, hooks)

    def validate(self, image, prompt: str, config: dict[str, Any]) -> None:
        self._runner.plan(VideoSpec.from_dict(config["spec"]))

    def create(self, image, prompt: str, config: dict[str, Any]) -> _JobSession:
        spec = VideoSpec.from_dict(config["spec"])
        if not self._leader:
            return _FollowerSession(self._runner, spec, None, RunHooks(cancelled=self._receive_cancel))
        assert self._bound is not None, "FollowingRunner.run binds the job before creating it"
        (output, hooks), self._bound = self._bound, None
        shared = RunHooks(progress=hooks.progress, cancelled=lambda: self._send_cancel(hooks.cancelled()))
        return _JobSession(self._runner, spec, output, shared)

    def _send_cancel(self, flag: bool) -> bool:
        return bool(_broadcast(("cancel", bool(flag)), self._group)[1])

    def _receive_cancel(self) -> bool:
        message = _broadcast(None, self._group)
        if message[0] != "cancel":
            raise RuntimeError(f"follower: expected rank 0's cancel flag, got {message[0]!r}")
        return bool(message[1])


class FollowingRunner:
    """Rank 0's runner: every `run` is first broadcast to the followers, then run here; `shutdown()` stops them."""

    def __init__(self, runner: VideoRunner, group, *, heartbeat_s: float = 60.0):
        self._runner = runner
        self._adapter = _RunnerAsFactory(runner, group, leader=True)
        self._following = FollowingFactory(self._adapter, group, heartbeat_s=heartbeat_s)
        self._lock = threading.Lock()
        self.model, self.metadata = runner.model, runner.metadata
        if callable(getattr(runner, "memory_estimate", None)):  # arithmetic on rank 0 only: nothing is broadcast
            self.memory_estimate = runner.memory_estimate

    @property
    def pings(self) -> int:
        return self._following.pings

    def plan(self, spec: VideoSpec) -> VideoPlan:
        return self._runner.plan(spec)

    def run(self, spec: VideoSpec, output: Path | None, hooks: RunHooks) -> RunOutcome:
        with self._lock:
            self._adapter.bind(output, hooks)
            session = self._following.create(None, spec.prompt, {"spec": spec.as_dict()})
            try:
                return session.next_chunk([])
            finally:
                session.close()

    def close(self) -> None:
        self._runner.close()

    def shutdown(self) -> None:
        self._following.shutdown()


def follow_runner(runner: VideoRunner, group) -> int:
    """A follower rank's loop: replay rank 0's jobs on `runner` until rank 0 stops; returns the model calls run."""
    return follow(_RunnerAsFactory(runner, group, leader=False), group)
