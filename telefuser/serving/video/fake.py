"""A model-free `VideoRunner`: sleeps per "denoising step", then writes a small valid MP4 with a stereo audio track.

It plans requests exactly as MiniMax H3 does (24 fps, 17n+5 frames, sizes in multiples of 32; `plan_shape`), so the
service's validation, queueing, progress, cancellation and persistence can be tested, and AIPerf runs in CI, without
weights. Pictures are a seeded gradient with a moving bar; audio is a 440/660 Hz tone at 32 kHz. It takes the
tasks of one MiniMax H3 partition (`partition`) and its presets; it ignores the media and LoRAs it is given but
records what arrived (`media_seen`: the sha256 of each input's bytes), so the replay tests can compare ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from telefuser.pipelines.hooks import StepHooks
from telefuser.pipelines.minimax_h3.shapes import plan_shape  # imported now, not on the first request

from .canvas import write_clip
from .contract import JobCancelled, RunOutcome, VideoShape, JobRequest, report_stage

FPS = 24
SAMPLE_RATE = 32_000
SIZE_MULTIPLE = 32


class FakeVideoRunner:
    def __init__(
        self,
        *,
        model: str = "MiniMax-H3",
        step_delay_s: float = 0.01,
        defaults: dict[str, Any] | None = None,
        run_log: Path | None = None,
        partition: str = "FL2VA",
        stands_in_for: str | None = None,
    ):
        """`model`: the served name (`telefuser serve --fake` makes it fake-MiniMax-H3); `stands_in_for`: the
        model's own name, which requests may also give (default MiniMax-H3)."""
        from telefuser.pipelines.minimax_h3.pipeline import PARTITION_TASKS

        from .minimax import preset_metadata

        self.model = model
        self.run_log = run_log  # one JSON line per run start and end: the replica tests check nothing ran twice
        self.step_delay_s = float(step_delay_s)
        self.defaults = {"size": "64x64", "seconds": 0.5, "steps": 4, "seed": 0, **(defaults or {})}
        self.metadata = {
            "model": model,
            "fake": True,
            "stands_in_for": stands_in_for or "MiniMax-H3",
            "runner": "fake (test pattern and tone, no weights)",
            "native_size": "1344x768",  # MiniMax H3's canvas, which the fake imitates
            "device": "cpu",
            "fps": FPS,
            "audio": True,
            "sample_rate": SAMPLE_RATE,
            "audio_channels": 2,
            "size_multiple": SIZE_MULTIPLE,
            "frame_grid": "17n+5 frames at 24 fps (requested seconds are snapped up)",
            "steps": "num_inference_steps = N sigma points -> N-1 DiT calls",
            "guidance": False,
            "defaults": dict(self.defaults),
            "partition": partition,
            "tasks": list(PARTITION_TASKS[partition]),
            "presets": preset_metadata(),
        }
        self.media_seen: list[list[str]] = []  # per run: sha256 of each input's bytes as this rank received them
        self.calls: list[dict[str, Any]] = []  # every run's job request, in order (the follower tests compare ranks)
        self.steps_run: list[int] = []  # denoising steps each run completed (a cancelled run stops early)
        self._lock = threading.Lock()

    def plan(self, job_request: JobRequest) -> VideoShape:
        shape = plan_shape(
            duration_s=job_request.seconds, resolution=job_request.resolution, aspect_ratio=job_request.aspect_ratio
        )
        if job_request.steps < 2:
            raise ValueError(f"steps must be >= 2, got {job_request.steps}")
        if job_request.task not in self.metadata["tasks"]:
            raise ValueError(
                f"this fake serves {self.metadata['partition']}, which does not run {job_request.task} jobs"
            )
        plan = VideoShape(shape.width, shape.height, shape.frame_count, FPS, shape.duration_s, job_request.steps - 1)
        return replace(plan, task=job_request.task)

    def memory_estimate(self, plan: VideoShape) -> dict[str, int]:
        """The rendered clip (frames and two index grids) and its tone."""
        pixels = plan.width * plan.height
        return {"frames": plan.frames * pixels * 3 + 2 * pixels * 8, "audio": int(plan.duration_s * SAMPLE_RATE) * 8}

    def run(self, job_request: JobRequest, output: Path | None, hooks: StepHooks) -> RunOutcome:
        plan = self.plan(job_request)
        with self._lock:
            self.calls.append(job_request.as_dict())
            self.media_seen.append([hashlib.sha256(blob).hexdigest() for blob in job_request.media_data()])
            self.steps_run.append(0)
        started = time.perf_counter()
        self._log_run("start", job_request)
        for step in range(plan.dit_calls):
            if hooks.cancelled():
                self._log_run("cancelled", job_request)
                raise JobCancelled(step)
            time.sleep(self.step_delay_s)
            self.steps_run[-1] = step + 1
            hooks.progress(step + 1, plan.dit_calls)
        frames, audio = render(plan, job_request.seed)
        inference_s = time.perf_counter() - started
        report_stage(hooks, "muxing")
        mux_s = (
            write_clip(output, frames, FPS, audio, SAMPLE_RATE, job_request.output_dims) if output is not None else 0.0
        )
        width, height = job_request.output_dims or (plan.width, plan.height)
        self._log_run("end", job_request)
        return RunOutcome(
            inference_time_s=inference_s,
            peak_memory_bytes=int(frames.nbytes + audio.nbytes),
            peak_memory_kind="fake (bytes of the rendered clip)",
            frames=plan.frames,
            fps=FPS,
            width=width,
            height=height,
            duration_s=plan.duration_s,
            audio_channels=2,
            audio_samples=int(audio.shape[1]),
            sample_rate=SAMPLE_RATE,
            dit_calls=plan.dit_calls,
            mux_s=mux_s,
            generated_size=plan.generated_size if job_request.output_dims else None,
            timings={"pipeline_s": inference_s, "dit_total_s": plan.dit_calls * self.step_delay_s},
        )

    def close(self) -> None:
        return None

    def _log_run(self, event: str, job_request: JobRequest) -> None:
        if self.run_log is None:
            return
        line = json.dumps({"event": event, "prompt": job_request.prompt, "pid": os.getpid(), "t": time.time()}) + "\n"
        with open(self.run_log, "a", encoding="utf-8") as log:  # one short append per line: whole lines, any order
            log.write(line)


def render(plan: VideoShape, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 [F, H, W, 3] frames and float32 [2, S] audio, deterministic in (plan, seed)."""
    h, w, n = plan.height, plan.width, plan.frames
    base = np.random.default_rng(seed).integers(0, 256, 3)
    ys, xs = np.mgrid[0:h, 0:w]
    frame0 = np.stack(
        [
            (xs * 255 // max(1, w - 1) + base[0]) % 256,
            (ys * 255 // max(1, h - 1) + base[1]) % 256,
            np.full_like(xs, base[2]),
        ],
        axis=-1,
    ).astype(np.uint8)
    frames = np.repeat(frame0[None], n, axis=0)
    bar = max(2, w // 16)
    for i in range(n):
        x = (i * 4) % max(1, w - bar)
        frames[i, :, x : x + bar] = 255
    t = np.arange(int(round(plan.duration_s * SAMPLE_RATE)), dtype=np.float32) / SAMPLE_RATE
    audio = 0.2 * np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)]).astype(np.float32)
    return frames, audio
