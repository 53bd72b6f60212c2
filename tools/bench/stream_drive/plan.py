"""The drive plan (`DrivePlan`): the AIPerf bench config's session options, prompts and start frames, with the
command line's overrides, so that this benchmark and the AIPerf one drive the same session."""

from __future__ import annotations

import argparse
import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.aiperf.telefuser_aiperf.runner import REPO_ROOT, bench_section, endpoint_extra, load_bench_config
from tools.aiperf.telefuser_aiperf.session import SessionOptions, split_options


class RunError(Exception):
    """The run could not be made (no service, bad plan); the message says what was waited for or what was wrong."""


@dataclass
class Prompt:
    text: str
    image_b64: str
    image_path: str


@dataclass
class DrivePlan:
    options: SessionOptions
    prompts: list[Prompt]
    source: dict[str, Any]

    def prompt(self, session_number: int) -> Prompt:
        """Sessions take the dataset's rows in turn (session numbers start at 1)."""
        return self.prompts[(session_number - 1) % len(self.prompts)]


def resolve(path: str | Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path


def load_plan(args: argparse.Namespace, chunk_frames: tuple[int, int] | None = None) -> DrivePlan:
    """The bench config's session options with the command line's overrides; RunError names what is wrong.
    `chunk_frames` (first, later) turns --chunks into a frame count once the service's metadata is known."""
    try:
        config = load_bench_config(resolve(args.bench_config))
    except (OSError, ValueError) as exc:
        raise RunError(f"cannot read the bench config {args.bench_config}: {exc}") from exc
    overrides = _overrides(args, chunk_frames)
    try:
        options = split_options(endpoint_extra(config), overrides, base_dir=REPO_ROOT)
    except (OSError, ValueError) as exc:
        raise RunError(f"bad session plan ({args.bench_config}, overrides {overrides}): {exc}") from exc
    if options.requested_frames is None:
        raise RunError("the plan must fix num_frames (a lossless check needs the frame count); use --num-frames")
    prompts = [_prompt(args, row) for row in _dataset_rows(args, config)]
    source = {"bench_config": str(args.bench_config), "overrides": overrides, "controls_steps": len(options.controls)}
    return DrivePlan(options=options, prompts=prompts, source=source)


def _overrides(args: argparse.Namespace, chunk_frames: tuple[int, int] | None) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if args.num_frames is not None:
        overrides["num_frames"] = args.num_frames
    elif args.chunks is not None and chunk_frames is not None:
        first, later = chunk_frames
        overrides["num_frames"] = first + (args.chunks - 1) * later
    for key in ("seed", "resolution", "codec"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.controls is not None:
        overrides["controls"] = str(resolve(args.controls)) if args.controls else None
    return overrides


def _dataset_rows(args: argparse.Namespace, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The dataset's rows, or one empty row when --prompt and --image say everything."""
    if args.prompt is not None and args.image is not None:
        return [{}]
    dataset = resolve((bench_section(config).get("dataset") or {}).get("path") or "")
    try:
        rows = [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise RunError(f"cannot read the dataset {dataset} of {args.bench_config}: {exc}") from exc
    if not rows:
        raise RunError(f"the dataset {dataset} has no rows")
    return rows


def _prompt(args: argparse.Namespace, row: dict[str, Any]) -> Prompt:
    text = args.prompt if args.prompt is not None else row.get("text")
    image = resolve(args.image if args.image is not None else row.get("image") or "")
    if not isinstance(text, str) or not text.strip():
        raise RunError(f"no prompt in the dataset row {row}; give --prompt")
    try:
        return Prompt(text, base64.b64encode(image.read_bytes()).decode("ascii"), str(image))
    except OSError as exc:
        raise RunError(f"cannot read the start frame {image}: {exc}") from exc
