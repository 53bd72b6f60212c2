"""A job's keyframes and references, from the bytes the worker read back, as MiniMax H3's pipeline takes them.

Images become RGB PIL images (EXIF-rotated, as diffusers' `load_image` reads them); a video reference its frames at
their own rate (the pipeline resamples onto 24 fps) and its soundtrack; audio is decoded at 32 kHz by ffmpeg's
resampler (the pipeline would need torchaudio for another rate). Only the part of a video or audio the clip can use
is decoded (`seconds`). A file that fails here (it passed the checks at submission) fails the job with the reason.
"""

from __future__ import annotations

from typing import Any

import torch

from telefuser.pipelines.minimax_h3.conditions import AudioReference, ImageReference, VideoReference
from telefuser.pipelines.minimax_h3.shapes import AUDIO_SAMPLE_RATE

from ..common.http_errors import RequestError
from .contract import JobRequest
from .media import MediaLimits, decode_audio, decode_video, open_image


def pipeline_inputs(job_request: JobRequest, seconds: float, limits: MediaLimits) -> dict[str, Any]:
    """`first_frame`, `last_frame` and `references` keywords for `MiniMaxH3Pipeline.__call__`."""
    out: dict[str, Any] = {"references": []}
    for index, media in enumerate(job_request.media):
        what = media.role if media.role != "reference" else f"references[{len(out['references'])}]"
        if media.data is None:
            raise ValueError(f"{what}: the job's media were not loaded")
        try:
            if media.role != "reference":
                out[media.role] = open_image(media.data, what, limits)
            else:
                out["references"].append(_reference(media.kind, media.data, what, seconds, limits))
        except RequestError as exc:
            raise ValueError(exc.detail) from None
        except ValueError as exc:
            raise ValueError(f"{what} ({media.kind}) could not be decoded: {exc}") from None
    return out


def _reference(kind: str, data: bytes, what: str, seconds: float, limits: MediaLimits):
    if kind == "image":
        return ImageReference(open_image(data, what, limits))
    audio = decode_audio(data, seconds, AUDIO_SAMPLE_RATE)
    waveform = None if audio is None else torch.from_numpy(audio)
    if kind == "audio":
        if waveform is None:
            raise ValueError("no audio stream")
        return AudioReference(waveform, AUDIO_SAMPLE_RATE)
    frames, fps = decode_video(data, seconds, limits)
    return VideoReference(frames, fps, waveform, None if waveform is None else AUDIO_SAMPLE_RATE)
