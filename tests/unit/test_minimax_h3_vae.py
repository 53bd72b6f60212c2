"""MiniMax H3 VAEs: diffusers' classes loaded from the release layout (our key map) and from diffusers folders.

The release files here are written from the reference model's own state dict (tests/minimax_h3_reference.py, rule
by rule under the original names), so a wrong key map, QKV split or SwiGLU half order shows up as a different
decode. Tolerance: the loaded model holds bit-identical float32 weights and runs the same diffusers code, so the
decode is literally the same computation as the reference's: compared exactly. Negative controls (a file with the
SwiGLU halves or the QKV rows in the wrong order) land at O(1) relative error.
"""

from __future__ import annotations

import json

import pytest
import torch

from telefuser.pipelines.minimax_h3.vae import PIXEL_MEAN, PIXEL_STD, AudioDecoder, VideoDecoder, split_stereo_tokens
from telefuser.pipelines.minimax_h3.vae_checkpoint import (
    VAECheckpointError,
    load_audio_vae,
    load_video_vae,
    video_vae_config_from_release,
)
from tests.minimax_h3_reference import (
    TINY_VIDEO_ARCH,
    TINY_VIDEO_DIFFUSERS,
    reference_audio_vae,
    reference_video_vae,
    write_release_audio_vae,
    write_release_video_vae,
)
from tests.numerics import relative_error


@pytest.fixture(scope="module")
def video_vae():
    return reference_video_vae(seed=3)


def _latents(frames: int = 7, h: int = 2, w: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 24, frames, h, w, generator=torch.Generator().manual_seed(seed))


def _decode(vae, z):
    with torch.no_grad():
        return vae.decode(z, return_dict=False)[0]


def test_release_video_vae_loads_through_the_key_map(video_vae, tmp_path):
    folder = write_release_video_vae(video_vae, tmp_path / "video_vae", tile=(32, 16))
    config, tiling, weights = video_vae_config_from_release(folder)
    for key, value in TINY_VIDEO_DIFFUSERS.items():
        assert config[key] == value, key
    assert weights == folder / "source" / "model.safetensors"
    assert tiling == {
        "tile_sample_min_height": 32,
        "tile_sample_min_width": 32,
        "tile_sample_min_overlap_height": 16,
        "tile_sample_min_overlap_width": 16,
    }

    loaded = load_video_vae(folder)
    assert loaded.weights_source.startswith("diffusers AutoencoderKLMiniMaxH3 from the release")
    theirs = video_vae.state_dict()
    for name, tensor in loaded.state_dict().items():  # weights read back: exact
        assert torch.equal(tensor, theirs[name]), name
    assert loaded.use_tiling and loaded.tile_sample_min_height == 32 and loaded.tile_sample_min_overlap_width == 16
    video_vae.enable_tiling(32, 32, 16, 16)
    z = _latents(h=3, w=3)  # 48 px: two overlapping 32 px tiles per axis
    assert torch.equal(_decode(loaded, z), _decode(video_vae, z))  # same weights, same code: same computation


@pytest.mark.numerics
@pytest.mark.parametrize("layout", [{"swap_ffn": False}, {"interleave_qkv": False}], ids=["ffn-halves", "qkv-order"])
def test_a_file_in_another_layout_decodes_far_off(video_vae, tmp_path, layout):
    """Negative control for the test above: the same tensors with one layout rule skipped."""
    loaded = load_video_vae(write_release_video_vae(video_vae, tmp_path / "video_vae", **layout))
    video_vae.disable_tiling(), loaded.disable_tiling()
    z = _latents()
    assert relative_error(_decode(loaded, z), _decode(video_vae, z)) > 1e-2


def test_diffusers_video_folder_loads_with_from_pretrained(video_vae, tmp_path):
    video_vae.save_pretrained(tmp_path / "vae")
    loaded = load_video_vae(tmp_path / "vae", dtype=torch.bfloat16)
    pinned = {n for n, p in loaded.named_parameters() if p.dtype == torch.float32}
    # diffusers' mixed precision: the encoder and the decoder's norms and residual scales stay float32
    assert any(n.startswith("encoder.") for n in pinned) and "decoder.norm_out.weight" in pinned
    assert loaded.decoder.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16


def test_release_video_config_refuses_what_diffusers_does_not_implement(video_vae, tmp_path):
    arch = json.loads(json.dumps(TINY_VIDEO_ARCH))
    arch["vit_decoder_kwargs"]["ffn_use_gated"] = False
    folder = write_release_video_vae(video_vae, tmp_path / "video_vae", arch=arch)
    with pytest.raises(VAECheckpointError, match="only the released variant"):
        load_video_vae(folder)
    (folder / "source" / "model.safetensors").unlink()
    with pytest.raises(VAECheckpointError, match="no video VAE weights"):
        load_video_vae(folder)


