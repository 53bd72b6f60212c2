"""Post-run checks of a batch video benchmark (AIPerf `video_generation` against `telefuser serve`). No aiperf imports.

AIPerf's `--download-video-content` times the download and throws the bytes away, so completeness is checked here:
every job of the raw export is downloaded again from `GET /v1/videos/{id}/content` and opened with PyAV (the engine's
venv has it): it must hold video frames (as many as the job reports, when it reports them) and an audio stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .artifacts import parse_prometheus, sample_sum

VIDEO_TAGS = (
    "request_latency",
    "video_inference_time",
    "video_peak_memory",
    "request_throughput",
    "request_count",
    "completed_request_count",
    "request_error_rate",
    "benchmark_duration",
)


def jobs_from_raw(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per request: phase, job id, the final job object (the last JSON answer), the AIPerf error."""
    jobs = []
    for number, record in enumerate(records):
        answers = []
        for response in record.get("responses") or []:
            text = response.get("text")
            if isinstance(text, str):
                try:
                    body = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if isinstance(body, dict):
                    answers.append(body)
        job_id = next((a.get("id") for a in answers if a.get("id")), None)
        metadata = record.get("metadata") or {}
        jobs.append(
            {
                "request": number,
                "phase": metadata.get("benchmark_phase") or metadata.get("phase_kind"),
                "id": job_id,
                "final": answers[-1] if answers else None,
                "error": record.get("error"),
                "request_start_ns": metadata.get("request_start_ns"),
                "request_end_ns": metadata.get("request_end_ns"),
            }
        )
    return jobs


def probe_video(path: Path) -> dict[str, Any]:
    """Decode every video frame and read the audio stream header with PyAV."""
    import av

    info: dict[str, Any] = {"bytes": Path(path).stat().st_size}
    with av.open(str(path)) as container:
        video = next((s for s in container.streams if s.type == "video"), None)
        audio = next((s for s in container.streams if s.type == "audio"), None)
        info["video_stream"] = video is not None
        info["audio_stream"] = audio is not None
        if video is not None:
            info["width"], info["height"] = video.codec_context.width, video.codec_context.height
            info["codec"] = video.codec_context.name
            info["fps"] = float(video.average_rate) if video.average_rate else None
        if audio is not None:
            info["audio_codec"] = audio.codec_context.name
            info["audio_rate"] = audio.codec_context.sample_rate
            info["audio_channels"] = audio.codec_context.channels if hasattr(audio.codec_context, "channels") else None
        frames = 0
        if video is not None:
            for _ in container.decode(video=0):
                frames += 1
        info["frames"] = frames
    return info


def check_video(info: Mapping[str, Any], job: Mapping[str, Any] | None) -> list[str]:
    problems = []
    if not info.get("video_stream"):
        problems.append("no video stream")
    if not info.get("frames"):
        problems.append("no decodable video frame")
    if not info.get("audio_stream"):
        problems.append("no audio stream")
    expected = (job or {}).get("frames")
    if isinstance(expected, int) and info.get("frames") and info["frames"] != expected:
        problems.append(f"{info['frames']} frames decoded; the job reports {expected}")
    return problems


def video_service_deltas(before: Mapping, after: Mapping, prefix: str = "telefuser_video_") -> dict[str, float]:
    names = (
        "jobs_submitted_total",
        "jobs_completed_total",
        "jobs_failed_total",
        "jobs_cancelled_total",
        "jobs_rejected_total",
        "frames_generated_total",
        "inference_seconds_total",
    )
    return {n: sample_sum(after, prefix + n) - sample_sum(before, prefix + n) for n in names}


__all__ = ["VIDEO_TAGS", "check_video", "jobs_from_raw", "parse_prometheus", "probe_video", "video_service_deltas"]
