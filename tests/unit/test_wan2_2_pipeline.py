"""Wan 2.2's denoise loop against diffusers' `WanPipeline` (two experts switched at the boundary, CFG), TI2V-5B's
text+image loop against `WanImageToVideoPipeline(expand_timesteps=True)` (the image resized, VAE-encoded, held as the
first latent frame at timestep 0), and the whole call on tiny random weights.

Tolerance of the loop: the same fp32 DiT difference as one forward (tests/unit/test_wan2_2_model.py, 1024 fp32 unit
roundoffs) carried through four UniPC steps, each a linear combination of the latents and the guided predictions
with coefficients of order one, then guided (x4 at most): measured 2.3e-6 (text) and 1.4e-6 (text+image), bound
4 x 1024 unit roundoffs. Negative controls must land 100x above it: the experts in the wrong order (0.73); for the
image, the t = 0 frame shifted by one (0.29) or the scheduler's t on every token (0.039). The image's latent frame is
data movement after the same preprocessing and encode: equal to diffusers' bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKLWan, WanImageToVideoPipeline, WanPipeline
from PIL import Image

from telefuser.models.wan2_2.checkpoint import load_wan22_dit
from telefuser.models.wan2_2.config import release
from telefuser.pipelines.hooks import GenerationCancelled, StepHooks
from telefuser.pipelines.wan.vae import VAE_CONFIGS, WanVideoVAE
from telefuser.pipelines.wan2_2 import pipeline as pipeline_module
from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline
from telefuser.pipelines.wan2_2.pipeline import Wan22Pipeline, first_frame_timesteps, flow_scheduler, image_pixels
from telefuser.runtime import Runtime
from tests.numerics import UNIT_ROUNDOFF, relative_error
from tests.unit.test_wan2_2_model import TEXT_LEN, diffusers_dit, write_diffusers

BOUND = 4 * 1024 * UNIT_ROUNDOFF[torch.float32]
STEPS = 4  # timesteps 999, 973, 923, 800 at T2V-A14B's shift 12: three high-noise steps, then one low-noise step
GUIDANCE = (4.0, 3.0)  # the release's (high-noise, low-noise)


def _loop_inputs():
    g = torch.Generator().manual_seed(11)
    noise = torch.randn(1, 16, 3, 4, 6, generator=g)
    text, negative = torch.randn(1, TEXT_LEN, 32, generator=g), torch.randn(1, TEXT_LEN, 32, generator=g)
    text[:, 9:], negative[:, 3:] = 0, 0
    return noise, text, negative


def _counted(model, calls: list, name: str):
    model.register_forward_pre_hook(lambda module, args: calls.append((name, args[0].shape[0])))
    return model


@pytest.mark.numerics
def test_the_loop_matches_diffusers_wan_pipeline_latents(tmp_path):
    high, low = diffusers_dit(16, seed=0), diffusers_dit(16, seed=1)
    noise, text, negative = _loop_inputs()
    reference = WanPipeline(None, None, None, flow_scheduler(12.0), transformer=high, transformer_2=low,
                            boundary_ratio=0.875)  # fmt: skip
    expected = reference(
        prompt_embeds=text, negative_prompt_embeds=negative, latents=noise.clone(), height=32, width=48,
        num_frames=9, num_inference_steps=STEPS, guidance_scale=GUIDANCE[0], guidance_scale_2=GUIDANCE[1],
        output_type="latent", return_dict=False,
    )[0]  # fmt: skip

    calls = []
    experts = [
        _counted(load_wan22_dit(write_diffusers(m, tmp_path / n), device="cpu", dtype=torch.float32), calls, n)
        for m, n in ((high, "high"), (low, "low"))
    ]
    pipe = Wan22Pipeline(experts, None, None, release("t2v-a14b", "tiny"))
    ours, dit_calls = pipe.denoise(noise.clone(), text, negative, steps=STEPS, guidance=GUIDANCE)
    assert calls == [("high", 2)] * 3 + [("low", 2)] and dit_calls == STEPS  # CFG batched: one B=2 call per step
    error = relative_error(ours, expected)
    print(f"Wan 2.2 loop against WanPipeline, {STEPS} steps: max rel {error:.2e}")
    assert error <= BOUND

    swapped = Wan22Pipeline(experts[::-1], None, None, release("t2v-a14b", "tiny"))
    wrong, _ = swapped.denoise(noise.clone(), text, negative, steps=STEPS, guidance=GUIDANCE)
    wrong_error = relative_error(wrong, expected)
    print(f"negative control (experts swapped): max rel {wrong_error:.2e}")
    assert wrong_error > 100 * BOUND


# -- TI2V-5B: text + image ------------------------------------------------------------------------------------------
TI2V_STEPS, TI2V_GUIDANCE = 4, 5.0  # timesteps 999, 937, 833, 625 at TI2V-5B's shift 5; its release guidance
TI2V_SIZE = (64, 64)  # (width, height): latents 4 x 4 (2 x 2 tokens a frame), 3 latent frames for 9 frames


def noise_image(width: int = 80, height: int = 48) -> Image.Image:
    """An RGB image off the canvas's size and aspect (the resize is exercised), every pixel random."""
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


