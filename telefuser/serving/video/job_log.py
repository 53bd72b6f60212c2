"""What the video worker logs about a job: one line when it starts (the request's shape, the queue wait) and one when
it ends (how, after how long, the seconds each stage took), and the clock of those stages.

    video job video_1f.. started (attempt 1, 0.02 s queued): t2va 64x64, 22 frames (0.92 s at 24 fps), 4 steps (3
        DiT calls), seed 0, prompt of 26 characters
    video job video_1f.. completed in 0.61 s (starting 0.00, denoising 0.03, decoding 0.01, muxing 0.55, publishing
        0.00 s; pipeline 0.05 s): t2va 64x64, ...
"""

from __future__ import annotations

import time
from typing import Any

from .contract import RUN_STAGES, RunOutcome
from .jobs import VideoJob


class StageClock:
    """The stage a running job is in and the seconds spent in each so far; stages only move forward
    (contract.RUN_STAGES), so a late report of an earlier stage changes nothing."""

    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self.current = RUN_STAGES[0]
        self._since = clock()
        self._started = self._since
        self.seconds: dict[str, float] = {}

    def enter(self, stage: str) -> bool:
        """Move to `stage`; False when the job is there or past it already."""
        if stage not in RUN_STAGES or RUN_STAGES.index(stage) <= RUN_STAGES.index(self.current):
            return False
        self._close()
        self.current = stage
        return True

    def stop(self) -> None:
        self._close()
        self.current = "stopped"

    def elapsed(self) -> float:
        return self._clock() - self._started

    def _close(self) -> None:
        if self.current in RUN_STAGES:
            now = self._clock()
            self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self._since
            self._since = now


def request_shape(job: VideoJob) -> str:
    """The job's request as the log tells it: task, canvas, frames, steps, seed, and what it carries."""
    plan, job_request = job.plan, job.job_request
    size = f"{plan['width']}x{plan['height']}"
    if plan.get("output_width"):
        size += f" -> {plan['output_width']}x{plan['output_height']}"
    parts = [
        f"{job_request.get('task', 't2va')} {size}",
        f"{plan['frames']} frames ({plan['duration_s']:.2f} s at {plan['fps']} fps)",
        f"{job_request['steps']} steps ({plan['dit_calls']} DiT calls)",
        f"seed {job_request['seed']}",
    ]
    if job_request.get("preset"):
        parts.append(f"preset {job_request['preset']}")
    if job_request.get("loras"):
        parts.append("loras " + ", ".join(f"{name}:{scale:g}" for name, scale in job_request["loras"]))
    if job_request.get("media"):
        kinds = [f"{m['role']} {m['kind']}" for m in job_request["media"]]
        parts.append(f"{len(kinds)} input(s): {', '.join(kinds)}")
    parts.append(f"prompt of {len(job.prompt)} characters")
    return ", ".join(parts)


def started_line(job: VideoJob, attempt: int) -> str:
    queued = f", {job.started_at - job.created_at:.2f} s queued" if job.started_at else ""
    return f"video job {job.id} started (attempt {attempt}{queued}): {request_shape(job)}"


def ended_line(
    job: VideoJob,
    status: str | None,
    stages: StageClock,
    *,
    outcome: RunOutcome | None = None,
    error: dict[str, Any] | None = None,
    stopped_at: int | None = None,
) -> str:
    """How the job ended (`status` None: its lease was taken back meanwhile), with its stage timings."""
    timings = ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in stages.seconds.items())
    timings = f"{timings} s" if timings else "no stage"
    if outcome is not None and outcome.timings:
        own = ", ".join(f"{k[:-2]} {v:.2f}" for k, v in outcome.timings.items() if k.endswith("_s") and _number(v))
        timings += f"; pipeline: {own} s" if own else ""
    took = f"{stages.elapsed():.2f} s"
    if status is None:
        how = f"ended after {took} without its lease (another attempt owns it now)"
    elif status == "failed" and error is not None:
        where = next(reversed(stages.seconds), "starting")
        how = f"failed ({error.get('code')}) after {took} in {where}: {error.get('message')}"
    elif status == "cancelled":
        calls = stopped_at if stopped_at is not None else job.plan["dit_calls"]
        how = f"cancelled after {took}, {calls} of {job.plan['dit_calls']} DiT calls done"
    else:
        how = f"{status} in {took}"
    return f"video job {job.id} {how} ({timings}): {request_shape(job)}"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
