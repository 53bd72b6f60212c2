"""MiniMax H3 T2VA pipeline on CPU with a stub DiT and tiny random diffusers VAEs: shapes, noise, loop, MP4, metrics."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from telefuser.feature_cache import AdaTaylorCache, AdaTaylorParams, params_path
from telefuser.media import probe_media, write_mp4
from telefuser.pipelines.hooks import GenerationCancelled, StepHooks
from telefuser.pipelines.minimax_h3 import MiniMaxH3Pipeline, plan_shape
from telefuser.pipelines.minimax_h3.loading import resolve_partition
from telefuser.pipelines.minimax_h3.pipeline import initial_noise, to_uint8_frames
from telefuser.pipelines.minimax_h3.shapes import (
    align_frame_count,
    canvas_for,
    frame_count_from_latent_t,
    video_latent_t,
)
from telefuser.pipelines.minimax_h3.text_encoder import MiniMaxH3TextEncoder, Qwen3VLPromptEncoder, tiny_text_config
from telefuser.pipelines.minimax_h3.tokenizer import ByteFallbackTokenizer, load_tokenizer
from telefuser.pipelines.minimax_h3.vae import AudioDecoder, VideoDecoder, random_audio_vae, random_video_vae

REPO = Path(__file__).resolve().parents[2]
TEXT_DIM = 32


class StubDiT(nn.Module):
    """A tiny deterministic stand-in with the real DiT's call signature and block-hook contract.

    Rows are packed [video | text | audio] with tags 0 / 1 / 2; `run_blocks` is a fixed residual MLP stack.
    """

    def __init__(self, text_dim: int = TEXT_DIM, width: int = 16, blocks: int = 3) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        self.video_in = nn.Parameter(torch.randn(24, width, generator=g) / 24**0.5, requires_grad=False)
        self.audio_in = nn.Parameter(torch.randn(32, width, generator=g) / 32**0.5, requires_grad=False)
        self.text_in = nn.Parameter(torch.randn(text_dim, width, generator=g) / text_dim**0.5, requires_grad=False)
        self.blocks = nn.Parameter(torch.randn(blocks, width, width, generator=g) / width**0.5, requires_grad=False)
        self.video_out = nn.Parameter(torch.randn(width, 24, generator=g) / width**0.5, requires_grad=False)
        self.audio_out = nn.Parameter(torch.randn(width, 32, generator=g) / width**0.5, requires_grad=False)
        self.calls: list[tuple[float, float]] = []
        self.block_runs = 0

    def run_blocks(self, hidden: torch.Tensor) -> torch.Tensor:
        self.block_runs += 1
        for weight in self.blocks:
            hidden = hidden + 0.5 * torch.tanh(hidden @ weight)
        return hidden

    def forward(self, video, audio, text, t_video, t_audio, *, block_hook=None):
        self.calls.append((float(t_video[0]), float(t_audio[0])))
        b, c, t, h, w = video.shape
        video_rows = video.permute(0, 2, 3, 4, 1).reshape(b, t * h * w, c) @ self.video_in
        audio_rows = audio.transpose(1, 2) @ self.audio_in
        text_rows = text.float() @ self.text_in
        video_rows = video_rows + torch.sin(t_video / 1000.0)[:, None, None]
        audio_rows = audio_rows + torch.sin(t_audio / 1000.0)[:, None, None]
        hidden = torch.cat([video_rows, text_rows, audio_rows], dim=1)
        tags = torch.cat(
            [torch.zeros(video_rows.shape[1]), torch.ones(text_rows.shape[1]), torch.full((audio_rows.shape[1],), 2)]
        ).long()
        hidden = block_hook(hidden, self.run_blocks, tags) if block_hook is not None else self.run_blocks(hidden)
        nv, nt = video_rows.shape[1], text_rows.shape[1]
        v_video = (hidden[:, :nv] @ self.video_out).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
        v_audio = (hidden[:, nv + nt :] @ self.audio_out).transpose(1, 2)
        return v_video.float().contiguous(), v_audio.float().contiguous()


_VAES = {}


def _decoders():
    """Tiny random diffusers VAEs, built once per test session (seeded: identical every time)."""
    if not _VAES:
        _VAES["video"] = VideoDecoder(random_video_vae("tiny", seed=0), "tiny random video VAE")
        _VAES["audio"] = AudioDecoder(random_audio_vae("tiny", seed=0), "tiny random audio VAE")
    return _VAES["video"], _VAES["audio"]


class Silence(nn.Module):
    """A decoder that costs nothing, for tests about the loop rather than the pixels: zeros of the right shape."""

    def __init__(self, shape_of) -> None:
        super().__init__()
        self.shape_of = shape_of

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self.shape_of(latents))


def _silent_video(z):
    return (z.shape[0], 3, frame_count_from_latent_t(z.shape[2]), 16 * z.shape[3], 16 * z.shape[4])


def _silent_audio(z):
    return (z.shape[0], 2, z.shape[2] // 2 * 800)


def make_pipeline(dit: StubDiT | None = None, *, decode: bool = True) -> MiniMaxH3Pipeline:
    encoder = MiniMaxH3TextEncoder.random(tiny_text_config(hidden_size=TEXT_DIM), num_layers=2, seed=0)
    video, audio = _decoders() if decode else (Silence(_silent_video), Silence(_silent_audio))
    return MiniMaxH3Pipeline(
        dit or StubDiT(), Qwen3VLPromptEncoder(load_tokenizer(None), encoder), video, audio, show_progress=False
    )


# ---- request -> shapes -------------------------------------------------------------------------------------------


def test_frame_and_latent_arithmetic_follows_17n_plus_5():
    # at least 22 frames (7 latent frames): diffusers' video VAE decodes no chunk from the 2-latent 5-frame head
    assert [align_frame_count(f) for f in (1, 5, 6, 22, 23, 120)] == [22, 22, 22, 22, 39, 124]
    assert video_latent_t(124) == 37 and frame_count_from_latent_t(37) == 124
    assert video_latent_t(5) == 2 and frame_count_from_latent_t(2) == 5
    with pytest.raises(ValueError):
        video_latent_t(6)


def test_official_five_second_request_shapes():
    shape = plan_shape(duration_s=5.0, resolution=768, aspect_ratio="16:9")
    assert (shape.height, shape.width) == (768, 1344)
    assert shape.frame_count == 124 and shape.video_latent_t == 37
    assert (shape.latent_h, shape.latent_w) == (48, 84)
    assert shape.audio_latent_t == round(124 / 24 * 40) == 207  # 40 Hz over the aligned duration
    assert shape.audio_tokens == 414 and shape.audio_samples == 207 * 800
    assert canvas_for(768, "9:16", 32) == (1344, 768) and canvas_for(768, "1:1", 32) == (768, 768)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(duration_s=0.0), "positive"),
        (dict(duration_s=-1.0), "positive"),
        (dict(duration_s=1.0, resolution=40), "multiple of 32"),
        (dict(duration_s=1.0, resolution="100x64"), "divisible by 32"),
        (dict(duration_s=1.0, aspect_ratio="5:4"), "aspect ratio"),
        (dict(duration_s=1.0, aspect_ratio="auto"), "aspect ratio"),
    ],
)
def test_bad_requests_raise_clear_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_shape(**kwargs)


def test_pipeline_rejects_too_few_steps_and_empty_prompt():
    pipe = make_pipeline(decode=False)
    with pytest.raises(ValueError, match="steps"):
        pipe("a prompt", duration=0.9, resolution=32, aspect_ratio="1:1", steps=1)
    with pytest.raises(ValueError, match="prompt"):
        pipe("  ", duration=0.9, resolution=32, aspect_ratio="1:1", steps=3)


# ---- components --------------------------------------------------------------------------------------------------


def test_noise_is_drawn_like_diffusers_from_one_generator():
    shape = plan_shape(duration_s=0.9, resolution=32, aspect_ratio="1:1")
    video, audio = initial_noise(shape, seed=7, device=torch.device("cpu"))
    video2, audio2 = initial_noise(shape, seed=7, device=torch.device("cpu"))
    assert torch.equal(video, video2) and torch.equal(audio, audio2)
    # diffusers' MiniMaxH3PrepareLatentsStep: the video latent, then the audio rows [2 * Ta, 32], one generator
    generator = torch.Generator().manual_seed(7)
    assert torch.equal(video, torch.randn(shape.video_latent_shape, generator=generator))
    assert torch.equal(audio[0].t(), torch.randn(shape.audio_tokens, 32, generator=generator))
    assert video.shape == shape.video_latent_shape and audio.shape == shape.audio_latent_shape


def test_frames_round_like_diffusers():
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, -0.2, 0.501 / 255, 1.499 / 255])
    pixels = values.view(1, 1, 1, 1, 7).expand(1, 3, 1, 1, 7)
    frames = to_uint8_frames(pixels)[0, 0, 0, :, 0]
    assert frames.tolist() == [0, 128, 255, 255, 0, 1, 1]  # (x * 255).round() of the clamped value


def test_text_encoder_loads_only_the_first_layers_of_a_qwen3_vl_checkpoint(tmp_path):
    from safetensors.torch import save_file
    from transformers import Qwen3VLConfig

    text_config = tiny_text_config(hidden_size=TEXT_DIM, num_layers=3)
    full = MiniMaxH3TextEncoder.random(text_config, num_layers=3, seed=3)
    state = {f"model.language_model.{k}": v.clone() for k, v in full.model.state_dict().items()}
    state["model.language_model.norm.weight"] = torch.ones(TEXT_DIM)
    state["lm_head.weight"] = torch.zeros(4, TEXT_DIM)
    state["model.visual.patch_embed.proj.weight"] = torch.zeros(2)
    folder = tmp_path / "text_encoder"
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"))
    Qwen3VLConfig(text_config=text_config.to_dict()).save_pretrained(str(folder))

    trimmed = MiniMaxH3TextEncoder.from_checkpoint(folder, num_layers=2, dtype=torch.float32)
    assert len(trimmed.model.layers) == 2 and isinstance(trimmed.model.norm, nn.Identity)
    ids = torch.tensor([[5, 9, 42, 7]])
    # Reference: the same weights with only two layers and no final norm.
    expected = MiniMaxH3TextEncoder.random(text_config, num_layers=2, seed=0)
    expected.model.load_state_dict(
        {k: v for k, v in full.model.state_dict().items() if not k.startswith("layers.2.")}, strict=True
    )
    torch.testing.assert_close(trimmed(ids), expected(ids))


def test_byte_fallback_tokenizer_is_deterministic_and_says_what_it_is():
    tok = ByteFallbackTokenizer()
    assert tok.encode("ab") == [ord("a") + 3, ord("b") + 3]
    assert "fallback" in tok.description and tok.vocab_size == 259
    assert resolve_partition  # imported for the next test's layout helper


def test_checkpoint_layout_is_resolved_or_refused(tmp_path):
    (tmp_path / "FL2VA" / "transformer").mkdir(parents=True)
    assert resolve_partition(tmp_path) == tmp_path / "FL2VA"
    assert resolve_partition(tmp_path / "FL2VA") == tmp_path / "FL2VA"
    with pytest.raises(FileNotFoundError):
        resolve_partition(tmp_path / "nothing")


# ---- end to end --------------------------------------------------------------------------------------------------


def test_three_step_run_writes_an_mp4_with_video_and_stereo_audio(tmp_path):
    dit = StubDiT()
    pipe = make_pipeline(dit)
    result = pipe("a red fox runs through snow", duration=0.9, resolution=32, aspect_ratio="16:9", steps=3, seed=0)
    shape = result.shape
    assert (shape.height, shape.width, shape.frame_count, shape.video_latent_t) == (32, 64, 22, 7)
    assert len(dit.calls) == 2 and dit.block_runs == 2  # 3 sigma points -> 2 DiT calls
    assert dit.calls[0] == (0.0, 0.0)  # t = 1000 * (1 - sigma), sigma starts at 1
    assert result.frames.shape == (22, 32, 64, 3) and result.frames.dtype == torch.uint8
    assert result.audio.shape == (2, shape.audio_latent_t * 800)
    assert (result.dit_calls_computed, result.dit_calls_skipped) == (2, 0)

    again = make_pipeline()("a red fox runs through snow", duration=0.9, resolution=32, aspect_ratio="16:9", steps=3)
    assert torch.equal(again.frames, result.frames) and torch.equal(again.audio, result.audio)

    path = write_mp4(tmp_path / "clip.mp4", result.frames.numpy(), result.fps, result.audio.numpy(), result.sample_rate)
    info = probe_media(path)
    assert info.video_frames == 22 and info.fps == 24 and (info.width, info.height) == (64, 32)
    assert info.has_audio and info.sample_rate == 32_000 and info.channels == 2

    metrics = result.metrics()
    json.dumps(metrics)
    timings = metrics["timings"]
    assert len(timings["dit_step_s"]) == 2 and timings["pipeline_s"] >= timings["dit_total_s"] > 0
    for key in ("text_encode_s", "vae_decode_s", "video_decode_s", "audio_decode_s"):
        assert timings[key] >= 0
    assert metrics["peak_memory"]["bytes"] > 0 and metrics["peak_memory"]["kind"] == "process_peak_rss"
    assert metrics["dit_calls"] == {"computed": 2, "skipped": 0}
    assert metrics["request"]["steps"] == 3 and metrics["request"]["dit_calls"] == 2
    assert "fallback" in metrics["weights"]["tokenizer"]


def test_feature_cache_skips_dit_block_runs_and_is_reported():
    dit = StubDiT()
    result = make_pipeline(dit, decode=False)(
        "waves", duration=0.9, resolution=32, aspect_ratio="1:1", steps=12, feature_cache="ada_taylor"
    )
    assert len(dit.calls) == 11
    assert result.dit_calls_computed == dit.block_runs
    assert result.dit_calls_computed + result.dit_calls_skipped == 11
    assert result.metrics()["request"]["feature_cache"] == "AdaTaylorCache"


def test_placeholder_cache_parameters_with_real_weights_are_warned_about(caplog):
    params = AdaTaylorParams.load(params_path("minimax_h3"))
    assert params.is_placeholder  # the bundled file says so in its _provenance
    dit = StubDiT()
    pipe = make_pipeline(dit, decode=False)
    request = dict(duration=0.9, resolution=32, aspect_ratio="1:1", steps=3)
    with caplog.at_level(logging.WARNING, logger="telefuser.pipelines.minimax_h3.pipeline"):
        pipe("waves", feature_cache="ada_taylor", **request)  # a stub: no checkpoint weights, no warning
        assert "PLACEHOLDER" not in caplog.text
        dit.weights_source = "checkpoint /models/MiniMax-H3/FL2VA/transformer"
        pipe("waves", feature_cache="ada_taylor", **request)
        assert "PLACEHOLDER" in caplog.text and "/models/MiniMax-H3" in caplog.text
        caplog.clear()
        pipe("waves", feature_cache=AdaTaylorCache(params, 2), **request)  # a hook built from the same file
        assert "PLACEHOLDER" in caplog.text
        caplog.clear()
        calibrated = AdaTaylorParams(mag_ratios=params.mag_ratios, notes={"_provenance": "run_t2va.py, FL2VA"})
        pipe("waves", feature_cache=AdaTaylorCache(calibrated, 2), **request)
        assert "PLACEHOLDER" not in caplog.text


def test_example_cli_runs_the_tiny_config_with_the_real_dit(tmp_path):
    out = tmp_path / "t2va.mp4"
    cmd = [
        sys.executable,
        str(REPO / "examples/minimax_h3/run_t2va.py"),
        "--config",
        "tiny",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--duration",
        "0.9",
        "--resolution",
        "32",
        "--steps",
        "3",
        "--output",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "random weights" in done.stdout
    info = probe_media(out)
    assert info.video_frames == 22 and info.has_audio and info.sample_rate == 32_000 and info.channels == 2
    metrics = json.loads(out.with_suffix(".json").read_text())
    assert metrics["dit_calls"]["computed"] == 2
    assert (metrics["launch"]["attn_impl"], metrics["launch"]["attn_impl_requested"]) == ("sdpa", "auto")


def test_every_request_resets_the_dits_ulysses_transport_first():
    class ResetCountingDiT(StubDiT):
        resets = 0

        def reset_parallel(self):
            type(self).resets += 1
            return False

    pipe = make_pipeline(ResetCountingDiT(), decode=False)
    for expected in (1, 2):
        pipe("a fox", duration=0.5, resolution=64, steps=2, seed=0)
        assert ResetCountingDiT.resets == expected
    with pytest.raises(ValueError, match="steps"):
        pipe("a fox", duration=0.5, resolution=64, steps=1)  # refused before the collective: no reset
    assert ResetCountingDiT.resets == 2


def test_hooks_report_every_dit_call_and_cancelled_stops_before_the_next():
    pipe = make_pipeline(decode=False)
    seen = []
    hooks = StepHooks(progress=lambda done, total: seen.append((done, total)))
    pipe("a fox", duration=0.5, resolution=64, steps=4, seed=0, hooks=hooks)
    assert seen == [(1, 3), (2, 3), (3, 3)]
    dit = StubDiT()
    pipe = make_pipeline(dit, decode=False)
    with pytest.raises(GenerationCancelled, match="after 2 DiT calls") as stopped:
        pipe(
            "a fox",
            duration=0.5,
            resolution=64,
            steps=4,
            seed=0,
            hooks=StepHooks(progress=lambda done, total: seen.append(done), cancelled=lambda: len(dit.calls) >= 2),
        )
    assert stopped.value.steps_done == 2 and len(dit.calls) == 2
