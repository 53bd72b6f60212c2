"""MiniMax H3 FL2VA (first / last keyframes) and Ref2VA (image, video, audio references) against diffusers' 0.42.1
modular MiniMax H3 blocks, on tiny random models, fp32, on the CPU.

What is compared, and how:

* Preparation (`conditions.py`, `packing.keyframe_layout` / `reference_layout`) against diffusers' blocks run on the
  same inputs and the same VAE modules (MiniMaxH3ResizeStep / MiniMaxH3Ref2VASetupStep, the keyframe / reference
  encoder steps, the layout steps, MiniMaxH3PrepareConditionLatentsStep, MiniMaxH3PrepareLatentsStep, the FL2VA /
  Ref2VA prepare-latents steps, MiniMaxH3SetTimestepsStep): the same computation, so `torch.equal` throughout --
  keyframe and reference pixels, waveforms, encoded latents (the VAE encode is the same module call on the same
  input, its posterior sampled under the same seed), the noised condition rows, the generated rows' noise, the packed
  rows' positions (float32, what the DiT consumes), tags, order and per-row timesteps.
* One DiT call with conditions against diffusers' `MiniMaxH3Transformer3DModel` on diffusers' packed sequence: the
  same arithmetic along other paths (fused QKV, padded attention, t * 1000 / 1000), bound 1e-5 relative as for T2VA
  (tests/unit/test_minimax_h3_faithfulness.py; fp32 unit roundoff 6e-8). Negative controls, each required 100x
  above the bound: keyframes swapped (FL2VA), condition rows at the generated rows' timestep, the generated rows'
  rotary clock not advanced by the references (Ref2VA).
* The whole pipeline's latents after the denoising loop against diffusers' FL2VA / Ref2VA core denoise steps on the
  same components: bound 1e-5 (the DiT's rounding through 2 Euler steps; as for T2VA).

diffusers' duration floor (5 s) is lowered to 0.9 s and its canvas to a 64-pixel short edge (image references at 64)
so CI encodes and attends over a few hundred rows; the geometry code is the same.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from telefuser.models.minimax_h3 import MiniMaxH3Config, load_minimax_h3_dit
from telefuser.models.minimax_h3.packing import (
    TAG_AUDIO,
    TAG_TEXT,
    TAG_VIDEO,
    keyframe_layout,
    pack_layout,
    patchify_video,
)
from telefuser.pipelines.minimax_h3 import MiniMaxH3Pipeline, build_minimax_h3_pipeline, plan_shape
from telefuser.pipelines.minimax_h3.conditions import (
    AudioReference,
    ConditionRequest,
    ImageReference,
    ReferencePolicy,
    VideoReference,
    encode_conditions,
    keyframe_canvas,
    normalize_references,
    pack_conditions,
    prepare_keyframes,
    resolve_canvas,
)
from telefuser.pipelines.minimax_h3.loading import resolve_partition
from telefuser.pipelines.minimax_h3.pipeline import draw_noise, partition_for_task
from telefuser.pipelines.minimax_h3.scheduler import FlowSchedule
from telefuser.pipelines.minimax_h3.vae import AudioDecoder, VideoDecoder, split_stereo_tokens
from telefuser.runtime import Runtime
from tests.minimax_h3_reference import (
    PATCH,
    our_rows,
    reference_audio_vae,
    reference_dit_from_release,
    reference_video_vae,
    release_dit_tensors,
    write_release_transformer,
)
from tests.numerics import relative_error

CONFIG = MiniMaxH3Config.tiny()
DIT_BOUND = 1e-5
LATENT_BOUND = 1e-5
FRAMES, STEPS, SEED, TEXT_ROWS = 22, 3, 7, 5  # 22 frames: 7 latent frames, 37 audio latents per channel
SHORT_EDGE = 64
POLICY = ReferencePolicy(canvas_short_edge=SHORT_EDGE, canvas_max_pixels=SHORT_EDGE * 112, image_short_edge=64)
DIFFUSERS_CONFIG = {"canvas_short_edge": SHORT_EDGE, "canvas_max_pixels": SHORT_EDGE * 112}
REF_CANVAS = (64, 96)  # Ref2VA target canvas (height, width)
CPU = torch.device("cpu")


# -- inputs ------------------------------------------------------------------------------------------------------------
def _pixels(height: int, width: int, seed: int, frames: int | None = None) -> np.ndarray:
    """Smooth random uint8 RGB content (LANCZOS on white noise would be all ringing)."""
    g = np.random.default_rng(seed)
    shape = (frames or 1, height // 4 + 1, width // 4 + 1, 3)
    coarse = torch.from_numpy(g.random(shape).astype(np.float32)).permute(0, 3, 1, 2)
    fine = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    out = (fine.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    return out if frames else out[0]


FIRST = _pixels(48, 80, seed=1)  # 5:3: the canvas at short edge 64 is 64 x 96
LAST = _pixels(60, 70, seed=2)  # another ratio: cover-cropped when it follows FIRST


def _waveform(channels: int, seconds: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.3 * torch.randn(channels, int(seconds * 32000), generator=g).clamp(-3, 3)


def _references():
    """An image (uint8 array), a 30 fps video with a stereo soundtrack, a mono audio clip: every branch."""
    return [
        ImageReference(_pixels(40, 56, seed=3)),
        VideoReference(_pixels(36, 60, seed=4, frames=14), fps=30.0, audio=_waveform(2, 0.5, 5), sample_rate=32000),
        AudioReference(_waveform(1, 0.6, 6), sample_rate=32000),
    ]


def _diffusers_references(references):
    from diffusers.modular_pipelines.minimax_h3.references import (
        MiniMaxH3AudioReference,
        MiniMaxH3ImageReference,
        MiniMaxH3VideoReference,
    )

    out = []
    for ref in references:
        if ref.kind == "image":
            out.append(MiniMaxH3ImageReference(image=ref.image))
        elif ref.kind == "video":
            out.append(MiniMaxH3VideoReference(ref.frames, ref.fps, ref.audio, ref.sample_rate))
        else:
            out.append(MiniMaxH3AudioReference(ref.audio, ref.sample_rate))
    return out


# -- models --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The reference VAEs and DiT (diffusers' classes) and ours reading the same tensors."""
    tensors = release_dit_tensors(CONFIG, seed=31)
    folder = write_release_transformer(tensors, CONFIG, tmp_path_factory.mktemp("h3c") / "transformer")
    video_vae, audio_vae = reference_video_vae(seed=22), reference_audio_vae(seed=23)
    return {
        "dit": load_minimax_h3_dit(folder, device="cpu", dtype=torch.float32),
        "transformer": reference_dit_from_release(tensors, CONFIG, "interleaved"),
        "vae": video_vae,
        "audio_vae": audio_vae,
        "video_decoder": VideoDecoder(video_vae, "reference video VAE"),
        "audio_decoder": AudioDecoder(audio_vae, "reference audio VAE"),
    }


