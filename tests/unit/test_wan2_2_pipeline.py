"""Wan 2.2's denoise loop against diffusers' `WanPipeline` (two experts switched at the boundary, CFG), and the whole
text-to-video call on tiny random weights.

Tolerance of the loop: the same fp32 DiT difference as one forward (tests/unit/test_wan2_2_model.py, 1024 fp32 unit
roundoffs) carried through four UniPC steps, each a linear combination of the latents and the guided predictions
with coefficients of order one, then guided (x4 at most): measured 3e-6, bound 4 x 1024 unit roundoffs. Running the
experts in the wrong order (the negative control) must land 100x above it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import WanPipeline

from telefuser.models.wan2_2.checkpoint import load_wan22_dit
from telefuser.models.wan2_2.config import release
from telefuser.pipelines.hooks import GenerationCancelled, StepHooks
from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline
from telefuser.pipelines.wan2_2.pipeline import Wan22Pipeline, flow_scheduler
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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--size", "7x7"], "--size 7x7: wan2.2-t2v-a14b needs width and height that are positive multiples of 16"),
        (["--size", "abc"], "--size must be WIDTHxHEIGHT such as 1280x720, got 'abc'"),
        (["--num-frames", "10"], "--num-frames must be 4n + 1 (1, 5, 9, ..., 81), got 10"),
    ],
)
def test_the_example_refuses_a_bad_shape_in_one_line_before_loading(flags, message, capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "wan2_2" / "run_t2v.py"
    module_spec = importlib.util.spec_from_file_location("run_t2v", path)
    example = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(example)
    with pytest.raises(SystemExit) as exited:
        example.parse_args(["--config", "tiny", *flags])
    assert exited.value.code == 2 and message in capsys.readouterr().err
    assert example.parse_args(["--config", "tiny", "--size", "64x32", "--num-frames", "9"]).size == "64x32"
