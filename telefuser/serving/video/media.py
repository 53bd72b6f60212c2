"""The images, videos and audio a request carries: told apart by their first bytes, checked at submission before
anything large is decoded, and decoded for the runner within bounds.

Only these formats are opened: PNG, JPEG and WebP images (Pillow, told which plugins it may use: no EPS, which runs
Ghostscript), MP4/MOV/M4A, WebM/MKV, WAV, FLAC, MP3 and OGG through PyAV with the demuxer named, so ffmpeg never
probes its way into another one (HLS, whose playlists open other files and URLs). Sizes are read from headers and
refused before pixels are decoded (a small file can declare a huge canvas). Every failure to read a client's bytes
is a `RequestError`: 413 past a byte limit, 422 otherwise (corrupt, unsupported, past a pixel limit).
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass

import numpy as np

from ..common.http_errors import RequestError

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}  # our container name -> Pillow's plugin
MAX_VIDEO_FPS = 240.0
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1_000, 384_000
SUPPORTED = "a PNG, JPEG or WebP image, an MP4/MOV, WebM/MKV or OGG video, or WAV, FLAC, MP3, OGG or M4A audio"


@dataclass(frozen=True)
class MediaLimits:
    """What one uploaded file may be (flags: PROTOCOL.md, "Keyframes, references and LoRAs")."""

    max_image_bytes: int = 10 << 20  # --max-image-mib
    max_image_pixels: int = 4096 * 4096  # --max-image-pixels: a 1:4 image at the references' 2048 short edge
    max_clip_bytes: int = 32 << 20  # --max-clip-mib: a video or audio reference
    max_video_pixels: int = 1920 * 1088  # per frame of a video reference: 1080p (its frames are held decoded)


def container_of(data: bytes) -> str | None:
    """The format the first bytes name, or None: png, jpeg, webp, mp4, matroska, wav, flac, mp3 or ogg."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def identify(data: bytes, what: str, limits: MediaLimits, *, images_only: bool = False) -> tuple[str, int, int]:
    """(kind, width, height) of an upload, checked: "image", "video" or "audio" (0 x 0 for audio)."""
    if not data:
        raise RequestError(422, f"{what} is empty")
    container = container_of(data)
    if container in IMAGE_FORMATS:
        _check_bytes(data, what, limits.max_image_bytes, "max_image_bytes", "--max-image-mib")
        width, height = image_size(data, what, limits)
        return "image", width, height
    if images_only:
        raise RequestError(422, f"{what} must be a PNG, JPEG or WebP image")
    if container is None:
        raise RequestError(422, f"{what} is not {SUPPORTED} (told by its first bytes)")
    _check_bytes(data, what, limits.max_clip_bytes, "max_clip_bytes", "--max-clip-mib")
    return _probe_clip(data, container, what, limits)


def image_size(data: bytes, what: str, limits: MediaLimits) -> tuple[int, int]:
    """The (width, height) of an image once upright, after checking its header and decoding it whole."""
    image = open_image(data, what, limits)
    return image.width, image.height


