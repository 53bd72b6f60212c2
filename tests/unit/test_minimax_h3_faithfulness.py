"""MiniMax H3 against diffusers' implementation: the DiT against `MiniMaxH3Transformer3DModel`, and the whole tiny
T2VA pipeline (files in the release layout) against diffusers' modular MiniMax H3 pipeline on the same weights.

Everything is tiny, random and fp32 on the CPU. The reference reads the release-named DiT tensors through diffusers'
own converter, packs with diffusers' own helpers, and runs its own blocks (layout, noise, two `MiniMaxH3Scheduler`s,
denoise loop, VAE decode steps); ours loads the same files through this repository's loaders.

Tolerances (fp32, unit roundoff u = 6e-8): the two sides compute the same arithmetic along other paths (fused vs
separate QKV GEMMs, padded vs unpadded attention, the text encoder's 50 vs 51-layer models), so they agree to
rounding. DiT velocities: bound 1e-5 relative (~170 u; measured 0 to 3.2e-7, AVX-512 and portable kernels alike).
Pipeline: the DiT's rounding goes through 2 Euler steps and the VAEs, whose random weights are not contractive;
latents bound 1e-5 (measured 2e-7), decoded frames and waveforms 1e-4 relative (measured 5e-7 and 7e-6), uint8
frames within one level (a value within rounding of a .5 boundary can round either way). Negative controls, each
required to land 100x above its bound: a modality's timestep swapped (DiT: measured 2e-2 to 6e-2) and the previous
noise recipe (two generators; pipeline).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from telefuser.media import probe_media
from telefuser.models.minimax_h3 import MiniMaxH3Config, load_minimax_h3_dit
from telefuser.pipelines.minimax_h3 import build_minimax_h3_pipeline
from telefuser.pipelines.minimax_h3 import pipeline as pipeline_module
from telefuser.pipelines.minimax_h3.vae import split_stereo_tokens
from telefuser.runtime import Runtime
from tests.minimax_h3_reference import (
    TextOnlyProcessor,
    our_rows,
    reference_audio_vae,
    reference_dit_from_release,
    reference_dit_rows,
    reference_text_encoder,
    reference_video_vae,
    release_dit_tensors,
    write_release_audio_vae,
    write_release_transformer,
    write_release_video_vae,
    write_tokenizer,
)
from tests.numerics import relative_error

DIT_BOUND = 1e-5
LATENT_BOUND = 1e-5
DECODED_BOUND = 1e-4
CONFIG = MiniMaxH3Config.tiny()


@pytest.fixture(scope="module")
def dit_pair(tmp_path_factory):
    """(ours loaded from a release folder, the reference diffusers' converter built from the same tensors)."""
    tensors = release_dit_tensors(CONFIG, seed=11)
    folder = write_release_transformer(tensors, CONFIG, tmp_path_factory.mktemp("h3") / "transformer")
    ours = load_minimax_h3_dit(folder, device="cpu", dtype=torch.float32)
    return ours, reference_dit_from_release(tensors, CONFIG, "interleaved")


def _velocities(model, video, audio, text, tv, ta):
    with torch.no_grad():
        return our_rows(*model(video, audio, text, torch.tensor([tv * 1000.0]), torch.tensor([ta * 1000.0])))


@pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)
@pytest.mark.parametrize(
    "text_rows, thw, audio_t, tv, ta",
    [(5, (2, 4, 6), 3, 0.7, 0.3), (9, (7, 2, 2), 37, 0.05, 0.95), (1, (1, 6, 2), 1, 0.5, 0.5)],
    ids=["small", "t2va-clip", "single-text-row"],
)
def test_dit_matches_diffusers_transformer(dit_pair, text_rows, thw, audio_t, tv, ta):
    ours, reference = dit_pair
    g = torch.Generator().manual_seed(text_rows)
    video = torch.randn(1, CONFIG.latents_dim, *thw, generator=g)
    audio = torch.randn(1, CONFIG.audio_latents_dim, 2 * audio_t, generator=g)
    text = torch.randn(1, text_rows, CONFIG.text_dim, generator=g)
    theirs = reference_dit_rows(reference, video, audio, text, tv, ta)
    got = _velocities(ours, video, audio, text, tv, ta)
    for name, o, t in zip(("video", "audio"), got, theirs):
        assert relative_error(o, t) <= DIT_BOUND, name
    if tv != ta:  # negative control: each modality modulated with the other's timestep
        swapped = _velocities(ours, video, audio, text, ta, tv)
        assert max(relative_error(o, t) for o, t in zip(swapped, theirs)) > 100 * DIT_BOUND


