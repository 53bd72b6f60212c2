"""Progress and cancellation of a pipeline call, in the manner of diffusers' ``callback_on_step_end`` and
``interrupt``: the one `StepHooks` both pipelines take and the video service's `VideoRunner` contract passes on.

A pipeline calls ``progress(done, total)`` after each denoising step and asks ``cancelled()`` before each; a True
answer stops the call with `GenerationCancelled`. Under Ulysses/TP every rank must give the same answers (the video
service's follower replay shares rank 0's: serving/video/replay.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _ignore(done: int, total: int) -> None:
    return None


def _never() -> bool:
    return False


@dataclass(frozen=True)
class StepHooks:
    progress: Callable[[int, int], None] = _ignore  # (steps done, steps in the call)
    cancelled: Callable[[], bool] = _never


NO_HOOKS = StepHooks()


class GenerationCancelled(Exception):
    """The caller's ``cancelled()`` answered True before a denoising step (one DiT call); `steps_done` had run."""

    def __init__(self, steps_done: int):
        super().__init__(f"generation cancelled after {steps_done} DiT calls")
        self.steps_done = steps_done