def _text(tags: list[int] | None = None):
    g = torch.Generator().manual_seed(41)
    text = torch.randn(1, TEXT_ROWS, CONFIG.text_dim, generator=g)
    return text, torch.tensor(tags or [TAG_TEXT] * TEXT_ROWS)


def _run_diffusers(blocks: dict, models, outputs: list[str], **inputs):
    from diffusers import MiniMaxH3ModularPipeline, MiniMaxH3Scheduler
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.modular_pipelines import SequentialPipelineBlocks

    pipe = SequentialPipelineBlocks.from_blocks_dict(blocks).init_pipeline()
    pipe.update_components(
        vae=models["vae"],
        audio_vae=models["audio_vae"],
        transformer=models["transformer"],
        transformer_ref=models["transformer"],
        image_processor=VaeImageProcessor(vae_scale_factor=16),
        scheduler=MiniMaxH3Scheduler(shift=12.0),
        audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
        **DIFFUSERS_CONFIG,
        **({"reference_image_short_edge": POLICY.image_short_edge} if "setup" in blocks else {}),
    )
    with pytest.MonkeyPatch.context() as patch:
        # the product floor of 5 s would make CI attend over 5x the rows; the geometry code is the same
        patch.setattr(MiniMaxH3ModularPipeline, "min_duration", property(lambda self: 0.9))
        return pipe(
            **inputs,
            num_frames=FRAMES,
            num_inference_steps=STEPS,
            generator=torch.Generator().manual_seed(SEED),
            output=outputs,
        )