def open_image(data: bytes, what: str, limits: MediaLimits):
    """An RGB PIL image, EXIF-rotated upright (as diffusers' `load_image` reads a keyframe or a reference)."""
    from PIL import Image, ImageOps

    plugin = IMAGE_FORMATS.get(container_of(data) or "")
    if plugin is None:
        raise RequestError(422, f"{what} must be a PNG, JPEG or WebP image")
    try:
        with Image.open(io.BytesIO(data), formats=(plugin,)) as image:
            width, height = image.size
            if width < 1 or height < 1:
                raise RequestError(422, f"{what} is an empty image ({width}x{height})")
            if width * height > limits.max_image_pixels:
                raise RequestError(
                    422,
                    f"{what} is {width}x{height} = {width * height:,} pixels (read from its header); the limit is "
                    f"max_image_pixels={limits.max_image_pixels:,} (--max-image-pixels)",
                )
            image.load()
            return ImageOps.exif_transpose(image).convert("RGB")
    except RequestError:
        raise
    except Image.DecompressionBombError:  # Pillow's own check, for canvases far past ours, fires in open()
        raise RequestError(
            422,
            f"{what} declares a canvas far too large to decode; the limit is max_image_pixels="
            f"{limits.max_image_pixels:,} (--max-image-pixels)",
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever a decoder raises on a client's bytes is the client's mistake
        raise RequestError(422, f"{what} could not be decoded as a {plugin} image: {_reason(exc)}") from None


def decode_video(data: bytes, seconds: float, limits: MediaLimits) -> tuple[np.ndarray, float]:
    """uint8 (F, H, W, 3) frames of the first `seconds` (what the clip can use) and their rate; ValueError."""
    with _open_av(data) as container:
        stream = container.streams.video[0]
        fps = _rate(stream)
        wanted = math.ceil(seconds * fps) + 1
        frames = []
        for frame in container.decode(stream):
            if frame.width * frame.height > limits.max_video_pixels:
                raise ValueError(f"a frame is {frame.width}x{frame.height}, past max_video_pixels")
            if frames and frames[0].shape[:2] != (frame.height, frame.width):
                raise ValueError("the video changes its frame size")
            frames.append(frame.to_ndarray(format="rgb24"))
            if len(frames) >= wanted:
                break
    if not frames:
        raise ValueError("the video has no frames")
    return np.stack(frames), fps


def decode_audio(data: bytes, seconds: float, sample_rate: int) -> np.ndarray | None:
    """float32 (channels, samples) of the first `seconds` of the first audio stream at `sample_rate` (mono stays
    mono, more channels are mixed to stereo), resampled by ffmpeg; None when there is no audio stream."""
    import av

    with _open_av(data) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        layout = "mono" if stream.codec_context.channels == 1 else "stereo"
        resampler = av.AudioResampler(format="fltp", layout=layout, rate=sample_rate)
        wanted, chunks, have = math.ceil(seconds * sample_rate), [], 0
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray())
                have += chunks[-1].shape[1]
            if have >= wanted:
                break
        else:
            chunks += [out.to_ndarray() for out in resampler.resample(None)]
    if not chunks:
        raise ValueError("the audio has no samples")
    return np.concatenate(chunks, axis=1)[:, :wanted].astype(np.float32)


def _probe_clip(data: bytes, container: str, what: str, limits: MediaLimits) -> tuple[str, int, int]:
    """A video or audio file's kind and frame size, after its headers and first decoded frame."""
    try:
        with _open_av(data) as opened:
            if opened.streams.video:
                stream = opened.streams.video[0]
                width, height = stream.codec_context.width, stream.codec_context.height
                if width * height > limits.max_video_pixels:
                    raise RequestError(
                        422,
                        f"{what} is a {width}x{height} video; a video reference's frames may have at most "
                        f"{limits.max_video_pixels:,} pixels (1080p)",
                    )
                fps = _rate(stream)
                if not 0 < fps <= MAX_VIDEO_FPS:
                    raise RequestError(422, f"{what} is a video at {fps:g} fps; between 0 and {MAX_VIDEO_FPS:g}")
                frame = next(opened.decode(stream), None)
                if frame is None or width < 1 or height < 1:
                    raise RequestError(422, f"{what} is a video without a decodable frame")
                return "video", frame.width, frame.height
            if opened.streams.audio:
                stream = opened.streams.audio[0]
                rate = stream.codec_context.sample_rate or 0
                if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
                    raise RequestError(422, f"{what} is audio at {rate} Hz; {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz")
                if next(opened.decode(stream), None) is None:
                    raise RequestError(422, f"{what} is audio without a decodable frame")
                return "audio", 0, 0
    except RequestError:
        raise
    except Exception as exc:  # noqa: BLE001 - ffmpeg's errors on a client's bytes are the client's mistake
        raise RequestError(422, f"{what} could not be read as {container}: {_reason(exc)}") from None
    raise RequestError(422, f"{what} ({container}) holds no video or audio stream")


def _open_av(data: bytes):
    import av

    container = container_of(data)
    if container in (None, *IMAGE_FORMATS):
        raise ValueError(f"not a video or audio file ({container or 'unknown format'})")
    return av.open(io.BytesIO(data), format=container, mode="r")


def _rate(stream) -> float:
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else 0.0


def _check_bytes(data: bytes, what: str, limit: int, name: str, flag: str) -> None:
    if len(data) > limit:
        raise RequestError(413, f"{what} is {len(data):,} bytes; the limit is {name}={limit:,} ({flag})")


def _reason(exc: Exception) -> str:
    text = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>|: '<none>'", "", str(exc)).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