# -- the whole pipeline ----------------------------------------------------------------------------------------------
PROMPT = "a red fox runs through snow at dawn"
FRAMES, SIZE, STEPS, SEED = 22, 32, 3, 7  # 22 frames = 7 latent frames, 37 audio latents per channel


@pytest.fixture(scope="module")
def release_folder(tmp_path_factory):
    """A tiny checkpoint in the release layout, every file written from a reference model (or, for the DiT, read
    by the reference through diffusers' converter). Returns (folder, the reference components)."""
    part = tmp_path_factory.mktemp("release") / "FL2VA"
    tensors = release_dit_tensors(CONFIG, seed=21)
    write_release_transformer(tensors, CONFIG, part / "transformer")
    video_vae, audio_vae = reference_video_vae(seed=22), reference_audio_vae(seed=23)
    write_release_video_vae(video_vae, part / "video_vae")
    write_release_audio_vae(audio_vae, part / "audio_vae")
    text_encoder = reference_text_encoder(CONFIG.text_dim, seed=24)
    text_encoder.save_pretrained(str(part / "text_encoder"))
    tokenizer = write_tokenizer(part / "processor")
    reference = {
        "transformer": reference_dit_from_release(tensors, CONFIG, "interleaved"),
        "vae": video_vae,
        "audio_vae": audio_vae,
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
    }
    return part.parent, reference