PREPARED = [
    "position_ids",
    "token_tags",
    "video_indices",
    "audio_indices",
    "text_indices",
    "latents",
    "audio_latents",
    "row_timestep_plan",
    "num_condition_video_rows",
    "num_condition_audio_rows",
    "condition_latents",
    "timesteps",
    "audio_timesteps",
]


def _fl2va_blocks(core: bool = False) -> dict:
    from diffusers.modular_pipelines.minimax_h3 import before_denoise as bd
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3ResizeStep
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3KeyframeVaeEncoderStep
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3FL2VACoreDenoiseStep

    blocks = {"resize": MiniMaxH3ResizeStep(), "encode": MiniMaxH3KeyframeVaeEncoderStep()}
    if core:
        return {**blocks, "denoise": MiniMaxH3FL2VACoreDenoiseStep()}
    return {
        **blocks,
        "layout": bd.MiniMaxH3PrepareLayoutStep(),
        "condition_latents": bd.MiniMaxH3PrepareConditionLatentsStep(),
        "latents": bd.MiniMaxH3PrepareLatentsStep(),
        "fl2va_latents": bd.MiniMaxH3FL2VAPrepareLatentsStep(),
        "timesteps": bd.MiniMaxH3SetTimestepsStep(),
    }


def _ref2va_blocks(core: bool = False) -> dict:
    from diffusers.modular_pipelines.minimax_h3 import before_denoise as bd
    from diffusers.modular_pipelines.minimax_h3.before_encoder import MiniMaxH3Ref2VASetupStep
    from diffusers.modular_pipelines.minimax_h3.encoders import MiniMaxH3Ref2VAReferenceEncoderStep
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3Ref2VACoreDenoiseStep

    blocks = {"setup": MiniMaxH3Ref2VASetupStep(), "encode": MiniMaxH3Ref2VAReferenceEncoderStep()}
    if core:
        return {**blocks, "denoise": MiniMaxH3Ref2VACoreDenoiseStep()}
    return {
        **blocks,
        "layout": bd.MiniMaxH3Ref2VAPrepareLayoutStep(),
        "condition_latents": bd.MiniMaxH3PrepareConditionLatentsStep(),
        "latents": bd.MiniMaxH3PrepareLatentsStep(),
        "ref2va_latents": bd.MiniMaxH3Ref2VAPrepareLatentsStep(),
        "timesteps": bd.MiniMaxH3SetTimestepsStep(),
    }


# -- ours ------------------------------------------------------------------------------------------------------------
def _prepare(models, request: ConditionRequest, resolution, text_tags=None):
    """Our preparation of a request, as the pipeline does it: (shape, encoded, conditions, video noise, audio noise)."""
    canvas, ratio = resolve_canvas(request, resolution, None, 32)
    shape = plan_shape(duration_s=FRAMES / 24, resolution=canvas, aspect_ratio=ratio)
    encoded = encode_conditions(request, shape, models["video_decoder"], models["audio_decoder"], POLICY)
    generator = torch.Generator().manual_seed(SEED)
    conditions = pack_conditions(
        encoded,
        text_rows=TEXT_ROWS,
        shape=shape,
        generator=generator,
        patch_size=PATCH,
        device=CPU,
        timestep_scale=1000.0,
    )
    if text_tags is not None:
        conditions = dataclasses.replace(conditions, text_tags=text_tags)
    video, audio = draw_noise(shape, generator, CPU)
    return shape, encoded, conditions, video, audio