def tiny_wan22_vae() -> AutoencoderKLWan:
    """The tiny Wan 2.2 VAE (48 channels, 16x spatial) with latent statistics off zero and one, so that the
    condition's normalisation is compared too."""
    g = torch.Generator().manual_seed(3)
    stats = {"latents_mean": (torch.randn(48, generator=g) * 0.3).tolist(),
             "latents_std": (torch.rand(48, generator=g) + 0.5).tolist()}  # fmt: skip
    torch.manual_seed(0)
    return AutoencoderKLWan(**{**VAE_CONFIGS["wan2.2", "tiny"], **stats}).eval()


@pytest.fixture(scope="module")
def ti2v_case(tmp_path_factory):
    """diffusers' `WanImageToVideoPipeline` (expand_timesteps) and ours on the same DiT and VAE weights, its latents
    for one image and our pipeline."""
    dit, vae = diffusers_dit(48, seed=0), tiny_wan22_vae()
    g = torch.Generator().manual_seed(11)
    noise = torch.randn(1, 48, 3, TI2V_SIZE[1] // 16, TI2V_SIZE[0] // 16, generator=g)
    text, negative = torch.randn(1, TEXT_LEN, 32, generator=g), torch.randn(1, TEXT_LEN, 32, generator=g)
    text[:, 9:], negative[:, 3:] = 0, 0
    reference = WanImageToVideoPipeline(None, None, vae, flow_scheduler(5.0), transformer=dit, expand_timesteps=True)
    expected = reference(
        image=noise_image(), prompt_embeds=text, negative_prompt_embeds=negative, latents=noise.clone(),
        width=TI2V_SIZE[0], height=TI2V_SIZE[1], num_frames=9, num_inference_steps=TI2V_STEPS,
        guidance_scale=TI2V_GUIDANCE, output_type="latent", return_dict=False,
    )[0]  # fmt: skip
    ours = load_wan22_dit(write_diffusers(dit, tmp_path_factory.mktemp("ti2v")), device="cpu", dtype=torch.float32)
    pipe = Wan22Pipeline([ours], None, WanVideoVAE(vae, description="tiny"), release("ti2v-5b", "tiny"))
    return pipe, (noise, text, negative), expected


def ti2v_denoise(pipe, loop_inputs):
    noise, text, negative = loop_inputs
    condition = pipe.encode_image(image_pixels(noise_image(), *TI2V_SIZE))
    latents, _ = pipe.denoise(noise.clone(), text, negative, steps=TI2V_STEPS, guidance=(TI2V_GUIDANCE,) * 2,
                              condition=condition)  # fmt: skip
    return latents, condition


@pytest.mark.numerics
def test_the_text_image_loop_matches_diffusers_image_to_video_pipeline_latents(ti2v_case):
    pipe, loop_inputs, expected = ti2v_case
    calls = []
    hook = pipe.experts[0].register_forward_pre_hook(lambda module, args: calls.append(tuple(args[1].shape)))
    ours, condition = ti2v_denoise(pipe, loop_inputs)
    hook.remove()
    assert calls == [(2, 12)] * TI2V_STEPS  # CFG batched, a timestep per token (3 frames of 2 x 2)
    assert torch.equal(condition, expected[:, :, :1]) and torch.equal(ours[:, :, :1], condition)
    error = relative_error(ours, expected)
    print(f"Wan 2.2 TI2V loop against WanImageToVideoPipeline, {TI2V_STEPS} steps: max rel {error:.2e}")
    assert error <= BOUND


def _one_frame_late(t, batch, latent_grid, patch_size):
    tokens = first_frame_timesteps(t, batch, latent_grid, patch_size)
    return tokens.roll(tokens.shape[1] // latent_grid[0], dims=1)  # frame 1's tokens at 0 instead of frame 0's


def _sample_t_everywhere(t, batch, latent_grid, patch_size):
    return first_frame_timesteps(t, batch, latent_grid, patch_size).fill_(float(t))


@pytest.mark.numerics
@pytest.mark.parametrize("wrong", [_one_frame_late, _sample_t_everywhere], ids=["frame-shifted", "scalar-t"])
def test_misplaced_image_timesteps_land_far_above_the_bound(ti2v_case, monkeypatch, wrong):
    pipe, loop_inputs, expected = ti2v_case
    monkeypatch.setattr(pipeline_module, "first_frame_timesteps", wrong)
    error = relative_error(ti2v_denoise(pipe, loop_inputs)[0], expected)
    print(f"negative control ({wrong.__name__}): max rel {error:.2e}")
    assert error > 100 * BOUND


def test_a_ti2v_call_with_an_image_holds_its_first_latent_frame():
    pipe = build_wan22_pipeline(variant="ti2v-5b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    video = pipe("a kite", image=noise_image(), seed=2, num_frames=5)
    width, height = pipe.release.size
    condition = pipe.encode_image(image_pixels(noise_image(), width, height))
    assert video.frames.shape == (5, height, width, 3) and "image_encode_s" in video.timings
    assert torch.equal(video.latents[:, :, :1], condition)  # the image's latent frame, copied in after the loop
    other = pipe("a kite", image=noise_image(48, 80), seed=2, num_frames=5)
    assert not torch.equal(other.latents[:, :, 1:], video.latents[:, :, 1:])  # the image steers the other frames
    assert not torch.equal(pipe("a kite", seed=2, num_frames=5).latents, video.latents)  # text only differs


def test_an_image_is_refused_for_t2v_a14b_and_a_bad_image_by_what_is_wrong():
    a14b = build_wan22_pipeline(variant="t2v-a14b", config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    with pytest.raises(ValueError, match=r"Wan 2.2 t2v-a14b is text-to-video only: an image conditions TI2V-5B"):
        a14b("a kite", image=noise_image())
    with pytest.raises(ValueError, match="the image must be a PIL image, got ndarray"):
        image_pixels(np.zeros((4, 4, 3), np.uint8), 64, 64)
    with pytest.raises(ValueError, match="image mode 'CMYK' is not supported"):
        image_pixels(Image.new("CMYK", (8, 8)), 64, 64)
    pixels = image_pixels(Image.new("RGBA", (8, 8), (255, 0, 0, 7)), 32, 16)  # alpha dropped, as load_image does
    assert pixels.shape == (3, 16, 32) and torch.equal(pixels[:, 0, 0], torch.tensor([1.0, -1.0, -1.0]))


@pytest.mark.parametrize("variant", ["t2v-a14b", "ti2v-5b"])
def test_a_tiny_random_pipeline_makes_a_video_and_cancels_between_steps(variant):
    pipe = build_wan22_pipeline(variant=variant, config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    assert pipe.weights["dit"] == "random (no checkpoint)" and "random" in pipe.weights["vae"]
    progress = []
    video = pipe("a red fox in the snow", seed=5, hooks=StepHooks(progress=lambda d, t: progress.append((d, t))))
    info = release(variant, "tiny")
    assert video.frames.shape == (info.frames, info.size[1], info.size[0], 3) and video.frames.dtype.name == "uint8"
    assert progress == [(i + 1, info.steps) for i in range(info.steps)] and video.fps == info.fps
    assert torch.equal(pipe("a red fox in the snow", seed=5).latents, video.latents)  # seeded: the same clip
    assert not torch.equal(pipe("a red fox in the snow", seed=6).latents, video.latents)
    asked = []
    with pytest.raises(GenerationCancelled) as stopped:
        pipe("a red fox", seed=5, hooks=StepHooks(cancelled=lambda: len(asked.append(1) or asked) > 2))
    assert stopped.value.steps_done == 2
    with pytest.raises(ValueError, match="num_frames must be 4n \\+ 1"):
        pipe("a red fox", num_frames=8)


def load_example():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "wan2_2" / "run_t2v.py"
    module_spec = importlib.util.spec_from_file_location("run_t2v", path)
    example = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(example)
    return example


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--size", "7x7"], "--size 7x7: wan2.2-t2v-a14b needs width and height that are positive multiples of 16"),
        (["--size", "abc"], "--size must be WIDTHxHEIGHT such as 1280x720, got 'abc'"),
        (["--num-frames", "10"], "--num-frames must be 4n + 1 (1, 5, 9, ..., 81), got 10"),
    ],
)
def test_the_example_refuses_a_bad_shape_in_one_line_before_loading(flags, message, capsys):
    example = load_example()
    with pytest.raises(SystemExit) as exited:
        example.parse_args(["--config", "tiny", *flags])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert example.parse_args(["--config", "tiny", "--size", "64x32", "--num-frames", "9"]).size == "64x32"


def test_the_example_refuses_an_image_it_cannot_use_in_one_line(tmp_path, capsys):
    example = load_example()
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    png = tmp_path / "first.png"
    noise_image().save(png)
    ti2v = ["--model", "wan2.2-ti2v-5b", "--config", "tiny", "--image"]
    for argv, message in (
        ([*ti2v, str(tmp_path / "missing.png")], f"--image {tmp_path / 'missing.png'}: no such file"),
        ([*ti2v, str(text)], f"--image {text}: not a readable image (UnidentifiedImageError: cannot identify"),
        (["--config", "tiny", "--image", str(png)], "--image: wan2.2-t2v-a14b is text-to-video only; the image "
         "condition is wan2.2-ti2v-5b's"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            example.parse_args(argv)
        error = capsys.readouterr().err.splitlines()[-1]
        assert exited.value.code == 2 and message in error, error
    args = example.parse_args([*ti2v, str(png)])
    assert args.first_frame.mode == "RGB" and args.first_frame.size == (80, 48)
    with pytest.raises(SystemExit):
        example.parse_args(["--model", "wan2.2-ti2v-5b", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare words
    assert "--image IMAGE wan2.2-ti2v-5b only: a PNG/JPEG/WebP picture to start the clip from" in help_text


def test_the_example_makes_a_clip_from_an_image(tmp_path, capsys):
    example = load_example()
    png, output = tmp_path / "first.png", tmp_path / "clip.mp4"
    noise_image().save(png)
    argv = ["--model", "wan2.2-ti2v-5b", "--config", "tiny", "--device", "cpu", "--dtype", "float32", "--steps", "2",
            "--num-frames", "5", "--image", str(png), "--output", str(output)]  # fmt: skip
    assert example.main(argv) == 0
    summary = json.loads(output.with_suffix(".json").read_text())
    assert summary["image"] == str(png) and summary["frames"] == [5, 64, 128, 3] and output.stat().st_size > 0
    assert "image_encode_s" in summary["timings"] and summary["dit_calls"] == 2


@pytest.mark.numerics
def test_vae_dtype_bfloat16_decodes_the_same_latents_within_48_db():
    """--vae-dtype bfloat16 reaches the VAE from the flags (the memory plan's decode lever) and touches nothing before
    the decode: the latents are bit-equal to the float32 VAE's. The frames agree within 48 dB PSNR. Why 48: bf16 keeps
    8 significant bits per op, and the tiny VAE's decode measured 52.7 dB against float32; the negative controls, the
    same latents scaled by 1.05 and shifted by one latent column, land at 44.9 and 16.3 dB."""
    import argparse

    from telefuser.pipelines.wan.vae import to_uint8_frames
    from telefuser.pipelines.wan2_2.loading import pipeline_from_args
    from tools.bench.lingbot_session_ab import psnr as _psnr

    runtime = Runtime.one_rank("cpu", torch.float32)
    flags = {"config": "tiny", "checkpoint": None, "attn_impl": "sdpa", "offload": "auto", "gpu_memory_gb": None}
    full = pipeline_from_args("ti2v-5b", argparse.Namespace(**flags), runtime)
    half = pipeline_from_args("ti2v-5b", argparse.Namespace(**flags, vae_dtype="bfloat16"), runtime)
    assert full.vae.dtype == torch.float32 and half.vae.dtype == torch.bfloat16
    want, got = full("a red fox", seed=1), half("a red fox", seed=1)
    assert want.frames.std() > 0 and torch.equal(got.latents, want.latents)
    assert _psnr(got.frames, want.frames) >= 48.0
    scaled = to_uint8_frames(full.vae.decode(want.latents * 1.05)).numpy()
    shifted = to_uint8_frames(full.vae.decode(torch.roll(want.latents, 1, dims=-1))).numpy()
    assert _psnr(scaled, want.frames) < 47.0 and _psnr(shifted, want.frames) < 20.0
