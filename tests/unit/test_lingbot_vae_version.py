"""The LingBot VAE streams drive diffusers' private AutoencoderKLWan internals: a diffusers that lacks them is named
at construction (not a silent break mid-stream), and one outside the tested range is warned about."""

from __future__ import annotations

import logging

import diffusers
import pytest
from diffusers.models.autoencoders import autoencoder_kl_wan

from telefuser.pipelines.wan.vae import (
    TESTED_DIFFUSERS,
    DiffusersVersionError,
    WanVideoVAE,
    check_stream_internals,
)


@pytest.fixture(scope="module")
def vae():
    return WanVideoVAE.random("tiny", seed=0)


def test_the_installed_diffusers_has_everything_and_is_in_range(vae):
    assert TESTED_DIFFUSERS == ">=0.42.1,<0.43"  # the range pyproject pins
    assert check_stream_internals(vae.model) == []


def test_a_decoder_without_the_cached_forward_is_named(vae, monkeypatch):
    def forward(self, x, feat_cache=None, feat_idx=(0,)):  # no first_chunk: an older or newer decoder
        raise AssertionError("never called")

    monkeypatch.setattr(autoencoder_kl_wan.WanDecoder3d, "forward", forward)
    monkeypatch.delattr(autoencoder_kl_wan, "WanAttentionBlock")
    with pytest.raises(
        DiffusersVersionError,
        match=r"diffusers 0\.42\.\d+ lacks what the Wan VAE streams drive: "
        r"WanDecoder3d\.forward\(first_chunk=\.\.\.\), class "
        r"WanAttentionBlock\. .*install 'diffusers>=0\.42\.1,<0\.43'",
    ):
        check_stream_internals()


def test_a_model_without_the_conv_cache_count_is_refused_at_construction(vae, monkeypatch):
    monkeypatch.delattr(vae.model, "_cached_conv_counts")
    with pytest.raises(DiffusersVersionError, match=r"AutoencoderKLWan\._cached_conv_counts"):
        WanVideoVAE(vae.model, description="test")


def test_a_version_outside_the_tested_range_is_warned_about(vae, monkeypatch, caplog):
    monkeypatch.setattr(diffusers, "__version__", "0.44.0")
    with caplog.at_level(logging.WARNING, logger="telefuser.pipelines.wan.vae"):
        warnings = check_stream_internals(vae.model)
    assert len(warnings) == 1 and "diffusers 0.44.0 is outside the range" in warnings[0]
    assert warnings[0] in caplog.text