def _layout(shape, conditions):
    return pack_layout(
        text_rows=TEXT_ROWS,
        video_latent_thw=(shape.video_latent_t, shape.latent_h, shape.latent_w),
        audio_rows=shape.audio_tokens,
        audio_channels=2,
        patch_size=PATCH,
        conditions=conditions.layout,
        text_tags=conditions.text_tags,
    )


def _assert_same_packing(shape, conditions, video, audio, theirs):
    """Every prepared tensor equal to diffusers': rows, order, positions, tags, per-row timesteps."""
    layout = _layout(shape, conditions)
    used = layout.used
    assert used == theirs["position_ids"].shape[0]
    # the packed values: condition rows (noised, patchified) then the generated rows' noise, in diffusers' row order
    n_video, n_audio = theirs["num_condition_video_rows"], theirs["num_condition_audio_rows"]
    assert n_video == conditions.layout.video_rows and n_audio == conditions.layout.audio_rows
    assert torch.equal(conditions.video[0], theirs["latents"][:n_video])
    assert torch.equal(patchify_video(video, PATCH)[0], theirs["latents"][n_video:])
    assert torch.equal(conditions.audio[0].t(), theirs["audio_latents"][:n_audio])
    assert torch.equal(audio[0].t(), theirs["audio_latents"][n_audio:])
    # where each row sits: diffusers' indices are our packed order
    sequence = torch.arange(layout.seq_len)
    cond = [(rows, modality) for rows, modality, _ in layout.condition_parts()]
    video_rows = torch.cat([sequence[r] for r, m in cond if m == TAG_VIDEO] + [sequence[layout.video]])
    audio_rows = torch.cat([sequence[r] for r, m in cond if m == TAG_AUDIO] + [sequence[layout.audio]])
    assert torch.equal(video_rows, theirs["video_indices"]) and torch.equal(audio_rows, theirs["audio_indices"])
    assert torch.equal(sequence[layout.text], theirs["text_indices"])
    assert torch.equal(layout.tags[:used], theirs["token_tags"])
    assert torch.equal(layout.positions[:used], theirs["position_ids"].float())  # what both models consume
    # per-row timesteps of every step: our slots (video, audio, video conditions, audio references) -> diffusers'
    schedule = FlowSchedule.build(STEPS)
    assert torch.equal(schedule.video.timesteps, theirs["timesteps"])
    for step, (unique, inverse) in enumerate(theirs["row_timestep_plan"]):
        tv, ta = schedule.model_times(step)
        values = torch.stack([tv, ta, torch.maximum(tv, torch.tensor(0.999)), torch.tensor(1.0)])
        assert torch.equal(values[layout.timestep_slots[:used]], unique[inverse]), step


# -- FL2VA ---------------------------------------------------------------------------------------------------------
KEYFRAME_CASES = {"first": (FIRST, None), "last": (None, LAST), "both": (FIRST, LAST)}


@pytest.mark.parametrize("case", list(KEYFRAME_CASES))
def test_fl2va_preparation_equals_diffusers_blocks(models, case):
    first, last = KEYFRAME_CASES[case]
    pil = {k: None if v is None else Image.fromarray(v) for k, v in (("image", first), ("last_image", last))}
    theirs = _run_diffusers(
        _fl2va_blocks(), models, PREPARED + ["keyframes", "height", "width"], **pil, text_token_tags=_text()[1]
    )
    request = ConditionRequest.of(first, last)
    assert request.task == "fl2va" and request.anchors == tuple(a for a in ("first", "last") if pil[_key(a)])
    shape, encoded, conditions, video, audio = _prepare(models, request, SHORT_EDGE)
    assert (shape.height, shape.width) == (theirs["height"], theirs["width"])
    for ours, ref in zip(prepare_keyframes(request, shape.height, shape.width), theirs["keyframes"], strict=True):
        assert np.array_equal(np.array(ours), np.array(ref))
    for ours, ref in zip(encoded.latents, theirs["condition_latents"], strict=True):
        assert torch.equal(ours, ref)
    _assert_same_packing(shape, conditions, video, audio, theirs)


def _key(anchor: str) -> str:
    return "image" if anchor == "first" else "last_image"


