"""tools/bench/lingbot_session_ab.py on CPU with the tiny model: every variant runs, the reuse path is bit-identical
to the recomputing one, and the bf16 VAE and FP8 reports are filled in."""

from __future__ import annotations

import json
import os

import pytest

from tests.tool_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("tools/bench/lingbot_session_ab.py")


@pytest.mark.skipif(
    os.environ.get("ATEN_CPU_CAPABILITY") == "default",
    reason="the fast-VAE variants compile on the CPU, and Inductor's CPU code generator still emits at::vec code, "
    "which does not compile under ATEN_CPU_CAPABILITY=default (torch 2.13; as test_lingbot_vae_fusion)",
)
def test_variants_side_by_side_on_the_tiny_model(bench, tmp_path, capsys):
    out = tmp_path / "ab.json"
    rc = bench.main(
        [
            "--config",
            "tiny",
            "--device",
            "cpu",
            "--resolution",
            "32x32",
            "--num-frames",
            "29",
            "--rounds",
            "1",
            "--no-warmup",
            "--output",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0, printed
    report = json.loads(out.read_text())
    on_the_cpu = [v for v in bench.VARIANTS if "fp8-attn" not in v and "sage" not in v and not v.endswith(bench.GRAPHS)]
    assert list(report["variants"]) == bench.default_variants() == on_the_cpu
    assert report["variants"]["reuse"]["same_latents_and_frames_as_first_variant"] is True
    assert report["variants"]["recompute"]["same_latents_and_frames_as_first_variant"] is None
    assert report["vae_bf16_quality"]["decode_psnr_db"] > 30
    assert report["vae_fast_quality"]["decode_psnr_db"] > 30
    # the fast VAE is the baseline of its own group; FP8 with the bf16 VAE is compared by the gate, not bitwise
    assert report["variants"]["reuse+fast-vae"]["same_latents_and_frames_as_first_variant"] is None
    assert report["variants"]["fp8+bf16-vae"]["same_latents_and_frames_as_first_variant"] is None
    assert 0 < report["fp8_quality"]["latents_relative_l2"] < 0.5 and report["fp8_quality"]["latents_cosine"] > 0.9
    assert "| reuse | " in printed and "fp8 against bf16 over a session" in printed


def test_an_unknown_variant_is_refused(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "reuse,turbo"])
