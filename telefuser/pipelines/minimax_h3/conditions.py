"""FL2VA keyframes and Ref2VA references for the MiniMax H3 pipeline.

A request is T2VA (text only), FL2VA (a first and/or a last keyframe; the FL2VA DiT) or Ref2VA (ordered image, video
and audio references; the Ref2VA DiT). Each step below follows one of diffusers' 0.42.1 MiniMax H3 blocks
(``diffusers/modular_pipelines/minimax_h3/``), named in its docstring:

```
ConditionRequest.of        validation (keyframes, references, their counts)       MiniMaxH3Ref2VASetupStep's checks
resolve_canvas             the canvas of a keyframe's aspect ratio ("auto")       resolve_canvas_size
prepare_keyframes          stretched first / cover-cropped follower, LANCZOS      MiniMaxH3ResizeStep
normalize_references       2048-short-edge images, 24 fps videos, 32 kHz stereo   MiniMaxH3Ref2VASetupStep
encode_conditions          video VAE (posterior sampled, seed 42, via float16),   MiniMaxH3KeyframeVaeEncoderStep,
                           audio VAE (posterior mean)                             MiniMaxH3Ref2VAReferenceEncoderStep
pack_conditions            condition noise first (one draw each, t = 0.999),      MiniMaxH3PrepareConditionLatentsStep
                           the packed rows' positions and timesteps               MiniMaxH3(Ref2VA)PrepareLayoutStep
```

The differences from diffusers, and why, are in this folder's README ("FL2VA and Ref2VA").
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from PIL import Image

from .shapes import (
    AUDIO_CHANNELS,
    AUDIO_LATENT_CHANNELS,
    AUDIO_SAMPLE_RATE,
    FPS,
    MAX_AREA_PER_SHORT_EDGE_SQUARED,
    OFFICIAL_SHORT_EDGE,
)

TASKS = ("t2va", "fl2va", "ref2va")

# diffusers' MiniMaxH3ModularPipeline: the visual conditions are noised to t = 0.999 ("keyframe_noise_aug"; TeleFuser:
# "imgvid condition timestep 0.999") and held there; audio references ride clean at t = 1.0. Both in [0, 1], 1 = clean.
CONDITION_VIDEO_TIMESTEP = 0.999
CONDITION_AUDIO_TIMESTEP = 1.0
ENCODE_SEED = 42  # the posterior of every visual condition is sampled under its own generator seeded with this
PIXEL_MEAN = (0.485, 0.456, 0.406)  # the video VAE's ImageNet pixel convention
PIXEL_STD = (0.229, 0.224, 0.225)

# The released checkpoint's limits (diffusers' MiniMaxH3Ref2VASetupStep; the TeleFuser fork documents the same).
MAX_IMAGE_REFERENCES = 9
MAX_VIDEO_REFERENCES = 3
MAX_AUDIO_REFERENCES = 3
MAX_REFERENCES = 12
MIN_ASPECT_RATIO, MAX_ASPECT_RATIO = 1 / 4, 4


# -- the request's media ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ImageReference:
    """A subject, style or scene reference (at most 9): a PIL image, a (H, W, 3) array or a (3, H, W) tensor, uint8
    or float in [0, 1]. It never sets the generated canvas: it is encoded at its own 2048-pixel short edge."""

    image: Image.Image | np.ndarray | torch.Tensor
    kind: ClassVar[str] = "image"
    has_audio: ClassVar[bool] = False


@dataclass(frozen=True, eq=False)
class VideoReference:
    """A motion / camera reference (at most 3): frames (a list of PIL images, a (F, H, W, 3) array or a (F, 3, H, W)
    tensor, uint8 or float in [0, 1]) at `fps`, and optionally its soundtrack `audio` ((channels, samples), mono or
    stereo) at `sample_rate` (None: 32 kHz), conditioned on together."""

    frames: list | np.ndarray | torch.Tensor
    fps: float = float(FPS)
    audio: torch.Tensor | None = None
    sample_rate: int | None = None
    kind: ClassVar[str] = "video"

    @property
    def has_audio(self) -> bool:
        return self.audio is not None


@dataclass(frozen=True, eq=False)
class AudioReference:
    """A voice / music reference (at most 3, never on its own): a (channels, samples) waveform, mono or stereo, at
    `sample_rate` (None: 32 kHz)."""

    audio: torch.Tensor
    sample_rate: int | None = None
    kind: ClassVar[str] = "audio"
    has_audio: ClassVar[bool] = True


Reference = ImageReference | VideoReference | AudioReference


def load_reference(kind: str, path) -> Reference:
    """A reference from a file: "image" (PIL, through diffusers' ``load_image``: EXIF-rotated, RGB), "video" (its
    frames at the container's frame rate, and its soundtrack) or "audio" (the waveform at its sample rate); videos
    and audio are decoded by diffusers' reference classes (PyAV), which keep the rates."""
    if kind == "image":
        from diffusers.utils import load_image

        return ImageReference(load_image(str(path)))
    from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3AudioReference, MiniMaxH3VideoReference

    if kind == "video":
        decoded = MiniMaxH3VideoReference.from_file(path)
        return VideoReference(decoded.frames, float(decoded.fps), decoded.audio, decoded.sample_rate)
    if kind == "audio":
        decoded = MiniMaxH3AudioReference.from_file(path)
        return AudioReference(decoded.audio, decoded.sample_rate)
    raise ValueError(f"a reference is an 'image', a 'video' or an 'audio', got {kind!r}")


def _as_reference(entry, index: int) -> Reference:
    if isinstance(entry, (ImageReference, VideoReference, AudioReference)):
        return entry
    kind = getattr(entry, "kind", None)
    if type(entry).__module__.startswith("diffusers.") and kind in ("image", "video", "audio"):
        # diffusers' MiniMaxH3{Image,Video,Audio}Reference: the same fields
        if kind == "image":
            return ImageReference(entry.image)
        if kind == "video":
            return VideoReference(entry.frames, float(entry.fps), entry.audio, entry.sample_rate)
        return AudioReference(entry.audio, entry.sample_rate)
    raise ValueError(
        f"references[{index}] is a {type(entry).__name__}: a reference must be an ImageReference, a VideoReference "
        "or an AudioReference (telefuser.pipelines.minimax_h3.conditions; load_reference reads one from a file)"
    )


def _keyframe(image, name: str) -> Image.Image:
    """A keyframe as an RGB PIL image: a PIL image (converted to RGB) or a uint8 (H, W, 3) array."""
    if isinstance(image, Image.Image):
        if image.width < 1 or image.height < 1:
            raise ValueError(f"{name} is an empty image ({image.width}x{image.height})")
        return image if image.mode == "RGB" else image.convert("RGB")
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
            raise ValueError(
                f"{name} must be a uint8 RGB array of shape (height, width, 3), got {image.dtype} {tuple(image.shape)}"
            )
        return Image.fromarray(image, mode="RGB")
    raise ValueError(
        f"{name} must be a PIL image or a uint8 (height, width, 3) numpy array, got {type(image).__name__}"
    )


@dataclass(frozen=True, eq=False)
class ConditionRequest:
    """A request's conditions, validated: its task, its keyframes (RGB PIL) and its references (in order)."""

    task: str
    first_frame: Image.Image | None = None
    last_frame: Image.Image | None = None
    references: tuple[Reference, ...] = ()

    @classmethod
    def of(cls, first_frame=None, last_frame=None, references: Sequence = ()) -> ConditionRequest:
        if references is None:
            references = ()
        if isinstance(references, (str, bytes)) or not isinstance(references, Sequence):
            raise ValueError(f"references must be a list or tuple of references, got {type(references).__name__}")
        if references and (first_frame is not None or last_frame is not None):
            raise ValueError(
                "a request has keyframes (FL2VA) or references (Ref2VA), not both: the two tasks run different DiTs"
            )
        if references:
            refs = tuple(_as_reference(entry, i) for i, entry in enumerate(references))
            _check_reference_counts(refs)
            for i, ref in enumerate(refs):
                if ref.kind == "video" and not (isinstance(ref.fps, numbers.Real) and ref.fps > 0):
                    raise ValueError(f"references[{i}] (video) must have a positive fps, got {ref.fps!r}")
            return cls("ref2va", references=refs)
        first = None if first_frame is None else _keyframe(first_frame, "first_frame")
        last = None if last_frame is None else _keyframe(last_frame, "last_frame")
        return cls("t2va" if first is None and last is None else "fl2va", first, last)

    @property
    def keyframes(self) -> list[Image.Image]:
        """In packed order: the first keyframe, then the last one."""
        return [image for image in (self.first_frame, self.last_frame) if image is not None]

    @property
    def anchors(self) -> tuple[str, ...]:
        return tuple(a for a, image in (("first", self.first_frame), ("last", self.last_frame)) if image is not None)

    def describe(self) -> dict:
        """What the request conditioned on, JSON-serializable (for the result's metrics)."""
        if self.task == "fl2va":
            return {a: [image.width, image.height] for a, image in zip(self.anchors, self.keyframes)}
        if self.task == "ref2va":
            return {"references": [_describe_reference(ref) for ref in self.references]}
        return {}


def _describe_reference(ref: Reference) -> dict:
    out: dict = {"kind": ref.kind}
    if ref.kind == "video":
        out.update(frames=len(ref.frames), fps=float(ref.fps))
    if ref.has_audio:
        rate = AUDIO_SAMPLE_RATE if ref.sample_rate is None else int(ref.sample_rate)
        out.update(audio_samples=int(torch.as_tensor(ref.audio).shape[-1]), sample_rate=rate)
    return out


def _check_reference_counts(refs: Sequence[Reference]) -> None:
    """diffusers' MiniMaxH3Ref2VASetupStep limits: 9 images, 3 videos, 3 audio references, 12 in all; audio
    references need an image or a video reference beside them."""
    kinds = [ref.kind for ref in refs]
    limits = (("image", MAX_IMAGE_REFERENCES), ("video", MAX_VIDEO_REFERENCES), ("audio", MAX_AUDIO_REFERENCES))
    for kind, limit in limits:
        if kinds.count(kind) > limit:
            raise ValueError(f"MiniMax H3 accepts at most {limit} {kind} references, got {kinds.count(kind)}")
    if len(kinds) > MAX_REFERENCES:
        raise ValueError(f"MiniMax H3 accepts at most {MAX_REFERENCES} references in total, got {len(kinds)}")
    if set(kinds) == {"audio"}:
        raise ValueError("an audio reference needs an image or a video reference beside it; it cannot be used alone")


# -- the canvas --------------------------------------------------------------------------------------------------------
def keyframe_canvas(width: float, height: float, short_edge: int, multiple: int) -> tuple[int, int]:
    """(height, width) of the canvas of an aspect ratio: diffusers' ``resolve_canvas_size`` (short edge, area cap
    short_edge^2 * 1344/768, both axes rounded to `multiple`), which our ``shapes.canvas_for`` follows for named
    ratios. Ratios outside 1:4 .. 4:1 are refused."""
    if width <= 0 or height <= 0:
        raise ValueError(f"the aspect ratio must be positive, got {width}:{height}")
    ratio = width / height
    if not MIN_ASPECT_RATIO <= ratio <= MAX_ASPECT_RATIO:
        raise ValueError(f"MiniMax H3 supports aspect ratios from 1:4 to 4:1, got {width}:{height} ({ratio:g})")
    return _capped_canvas(ratio, short_edge, short_edge * short_edge * MAX_AREA_PER_SHORT_EDGE_SQUARED, multiple)


def _capped_canvas(ratio: float, short_edge: int, max_pixels: float, multiple: int) -> tuple[int, int]:
    """(height, width): `short_edge` on the short side at `ratio`, scaled down to `max_pixels`, both axes rounded to
    `multiple` (diffusers' ``resolve_canvas_size``)."""
    if ratio >= 1.0:
        w, h = short_edge * ratio, float(short_edge)
    else:
        w, h = float(short_edge), short_edge / ratio
    area = w * h
    if area > max_pixels:
        scale = (max_pixels / area) ** 0.5
        w, h = w * scale, h * scale
    return max(multiple, round(h / multiple) * multiple), max(multiple, round(w / multiple) * multiple)


def resolve_canvas(request: ConditionRequest, resolution, aspect_ratio: str | None, multiple: int):
    """The (resolution, aspect_ratio) to plan a request with. FL2VA's default (None or "auto") is the first keyframe's
    aspect ratio at the requested short edge, as diffusers derives it; an explicit ratio or WIDTHxHEIGHT wins, and
    the keyframes are then put onto that canvas. Other tasks default to 16:9 and have no "auto"."""
    if aspect_ratio is not None and aspect_ratio != "auto":
        return resolution, aspect_ratio
    if request.task != "fl2va":
        if aspect_ratio == "auto":
            raise ValueError('aspect ratio "auto" takes the first keyframe\'s; this request has no keyframe')
        return resolution, "16:9"
    explicit = isinstance(resolution, tuple) or (isinstance(resolution, str) and "x" in resolution.lower())
    if explicit:
        return resolution, "16:9"  # plan_shape ignores the ratio of an explicit canvas
    try:
        short_edge = int(resolution)
    except (TypeError, ValueError) as error:
        raise ValueError(f"resolution must be a short edge or WIDTHxHEIGHT, got {resolution!r}") from error
    if short_edge <= 0 or short_edge % multiple:
        raise ValueError(f"short edge {short_edge} must be a positive multiple of {multiple}")
    anchor = request.keyframes[0]
    return keyframe_canvas(anchor.width, anchor.height, short_edge, multiple), "16:9"


# -- FL2VA: keyframes onto the canvas ------------------------------------------------------------------------------
def prepare_keyframes(request: ConditionRequest, height: int, width: int) -> list[Image.Image]:
    """diffusers' MiniMaxH3ResizeStep: the first keyframe of the request (the last one when it is alone) is stretched
    onto the canvas (PIL LANCZOS); a follower (the last one, beside a first) is cover-cropped with the release's
    arithmetic (rounded scale, centred with ``(size - canvas) // 2``). Frames already at the canvas pass untouched."""
    prepared = []
    for index, keyframe in enumerate(request.keyframes):
        if keyframe.size == (width, height):
            prepared.append(keyframe)
        elif index == 0:
            prepared.append(keyframe.resize((width, height), Image.Resampling.LANCZOS))
        else:
            scale = max(width / keyframe.size[0], height / keyframe.size[1])
            resized_size = (max(width, round(keyframe.size[0] * scale)), max(height, round(keyframe.size[1] * scale)))
            left = max(0, (resized_size[0] - width) // 2)
            top = max(0, (resized_size[1] - height) // 2)
            resized = keyframe.resize(resized_size, Image.Resampling.LANCZOS)
            prepared.append(resized.crop((left, top, left + width, top + height)))
    return prepared


# -- Ref2VA: references onto MiniMax H3's rates and resolutions ----------------------------------------------------
@dataclass(frozen=True)
class ReferencePolicy:
    """The geometry references are normalized to (diffusers' pipeline configs; the released checkpoint's values by
    default): a video reference goes on the canvas of its own aspect ratio with `canvas_short_edge` and the area cap
    `canvas_max_pixels`; an image reference is scaled to `image_short_edge` (upscaling included, no area cap)."""

    canvas_short_edge: int = OFFICIAL_SHORT_EDGE
    canvas_max_pixels: int = 768 * 1344
    image_short_edge: int = 2048


def _image_processor():
    from diffusers.image_processor import VaeImageProcessor

    return VaeImageProcessor(vae_scale_factor=16)


def normalize_references(
    references: Sequence[Reference], frame_count: int, policy: ReferencePolicy, multiple: int = 32
) -> list[Reference]:
    """diffusers' MiniMaxH3Ref2VASetupStep (its media half), in request order: images to an RGB PIL image at the
    policy's short edge (LANCZOS), videos to uint8 (F, H, W, 3) frames at 24 fps truncated to `frame_count` on the
    canvas of their own aspect ratio, soundtracks to float32 stereo at 32 kHz truncated to the generated duration."""
    max_duration = frame_count / FPS
    processor = None
    normalized: list[Reference] = []
    for index, ref in enumerate(references):
        waveform = None
        if ref.has_audio:
            sample_rate = AUDIO_SAMPLE_RATE if ref.sample_rate is None else int(ref.sample_rate)
            waveform = _normalize_audio(ref.audio, sample_rate, max_duration, index)
        if ref.kind == "image":
            processor = processor or _image_processor()
            normalized.append(ImageReference(_normalize_image(ref.image, policy, multiple, processor, index)))
        elif ref.kind == "video":
            frames = _normalize_video(ref.frames, float(ref.fps), frame_count, policy, multiple, index)
            normalized.append(
                VideoReference(frames, float(FPS), waveform, None if waveform is None else AUDIO_SAMPLE_RATE)
            )
        else:
            normalized.append(AudioReference(waveform, AUDIO_SAMPLE_RATE))
    return normalized


def _normalize_audio(waveform, sample_rate: int, max_duration: float, index: int) -> torch.Tensor:
    """Truncated at its own rate to the generated duration, mono repeated to stereo, then resampled once with
    torchaudio when its rate is not 32 kHz (diffusers' ``_normalize_audio_condition``)."""
    waveform = torch.as_tensor(waveform)
    if waveform.ndim != 2 or waveform.shape[0] not in (1, 2) or waveform.shape[1] == 0:
        raise ValueError(
            f"references[{index}]: a soundtrack must be a (channels, samples) mono or stereo waveform, got "
            f"{tuple(waveform.shape)}"
        )
    if sample_rate <= 0:
        raise ValueError(f"references[{index}]: the sample rate must be positive, got {sample_rate}")
    waveform = waveform.to(torch.float32)[:, : int(max_duration * sample_rate)]
    if waveform.shape[0] != AUDIO_CHANNELS:
        waveform = waveform.expand(AUDIO_CHANNELS, -1).contiguous()
    if sample_rate == AUDIO_SAMPLE_RATE:
        return waveform
    try:
        import torchaudio
    except ImportError as error:
        raise ImportError(
            f"references[{index}]: resampling a soundtrack from {sample_rate} Hz to {AUDIO_SAMPLE_RATE} Hz needs "
            "torchaudio (as diffusers does); pass it at 32 kHz to do without"
        ) from error
    return torchaudio.transforms.Resample(sample_rate, AUDIO_SAMPLE_RATE)(waveform)


def _normalize_image(image, policy: ReferencePolicy, multiple: int, processor, index: int) -> Image.Image:
    """diffusers' image-reference branch: any layout to a PIL image through VaeImageProcessor's own conversions, a
    1:4 .. 4:1 check, then LANCZOS to the short edge (both axes rounded to `multiple`)."""
    if isinstance(image, torch.Tensor):
        if image.ndim != 3 or image.shape[0] != 3:
            raise ValueError(
                f"references[{index}]: an image tensor must be (3, height, width), got {tuple(image.shape)}"
            )
        if image.dtype == torch.uint8:
            image = image.float() / 255.0
        image = processor.pt_to_numpy(image[None])[0]
    if isinstance(image, np.ndarray):
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"references[{index}]: an image must be (height, width, 3) RGB pixels, got {image.shape}")
        if image.dtype == np.uint8:
            image = image.astype(np.float32) / 255.0
        image = processor.numpy_to_pil(image)[0]
    if not isinstance(image, Image.Image):
        raise ValueError(f"references[{index}]: an image reference holds a PIL image, an array or a tensor")
    width, height = image.size
    if width <= 0 or height <= 0:
        raise ValueError(f"references[{index}]: an image must have a positive size, got {image.size}")
    if width > 4 * height or height > 4 * width:
        raise ValueError(f"references[{index}]: an image must be within 1:4 and 4:1, got {width}x{height}")
    scale = policy.image_short_edge / min(width, height)
    target_height = max(multiple, round(height * scale / multiple) * multiple)
    target_width = max(multiple, round(width * scale / multiple) * multiple)
    if image.size != (target_width, target_height):
        image = processor.resize(image, height=target_height, width=target_width)
    return image


def _normalize_video(frames, fps: float, frame_count: int, policy: ReferencePolicy, multiple: int, index: int):
    """diffusers' ``_normalize_video_condition``: to uint8 (F, H, W, 3); onto 24 fps by holding each frame until the
    next one's slot (ffmpeg's fps filter); truncated to the generated frame count; LANCZOS onto the canvas its own
    aspect ratio resolves to (frames already there pass untouched)."""
    if isinstance(frames, list):
        frames = np.stack([np.asarray(frame.convert("RGB")) for frame in frames])
    if isinstance(frames, torch.Tensor):
        frames = frames.movedim(-3, -1).cpu().numpy()
    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        frames = (frames * 255.0).round().clip(0, 255).astype(np.uint8)
    if frames.ndim != 4 or frames.shape[3] != 3 or 0 in frames.shape:
        raise ValueError(f"references[{index}]: a video must be (frames, height, width, 3) RGB, got {frames.shape}")
    if fps != FPS:
        scale = FPS / fps
        slots = np.floor(np.arange(frames.shape[0]) * scale + 0.5).astype(np.int64)
        frames = np.repeat(frames, np.diff(slots, append=math.floor(frames.shape[0] * scale + 0.5)), axis=0)
    frames = frames[:frame_count]
    height, width = _resolve_canvas_size(
        frames.shape[2], frames.shape[1], multiple, policy.canvas_short_edge, policy.canvas_max_pixels
    )
    if frames.shape[1:3] == (height, width):
        return frames
    return np.stack(
        [np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.LANCZOS)) for frame in frames]
    )