def test_keyframe_canvas_equals_diffusers():
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import resolve_canvas_size

    for short_edge in (64, 768):
        for width, height in ((1920, 1080), (1080, 1920), (1000, 1000), (640, 481), (4000, 1000), (517, 1033)):
            expected = resolve_canvas_size(width, height, 32, short_edge, short_edge * short_edge * 1344 // 768)
            assert keyframe_canvas(width, height, short_edge, 32) == expected
    with pytest.raises(ValueError, match="1:4 to 4:1"):
        keyframe_canvas(4100, 1000, 768, 32)


def _fl2va_call(models, case: str, text_tags: list[int]):
    """(our velocity rows, diffusers' velocity rows of the generated part) of DiT call 1, and our call's inputs."""
    first, last = KEYFRAME_CASES[case]
    pil = {k: None if v is None else Image.fromarray(v) for k, v in (("image", first), ("last_image", last))}
    text, tags = _text(text_tags)
    theirs = _run_diffusers(_fl2va_blocks(), models, PREPARED, **pil, text_token_tags=tags)
    _, _, conditions, video, audio = _prepare(models, ConditionRequest.of(first, last), SHORT_EDGE, tags)
    return _one_call(models, theirs, text, conditions, video, audio)


def _one_call(models, theirs, text, conditions, video, audio, step: int = 1):
    """(ours: conditions -> our velocity rows of DiT call `step`, diffusers' rows of the generated part, our
    conditions)."""
    unique, inverse = theirs["row_timestep_plan"][step]
    with torch.no_grad():
        ref_video, ref_audio = models["transformer"](
            theirs["latents"][None],
            theirs["audio_latents"][None],
            text,
            unique,
            inverse,
            theirs["token_tags"],
            theirs["position_ids"].float(),
            theirs["video_indices"],
            theirs["audio_indices"],
            theirs["text_indices"],
            return_dict=False,
        )
    n_video, n_audio = theirs["num_condition_video_rows"], theirs["num_condition_audio_rows"]
    reference = (ref_video[0, n_video:], ref_audio[0, n_audio:])
    tv, ta = (t * 1000.0 for t in FlowSchedule.build(STEPS).model_times(step))

    def ours(conditions):
        with torch.no_grad():
            return our_rows(*models["dit"](video, audio, text, tv[None], ta[None], conditions=conditions))

    return ours, reference, conditions


@pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)
def test_fl2va_dit_call_matches_diffusers_transformer(models):
    # two rows of the text are a vision block's (tag video), as diffusers' FL2VA presentation tags them
    ours, reference, conditions = _fl2va_call(models, "both", [TAG_TEXT, TAG_VIDEO, TAG_VIDEO, TAG_TEXT, TAG_TEXT])
    got = ours(conditions)
    for name, o, t in zip(("video", "audio"), got, reference):
        assert relative_error(o, t) <= DIT_BOUND, name
    # negative controls: the keyframes swapped (each at the other's end of the clip), and the keyframe rows modulated
    # with the generated rows' timestep instead of max(t, 0.999) (measured 5.0e-3 and 1.9e-3)
    swapped = dataclasses.replace(
        conditions,
        layout=keyframe_layout(("last", "first"), text_rows=TEXT_ROWS, video_latent_thw=(7, 4, 6), patch_size=PATCH),
    )
    unaugmented = dataclasses.replace(conditions, video_timestep_floor=0.0)
    for control in (swapped, unaugmented):
        assert max(relative_error(o, t) for o, t in zip(ours(control), reference)) > 100 * DIT_BOUND