def test_release_video_vae_with_a_foreign_tensor_is_refused(video_vae, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_release_video_vae(video_vae, tmp_path / "video_vae")
    path = folder / "source" / "model.safetensors"
    state = load_file(str(path))
    state["decoder.bogus.weight"] = torch.ones(2)
    save_file(state, str(path))
    with pytest.raises(VAECheckpointError, match="decoder.bogus.weight"):
        load_video_vae(folder)


@pytest.mark.numerics
def test_video_decoder_denormalizes_and_returns_rgb_in_zero_one(video_vae):
    """Our wrapper against diffusers' decode step written out: z*std+mean, decode, x*std+mean, clamp."""
    video_vae.disable_tiling()
    z = _latents()
    mean = torch.tensor(video_vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(video_vae.config.latents_std).view(1, -1, 1, 1, 1)
    raw = _decode(video_vae, z * std + mean)
    expected = raw * torch.tensor(PIXEL_STD).view(1, -1, 1, 1, 1) + torch.tensor(PIXEL_MEAN).view(1, -1, 1, 1, 1)
    expected = expected.clamp(0, 1)
    frames = VideoDecoder(video_vae, "test")(z)
    assert frames.shape == (1, 3, 22, 32, 48) and frames.dtype == torch.float32
    assert torch.equal(frames, expected)  # the same operations in the same order
    assert 0 < expected.mean() < 1
    assert relative_error(VideoDecoder(video_vae, "test")(z * 0.5), expected) > 1e-2  # control: scale matters


@pytest.fixture(scope="module")
def audio_vae():
    return reference_audio_vae(seed=4)


def test_release_audio_vae_loads_with_its_metadata(audio_vae, tmp_path):
    folder = write_release_audio_vae(audio_vae, tmp_path / "audio_vae")
    loaded = load_audio_vae(folder)
    for key in ("encoder_dim", "encoder_rates", "latent_dim", "decoder_dim", "decoder_rates", "sampling_rate"):
        assert json.dumps(getattr(loaded.config, key)) == json.dumps(getattr(audio_vae.config, key)), key
    assert list(loaded.config.decoder_kernel_sizes) == [16, 20, 20]  # 2u for even u, derived as the reference does
    assert list(loaded.config.latents_std) == list(audio_vae.config.latents_std)
    theirs = audio_vae.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
        assert tensor.dtype == torch.float32

    tokens = torch.randn(1, 32, 2 * 3, generator=torch.Generator().manual_seed(1))
    stereo = AudioDecoder(loaded, "test")(tokens)
    mono = split_stereo_tokens(tokens)
    mean = torch.tensor(audio_vae.config.latents_mean).view(1, -1, 1)
    std = torch.tensor(audio_vae.config.latents_std).view(1, -1, 1)
    with torch.no_grad():
        expected = audio_vae.decode(mono * std + mean, return_dict=False)[0]  # diffusers' decode step
    assert stereo.shape == (1, 2, 3 * 800)
    assert torch.equal(stereo[0], expected[:, 0])  # same weights, same code
    state = loaded.state_dict()
    del state["decoder.conv_post.weight_v"]
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    with pytest.raises(VAECheckpointError, match=r"1 missing: decoder\.conv_post\.weight_v"):
        load_audio_vae(folder)


def test_diffusers_audio_folder_loads_with_from_pretrained(audio_vae, tmp_path):
    audio_vae.save_pretrained(tmp_path / "audio_vae")
    loaded = load_audio_vae(tmp_path / "audio_vae")
    assert "diffusers AutoencoderKLMiniMaxH3Audio from" in loaded.weights_source
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), audio_vae.state_dict().values()))


def test_stereo_tokens_split_left_then_right():
    tokens = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(1, 3, 8)  # 3 channels, 2 x 4 tokens
    mono = split_stereo_tokens(tokens)
    assert mono.shape == (2, 3, 4)
    assert torch.equal(mono[0], tokens[0, :, :4]) and torch.equal(mono[1], tokens[0, :, 4:])


def test_release_video_vae_in_bf16_keeps_diffusers_fp32_modules(video_vae, tmp_path):
    loaded = load_video_vae(write_release_video_vae(video_vae, tmp_path / "video_vae"), dtype=torch.bfloat16)
    dtypes = {name: p.dtype for name, p in loaded.named_parameters()}
    assert dtypes["encoder.conv_in.weight"] == dtypes["decoder.transformer_blocks.0.scale1"] == torch.float32
    assert dtypes["decoder.transformer_blocks.0.norm1.weight"] == torch.float32
    assert (
        dtypes["decoder.transformer_blocks.0.attn.to_q.weight"] == dtypes["decoder.proj_out.weight"] == torch.bfloat16
    )
    # read back exactly where kept in fp32, rounded once where cast (data movement + one rounding)
    theirs = video_vae.state_dict()
    assert torch.equal(loaded.state_dict()["encoder.conv_in.weight"], theirs["encoder.conv_in.weight"])
    q = "decoder.transformer_blocks.0.attn.to_q.weight"
    assert torch.equal(loaded.state_dict()[q], theirs[q].bfloat16())