def _reference_run(reference):
    """diffusers' modular MiniMax H3 pipeline: text encoding, then its t2va denoise and decode blocks."""
    from diffusers import MiniMaxH3ModularPipeline, MiniMaxH3Scheduler
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.encoders import get_qwen3vl_prompt_embeds
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import (
        MiniMaxH3CoreDenoiseStep,
        MiniMaxH3DecodeStep,
    )
    from diffusers.video_processor import VideoProcessor

    token_ids = reference["tokenizer"](PROMPT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        prompt_embeds = get_qwen3vl_prompt_embeds(
            reference["text_encoder"],
            TextOnlyProcessor(),
            token_ids,
            {},
            text_encoder_layer=50,
            device=torch.device("cpu"),
            dtype=torch.float32,
        )
    blocks = SequentialPipelineBlocks.from_blocks_dict(
        {"denoise": MiniMaxH3CoreDenoiseStep(), "decode": MiniMaxH3DecodeStep()}
    )
    pipe = blocks.init_pipeline()
    pipe.update_components(
        transformer=reference["transformer"],
        vae=reference["vae"],
        audio_vae=reference["audio_vae"],
        scheduler=MiniMaxH3Scheduler(shift=12.0),
        audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
        video_processor=VideoProcessor(vae_scale_factor=16, do_normalize=False),
    )
    with pytest.MonkeyPatch.context() as patch:
        # The product floor of 5 s would make CI decode 331k audio samples twice; the geometry code is the same.
        patch.setattr(MiniMaxH3ModularPipeline, "min_duration", property(lambda self: 0.9))
        out = pipe(
            prompt_embeds=prompt_embeds,
            text_token_tags=torch.ones(len(token_ids), dtype=torch.long),
            height=SIZE,
            width=SIZE,
            num_frames=FRAMES,
            num_inference_steps=STEPS,
            generator=torch.Generator().manual_seed(SEED),
            output_type="pt",
            output=["latents", "audio_latents", "videos", "audio"],
        )
    return prompt_embeds, out


def _run(pipe):
    return pipe(PROMPT, duration=FRAMES / 24, resolution=SIZE, aspect_ratio="1:1", steps=STEPS, seed=SEED)


@pytest.fixture(scope="module")
def runs(release_folder):
    """(our pipeline, our result, the reference's prompt embeddings, the reference's outputs)."""
    folder, reference = release_folder
    prompt_embeds, theirs = _reference_run(reference)
    pipe = build_minimax_h3_pipeline(
        checkpoint=folder, runtime=Runtime.one_rank("cpu", torch.float32), show_progress=False
    )
    return pipe, _run(pipe), prompt_embeds, theirs


@pytest.mark.numerics
def test_t2va_pipeline_matches_diffusers_modular_pipeline(runs):
    pipe, result, prompt_embeds, theirs = runs
    assert result.frames.shape == (FRAMES, SIZE, SIZE, 3) and result.audio.shape == (2, 37 * 800)
    assert "release" in result.weights["video_vae"] and "release" in result.weights["audio_vae"]

    text = pipe.prompt_encoder(PROMPT, torch.device("cpu"))
    assert relative_error(text, prompt_embeds) <= LATENT_BOUND
    assert relative_error(result.video_latents, theirs["latents"]) <= LATENT_BOUND
    assert relative_error(split_stereo_tokens(result.audio_latents), theirs["audio_latents"]) <= LATENT_BOUND

    ref_frames = theirs["videos"][0].permute(0, 2, 3, 1)  # [F, H, W, C] in [0, 1]
    ours_float = pipe.video_decoder(result.video_latents)[0].permute(1, 2, 3, 0)
    assert relative_error(ours_float, ref_frames) <= DECODED_BOUND
    assert (result.frames.int() - (ref_frames * 255).round().int()).abs().max() <= 1
    assert relative_error(result.audio, theirs["audio"][0]) <= DECODED_BOUND


class _Silence(torch.nn.Module):
    """A decoder that costs nothing: the negative control below only needs the latents."""

    def __init__(self, shape_of):
        super().__init__()
        self.shape_of = shape_of

    def forward(self, latents):
        return torch.zeros(self.shape_of(latents))


@pytest.mark.numerics
def test_the_previous_noise_recipe_is_far_from_diffusers(runs, monkeypatch):
    """Negative control: video and audio drawn from two generators seeded alike (this repository's earlier rule)."""
    pipe, _, _, theirs = runs

    def two_generators(shape, seed, device):
        video = torch.randn(shape.video_latent_shape, generator=torch.Generator().manual_seed(seed))
        rows = torch.randn(shape.audio_tokens, 32, generator=torch.Generator().manual_seed(seed))
        return video.to(device), rows.t().unsqueeze(0).contiguous().to(device)

    monkeypatch.setattr(pipeline_module, "initial_noise", two_generators)
    monkeypatch.setattr(pipe, "video_decoder", _Silence(lambda z: (1, 3, FRAMES, SIZE, SIZE)))
    monkeypatch.setattr(pipe, "audio_decoder", _Silence(lambda z: (1, 2, z.shape[-1] // 2 * 800)))
    result = _run(pipe)
    assert relative_error(split_stereo_tokens(result.audio_latents), theirs["audio_latents"]) > 100 * LATENT_BOUND


def test_example_cli_decodes_a_release_folder_without_any_flag(release_folder, tmp_path):
    """run_t2va.py on the release layout: diffusers' VAEs from video_vae/source and audio_vae, no stand-in flag."""
    folder, _ = release_folder
    out = tmp_path / "h3.mp4"
    repo = Path(__file__).resolve().parents[2]
    cmd = [
        sys.executable, str(repo / "examples/minimax_h3/run_t2va.py"), "--checkpoint", str(folder), "--device", "cpu",
        "--dtype", "float32", "--duration", "0.9", "--resolution", "32", "--aspect-ratio", "1:1", "--steps", "3",
        "--no-progress", "--prompt", PROMPT, "--output", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=repo)
    assert done.returncode == 0, done.stderr[-2000:]
    weights = json.loads(out.with_suffix(".json").read_text())["weights"]
    assert "AutoencoderKLMiniMaxH3 from the release" in weights["video_vae"]
    assert "AutoencoderKLMiniMaxH3Audio from the release" in weights["audio_vae"]
    info = probe_media(out)
    assert info.video_frames == FRAMES and info.has_audio and info.channels == 2