# -- Ref2VA ----------------------------------------------------------------------------------------------------------
def test_ref2va_preparation_equals_diffusers_blocks(models):
    references = _references()
    outputs = PREPARED + ["normalized_references", "audio_condition_latents"]
    theirs = _run_diffusers(
        _ref2va_blocks(),
        models,
        outputs,
        references=_diffusers_references(references),
        height=REF_CANVAS[0],
        width=REF_CANVAS[1],
        text_token_tags=_text()[1],
    )
    request = ConditionRequest.of(references=references)
    assert request.task == "ref2va"
    shape, encoded, conditions, video, audio = _prepare(models, request, REF_CANVAS)
    normalized = normalize_references(request.references, shape.frame_count, POLICY)
    for ours, ref in zip(normalized, theirs["normalized_references"], strict=True):
        assert ours.kind == ref.kind
        if ours.kind == "image":
            assert ours.image.size == ref.image.size and np.array_equal(np.array(ours.image), np.array(ref.image))
        if ours.kind == "video":
            assert np.array_equal(ours.frames, ref.frames) and ours.fps == ref.fps
        if ours.has_audio:
            assert torch.equal(ours.audio, ref.audio)
    for ours, ref in zip(encoded.latents, theirs["condition_latents"], strict=True):
        assert torch.equal(ours, ref)
    for ours, ref in zip(encoded.audio_rows, theirs["audio_condition_latents"], strict=True):
        assert torch.equal(ours, ref)
    _assert_same_packing(shape, conditions, video, audio, theirs)


def _ref2va_call(models):
    references = _references()
    text, tags = _text()
    theirs = _run_diffusers(
        _ref2va_blocks(),
        models,
        PREPARED,
        references=_diffusers_references(references),
        height=REF_CANVAS[0],
        width=REF_CANVAS[1],
        text_token_tags=tags,
    )
    _, _, conditions, video, audio = _prepare(models, ConditionRequest.of(references=references), REF_CANVAS)
    return _one_call(models, theirs, text, conditions, video, audio)


@pytest.mark.numerics
def test_ref2va_dit_call_matches_diffusers_transformer(models):
    ours, reference, conditions = _ref2va_call(models)
    got = ours(conditions)
    for name, o, t in zip(("video", "audio"), got, reference):
        assert relative_error(o, t) <= DIT_BOUND, name
    # negative controls: the audio references modulated as noisy (the generated video's timestep floor, not clean),
    # and the generated rows' rotary clock starting right after the text (as in FL2VA), not after the references
    # (measured 9.9e-3 and 1.3e-2)
    noisy_audio = dataclasses.replace(conditions, audio_timestep=0.0)
    same_origin = dataclasses.replace(conditions, layout=dataclasses.replace(conditions.layout, media_origin=None))
    for control in (noisy_audio, same_origin):
        assert max(relative_error(o, t) for o, t in zip(ours(control), reference)) > 100 * DIT_BOUND


# -- the whole pipeline --------------------------------------------------------------------------------------------
class _FixedText:
    """A prompt encoder that returns the test's text embeddings (the presentation is compared nowhere here)."""

    def __init__(self, text):
        self.text = text

    def __call__(self, prompt, device):
        return self.text.to(device)


def _pipeline(models, partition: str) -> MiniMaxH3Pipeline:
    return MiniMaxH3Pipeline(
        models["dit"],
        _FixedText(_text()[0]),
        models["video_decoder"],
        models["audio_decoder"],
        patch_size=PATCH,
        show_progress=False,
        partition=partition,
        reference_policy=POLICY,
    )


@pytest.mark.numerics
def test_fl2va_pipeline_matches_diffusers_fl2va_denoise(models):
    text, tags = _text()
    theirs = _run_diffusers(
        _fl2va_blocks(core=True),
        models,
        ["latents", "audio_latents"],
        image=Image.fromarray(FIRST),
        last_image=Image.fromarray(LAST),
        prompt_embeds=text,
        text_token_tags=tags,
    )
    result = _pipeline(models, "FL2VA")(
        "a fox", duration=FRAMES / 24, resolution=SHORT_EDGE, steps=STEPS, seed=SEED, first_frame=FIRST, last_frame=LAST
    )
    assert relative_error(result.video_latents, theirs["latents"]) <= LATENT_BOUND
    assert relative_error(split_stereo_tokens(result.audio_latents), theirs["audio_latents"]) <= LATENT_BOUND
    assert result.frames.shape == (FRAMES, 64, 96, 3)
    request = result.metrics()["request"]
    assert request["task"] == "fl2va" and request["aspect_ratio"] == "auto"
    assert request["conditions"] == {"first": [80, 48], "last": [70, 60]}