def _resolve_canvas_size(aspect_w, aspect_h, multiple: int, short_edge: int, max_pixels: int) -> tuple[int, int]:
    """`keyframe_canvas` with an explicit area cap (a video reference's canvas follows the policy's)."""
    ratio = aspect_w / aspect_h
    if not MIN_ASPECT_RATIO <= ratio <= MAX_ASPECT_RATIO:
        raise ValueError(f"a reference video must be within 1:4 and 4:1, got {aspect_w}x{aspect_h}")
    return _capped_canvas(ratio, short_edge, max_pixels, multiple)


# -- the VAE encodes -----------------------------------------------------------------------------------------------
@torch.no_grad()
def encode_visual(video_decoder, pixels: torch.Tensor) -> torch.Tensor:
    """diffusers' ``encode_vae_condition``: uint8 pixels [1, 3, F, H, W] -> normalized latents [1, 24, t, h, w]
    (float32, CPU). ImageNet-normalized pixels, the posterior *sampled* under a fresh generator seeded 42, rounded to
    float16, then normalized by the latent statistics. One frame runs the (tiled) spatial encoder alone. The VAE is
    `video_decoder`'s (`vae.VideoDecoder`), lent to the device like for a decode when it lives in host memory."""
    vae = video_decoder.vae
    latents_mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    latents_std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with video_decoder._on_device() as device:
        pixels = pixels.to(device)
        pixel_mean = torch.tensor(PIXEL_MEAN, device=device).view(1, -1, 1, 1, 1)
        pixel_std = torch.tensor(PIXEL_STD, device=device).view(1, -1, 1, 1, 1)
        pixels = (pixels.to(torch.float32).div(255.0) - pixel_mean) / pixel_std
        posterior = vae.encode(pixels, return_dict=False)[0]
        latents = posterior.sample(generator=torch.Generator().manual_seed(ENCODE_SEED))
        latents = latents.to(torch.float16).float().cpu()
    return (latents - latents_mean) / latents_std


