"""MP4 muxing with PyAV: H.264 (yuv420p) video plus AAC audio, and a probe to read the result back.

Frames are uint8 [F, H, W, 3] RGB; audio is float [C, S] in [-1, 1]. H.264 with yuv420p needs even width and
height, so odd sizes are refused rather than silently cropped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

AAC_FRAME = 1024  # samples per AAC frame; PyAV's encoder wants whole frames


def _h264_codec() -> str:
    import av

    for name in ("libx264", "h264", "libopenh264"):
        if name in av.codecs_available:
            try:
                av.codec.Codec(name, "w")
                return name
            except Exception:  # noqa: BLE001 - a decoder-only build raises here; try the next name
                continue
    raise RuntimeError("this PyAV build has no H.264 encoder (libx264 / openh264)")


def write_mp4(
    path: str | Path,
    frames: np.ndarray,
    fps: int = 24,
    audio: np.ndarray | None = None,
    sample_rate: int = 32_000,
    *,
    crf: int = 18,
) -> Path:
    """Write `frames` (and `audio`, if given) to `path`; returns the path."""
    import av

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got {frames.dtype} {frames.shape}")
    num_frames, height, width, _ = frames.shape
    if num_frames == 0 or height % 2 or width % 2:
        raise ValueError(f"need at least one frame with even height and width for yuv420p, got {frames.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        video = container.add_stream(_h264_codec(), rate=Fraction(int(fps), 1))
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        video.options = {"crf": str(crf)}
        audio_stream = None
        if audio is not None:
            audio = np.asarray(audio, dtype=np.float32)
            if audio.ndim != 2 or audio.shape[0] not in (1, 2):
                raise ValueError(f"audio must be float [channels (1 or 2), samples], got {audio.shape}")
            audio_stream = container.add_stream("aac", rate=int(sample_rate))
            audio_stream.layout = "stereo" if audio.shape[0] == 2 else "mono"
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        if audio_stream is not None:
            _encode_audio(container, audio_stream, audio, int(sample_rate))
    return path


def _encode_audio(container, stream, audio: np.ndarray, sample_rate: int) -> None:
    import av

    layout = "stereo" if audio.shape[0] == 2 else "mono"
    samples = np.clip(audio, -1.0, 1.0)
    for start in range(0, samples.shape[1], AAC_FRAME):
        chunk = np.ascontiguousarray(samples[:, start : start + AAC_FRAME])
        frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
        frame.sample_rate = sample_rate
        frame.pts = start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


@dataclass(frozen=True)
class MediaInfo:
    video_frames: int
    fps: float
    width: int
    height: int
    video_codec: str | None
    has_audio: bool
    audio_codec: str | None
    sample_rate: int | None
    channels: int | None
    audio_samples: int  # decoded samples per channel (AAC adds encoder priming, so a little over the input)
    duration_s: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def probe_media(path: str | Path) -> MediaInfo:
    """Decode the file fully and count what it holds (frames, audio samples), for tests and sanity checks."""
    import av

    with av.open(str(path)) as container:
        video = container.streams.video[0] if container.streams.video else None
        audio = container.streams.audio[0] if container.streams.audio else None
        frames = sum(1 for _ in container.decode(video=0)) if video is not None else 0
        width, height = (video.codec_context.width, video.codec_context.height) if video is not None else (0, 0)
        fps = float(video.average_rate) if video is not None and video.average_rate else 0.0
        duration = float(container.duration) / 1_000_000 if container.duration else None
    samples = 0
    if audio is not None:
        with av.open(str(path)) as container:
            samples = sum(frame.samples for frame in container.decode(audio=0))
    return MediaInfo(
        video_frames=frames,
        fps=fps,
        width=width,
        height=height,
        video_codec=video.codec_context.name if video is not None else None,
        has_audio=audio is not None,
        audio_codec=audio.codec_context.name if audio is not None else None,
        sample_rate=audio.codec_context.sample_rate if audio is not None else None,
        channels=audio.codec_context.channels if audio is not None else None,
        audio_samples=samples,
        duration_s=duration,
    )