@pytest.mark.numerics
def test_ref2va_pipeline_matches_diffusers_ref2va_denoise(models):
    references = _references()
    text, tags = _text()
    theirs = _run_diffusers(
        _ref2va_blocks(core=True),
        models,
        ["latents", "audio_latents"],
        references=_diffusers_references(references),
        height=REF_CANVAS[0],
        width=REF_CANVAS[1],
        prompt_embeds=text,
        text_token_tags=tags,
    )
    pipe = _pipeline(models, "Ref2VA")
    request = dict(duration=FRAMES / 24, resolution=REF_CANVAS, steps=STEPS, seed=SEED)
    result = pipe("a fox", references=references, **request)
    assert relative_error(result.video_latents, theirs["latents"]) <= LATENT_BOUND
    assert relative_error(split_stereo_tokens(result.audio_latents), theirs["audio_latents"]) <= LATENT_BOUND
    kinds = [ref["kind"] for ref in result.metrics()["request"]["conditions"]["references"]]
    assert kinds == ["image", "video", "audio"] and result.timings.condition_encode_s > 0
    # negative control: the same references in another order, another request (measured 4.4e-3)
    reordered = pipe("a fox", references=[references[1], references[0], references[2]], **request)
    assert relative_error(reordered.video_latents, theirs["latents"]) > 100 * LATENT_BOUND


def test_conditioned_adaln_tables_equal_per_call_projections(models):
    """The table path with conditions is the same computation as the per-call one (precompute_adaln keys the
    condition rows' timesteps too): bit-identical, and a call whose conditions differ is refused."""
    shape, _, conditions, video, audio = _prepare(models, ConditionRequest.of(FIRST, LAST), SHORT_EDGE)
    text = _text()[0]
    dit = models["dit"]
    tv, ta = torch.tensor([250.0]), torch.tensor([76.9])
    tables = dit.precompute_adaln([tv], [ta], conditions=conditions)
    with torch.no_grad():
        direct = dit(video, audio, text, tv, ta, conditions=conditions)
        tabled = dit(video, audio, text, tv, ta, conditions=conditions, adaln=tables)
    assert all(torch.equal(a, b) for a, b in zip(direct, tabled))
    with pytest.raises(ValueError, match="no AdaLN table"):
        dit(video, audio, text, tv, ta, conditions=dataclasses.replace(conditions, audio_timestep=999.0), adaln=tables)


# -- the DiT's T2VA path is untouched -------------------------------------------------------------------------------
def test_t2va_layout_is_the_one_without_conditions():
    kwargs = dict(text_rows=3, video_latent_thw=(7, 4, 6), audio_rows=8, audio_channels=2, patch_size=PATCH)
    plain = pack_layout(**kwargs)
    assert plain.condition_rows == 0 and plain.conditions is None and plain.condition_parts() == []
    assert (plain.text, plain.audio, plain.video) == (slice(0, 3), slice(3, 11), slice(11, 11 + 42))


# -- validation ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"first_frame": np.zeros((8, 8), np.uint8)}, r"uint8 RGB array of shape \(height, width, 3\)"),
        ({"first_frame": np.zeros((8, 8, 4), np.uint8)}, r"uint8 RGB array"),
        ({"last_frame": np.zeros((8, 8, 3), np.float32)}, r"uint8 RGB array"),
        ({"first_frame": torch.zeros(8, 8, 3)}, r"PIL image or a uint8"),
        ({"references": [ImageReference(FIRST)] * 10}, r"at most 9 image references"),
        ({"references": [VideoReference(FIRST[None])] * 4}, r"at most 3 video references"),
        ({"references": [ImageReference(FIRST)] + [AudioReference(torch.zeros(1, 8))] * 4}, r"at most 3 audio"),
        ({"references": [AudioReference(torch.zeros(1, 8))]}, r"needs an image or a video reference"),
        ({"references": ["cat.png"]}, r"references\[0\] is a str: a reference must be an ImageReference"),
        ({"references": ImageReference(FIRST)}, r"references must be a list or tuple"),
        ({"references": [VideoReference(FIRST[None], fps=0)]}, r"positive fps"),
        ({"references": [ImageReference(FIRST)], "first_frame": FIRST}, r"keyframes \(FL2VA\) or references"),
    ],
)  # fmt: skip
def test_condition_requests_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConditionRequest.of(**kwargs)