@torch.no_grad()
def encode_soundtrack(audio_decoder, waveform: torch.Tensor) -> torch.Tensor:
    """diffusers' Ref2VA soundtrack encode: stereo [2, samples] at 32 kHz -> normalized channel-major rows
    [2 * T, 32] (float32, CPU), from the posterior *mean* of the mono audio VAE (the channels as two batch items)."""
    vae = audio_decoder.vae
    latents_mean = torch.tensor(vae.config.latents_mean).view(1, 1, -1)
    latents_std = torch.tensor(vae.config.latents_std).view(1, 1, -1)
    with audio_decoder._on_device() as device:
        posterior = vae.encode(waveform.to(device)[:, None], return_dict=False)[0]
        latents = posterior.mode().float().cpu().transpose(1, 2)
    normalized = (latents - latents_mean) / latents_std
    return normalized.reshape(-1, vae.config.latent_channels)


def keyframe_pixels(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)[None, :, None]


def video_pixels(frames: np.ndarray, frames_per_chunk: int, latents_per_chunk: int) -> torch.Tensor:
    """A normalized reference video's first ``17n + 5`` frames (at least 22) as uint8 [1, 3, F, H, W]: snapped
    *down*, so the VAE encodes without padding when the reference is long enough (diffusers)."""
    count = frames.shape[0]
    count = max(1, (count - latents_per_chunk) // frames_per_chunk) * frames_per_chunk + latents_per_chunk
    return torch.from_numpy(frames[:count].copy()).permute(3, 0, 1, 2)[None]


@dataclass(frozen=True, eq=False)
class EncodedConditions:
    """A request's conditions after the VAEs, before noise: the visual latents ([1, 24, t, h, w] normalized, packed
    order), the audio rows ([2T, 32] per audio-bearing reference, packed order), and what the layout needs."""

    task: str
    latents: tuple[torch.Tensor, ...]
    audio_rows: tuple[torch.Tensor, ...] = ()
    anchors: tuple[str, ...] = ()  # FL2VA
    kinds: tuple[tuple[str, bool], ...] = ()  # Ref2VA: (kind, has_audio) per reference


def encode_conditions(
    request: ConditionRequest, shape, video_decoder, audio_decoder, policy: ReferencePolicy, multiple: int = 32
) -> EncodedConditions:
    """The keyframes put on the canvas, or the references normalized, then encoded (diffusers'
    MiniMaxH3KeyframeVaeEncoderStep / MiniMaxH3Ref2VAReferenceEncoderStep)."""
    if request.task == "fl2va":
        keyframes = prepare_keyframes(request, shape.height, shape.width)
        latents = tuple(encode_visual(video_decoder, keyframe_pixels(image)) for image in keyframes)
        return EncodedConditions("fl2va", latents, anchors=request.anchors)
    if request.task != "ref2va":
        raise ValueError(f"a {request.task} request has no conditions to encode")
    normalized = normalize_references(request.references, shape.frame_count, policy, multiple)
    latents, audio_rows = [], []
    for ref in normalized:
        if ref.kind == "image":
            latents.append(encode_visual(video_decoder, keyframe_pixels(ref.image)))
        elif ref.kind == "video":
            vae = video_decoder.vae  # 17 frames per chunk, 5 latent frames kept of each
            pixels = video_pixels(ref.frames, vae.config.clip_length, vae.tokens_chunk_size)
            latents.append(encode_visual(video_decoder, pixels))
        if ref.has_audio:
            audio_rows.append(encode_soundtrack(audio_decoder, ref.audio))
    kinds = tuple((ref.kind, ref.has_audio) for ref in normalized)
    return EncodedConditions("ref2va", tuple(latents), tuple(audio_rows), kinds=kinds)


# -- noise and packing ---------------------------------------------------------------------------------------------
def noised_condition_rows(latents: Sequence[torch.Tensor], generator: torch.Generator, patch_size) -> torch.Tensor:
    """diffusers' MiniMaxH3PrepareConditionLatentsStep: one draw per visual condition from the request's generator
    (before the generated rows' noise), ``t * x + (1 - t) * noise`` at t = 0.999 (MiniMaxH3Scheduler.scale_noise),
    patchified; [N, C * pt * ph * pw] rows in packed order (float32, CPU)."""
    from diffusers import MiniMaxH3Scheduler

    from telefuser.models.minimax_h3.packing import patchify_video

    scheduler = MiniMaxH3Scheduler()  # scale_noise reads no schedule state: t is taken at face value
    rows = []
    for condition in latents:
        noise = torch.randn(condition.shape, generator=generator, dtype=torch.float32)
        noised = scheduler.scale_noise(condition, CONDITION_VIDEO_TIMESTEP, noise)
        rows.append(patchify_video(noised, patch_size)[0])
    return torch.cat(rows)


def condition_layout(encoded: EncodedConditions, *, text_rows: int, video_latent_thw, patch_size):
    """The packed condition rows' layout (`packing.keyframe_layout` / `packing.reference_layout`); a reference's
    geometry is the shape its encode produced, as in diffusers."""
    from telefuser.models.minimax_h3.packing import ReferenceGeometry, keyframe_layout, reference_layout

    if encoded.task == "fl2va":
        return keyframe_layout(
            encoded.anchors, text_rows=text_rows, video_latent_thw=video_latent_thw, patch_size=patch_size
        )
    visual, audio = iter(encoded.latents), iter(encoded.audio_rows)
    geometries = []
    for kind, has_audio in encoded.kinds:
        thw = tuple(next(visual).shape[2:5]) if kind in ("image", "video") else None
        audio_latents = next(audio).shape[0] // AUDIO_CHANNELS if has_audio else 0
        geometries.append(ReferenceGeometry(kind, thw, audio_latents))
    return reference_layout(
        geometries,
        text_rows=text_rows,
        video_latent_thw=video_latent_thw,
        patch_size=patch_size,
        audio_channels=AUDIO_CHANNELS,
    )


def pack_conditions(
    encoded: EncodedConditions,
    *,
    text_rows: int,
    shape,
    generator: torch.Generator,
    patch_size,
    device: torch.device,
    timestep_scale: float,
):
    """The DiT's `packing.Conditions` for a request: noised video condition tokens (drawn now from `generator`, which
    draws the generated rows' noise next), the audio reference rows (clean), the layout, and the condition timesteps
    in the DiT's scale."""
    from telefuser.models.minimax_h3.packing import Conditions

    layout = condition_layout(
        encoded,
        text_rows=text_rows,
        video_latent_thw=(shape.video_latent_t, shape.latent_h, shape.latent_w),
        patch_size=patch_size,
    )
    # every FL2VA / Ref2VA request has a visual condition (an audio reference never comes alone)
    video = noised_condition_rows(encoded.latents, generator, patch_size)
    audio = torch.cat(encoded.audio_rows) if encoded.audio_rows else torch.zeros(0, AUDIO_LATENT_CHANNELS)
    return Conditions(
        layout=layout,
        video=video[None].to(device),
        audio=audio.t()[None].contiguous().to(device),
        video_timestep_floor=CONDITION_VIDEO_TIMESTEP * timestep_scale,
        audio_timestep=CONDITION_AUDIO_TIMESTEP * timestep_scale,
    )