def test_twelve_references_in_all():
    refs = [ImageReference(FIRST)] * 9 + [VideoReference(FIRST[None])] * 3
    assert len(ConditionRequest.of(references=refs).references) == 12
    with pytest.raises(ValueError, match="at most 12 references in total"):
        ConditionRequest.of(references=refs + [AudioReference(torch.zeros(1, 8))])


def test_media_and_partitions_are_checked(models):
    fl2va, ref2va = _pipeline(models, "FL2VA"), _pipeline(models, "Ref2VA")
    common = dict(duration=FRAMES / 24, resolution=SHORT_EDGE, steps=2)
    with pytest.raises(ValueError, match=r"ref2va request \(references\) runs on the Ref2VA DiT.*partition='Ref2VA'"):
        fl2va("a fox", references=[ImageReference(FIRST)], **common)
    with pytest.raises(ValueError, match=r"fl2va request \(keyframes\) runs on the FL2VA DiT"):
        ref2va("a fox", first_frame=FIRST, **common)
    with pytest.raises(ValueError, match=r"t2va request .* runs on the FL2VA DiT"):
        ref2va("a fox", **common)
    with pytest.raises(ValueError, match="has no keyframe"):
        fl2va("a fox", aspect_ratio="auto", **common)
    with pytest.raises(ValueError, match="1:4 to 4:1"):
        fl2va("a fox", first_frame=np.zeros((8, 40, 3), np.uint8), **common)
    with pytest.raises(ValueError, match=r"references\[0\]: an image must be \(height, width, 3\)"):
        ref2va("a fox", references=[ImageReference(np.zeros((8, 8), np.uint8))], **common)
    with pytest.raises(ValueError, match=r"references\[1\]: a soundtrack must be a \(channels, samples\)"):
        ref2va("a fox", references=[ImageReference(FIRST), AudioReference(torch.zeros(3, 80))], **common)
    with pytest.raises(ValueError, match="partition must be one of FL2VA, Ref2VA"):
        _pipeline(models, "ref2va")
    assert [partition_for_task(t) for t in ("t2va", "fl2va", "ref2va")] == ["FL2VA", "FL2VA", "Ref2VA"]


def test_ref2va_partition_is_its_own_dit(tmp_path: Path):
    fl2va = build_minimax_h3_pipeline(
        config="tiny", runtime=Runtime.one_rank("cpu", torch.float32), seed=3, show_progress=False
    )
    ref2va = build_minimax_h3_pipeline(
        config="tiny", runtime=Runtime.one_rank("cpu", torch.float32), seed=3, show_progress=False, partition="Ref2VA"
    )
    assert (fl2va.partition, ref2va.partition) == ("FL2VA", "Ref2VA")
    a, b = fl2va.dit.state_dict(), ref2va.dit.state_dict()
    assert not torch.equal(a["blocks.0.attn.qkv_proj.weight"], b["blocks.0.attn.qkv_proj.weight"])
    assert "Ref2VA" in ref2va.weights["dit"]
    for name in ("FL2VA", "Ref2VA"):
        (tmp_path / name / "transformer").mkdir(parents=True)
    assert resolve_partition(tmp_path, "Ref2VA") == tmp_path / "Ref2VA"
    assert resolve_partition(tmp_path / "Ref2VA", "Ref2VA") == tmp_path / "Ref2VA"
    with pytest.raises(FileNotFoundError, match="is the FL2VA partition"):
        resolve_partition(tmp_path / "FL2VA", "Ref2VA")
    with pytest.raises(ValueError, match="partition must be one of"):
        build_minimax_h3_pipeline(config="tiny", partition="ref")
