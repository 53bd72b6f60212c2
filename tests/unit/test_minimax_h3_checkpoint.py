"""Loading MiniMax H3 transformer checkpoints whose files come from the reference (diffusers), not from our loader.

* release layout: random tensors under the released names, written as ``transformer/`` (config.json, 2 shards,
  index); diffusers' own converter (``qkv_layout="interleaved"``, the released shards) turns the same tensors into
  the reference ``MiniMaxH3Transformer3DModel``;
* diffusers layout: the reference model's ``save_pretrained``;
* a stacked single-file re-export: the reference's own to_q/to_k/to_v stacked, which is how diffusers reads such a
  file.

Outputs are compared with the reference's on diffusers' packing (tests/minimax_h3_reference.py). Tolerance, fp32 on
CPU: both compute the same arithmetic but along other paths (one fused QKV GEMM vs three, padding to 64 rows as a
separate attention document, fused norm+modulation), so results agree to rounding: measured 0 to 3.2e-7 relative on
AVX-512 and portable kernels; bound 1e-5 (~170 unit roundoffs over 2 blocks + refiner with K <= 256 sums). A misread
QKV order (the negative control) must land 100x above the bound.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from telefuser.models.minimax_h3 import (
    FP32_PARAMETER_NAMES,
    RANDOM_WEIGHTS,
    CheckpointError,
    MiniMaxH3Config,
    build_random_minimax_h3_dit,
    load_minimax_h3_dit,
)
from tests.minimax_h3_reference import (
    our_rows,
    reference_dit_from_release,
    reference_dit_rows,
    release_dit_tensors,
    stacked_release_qkv,
    write_release_transformer,
)
from tests.numerics import relative_error

pytestmark = pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)

MAX_RELATIVE_ERROR = 1e-5
CONFIG = MiniMaxH3Config.tiny()


@pytest.fixture(scope="module")
def release():
    """(release-named tensors, the reference model diffusers' converter builds from them)."""
    tensors = release_dit_tensors(CONFIG, seed=5)
    return tensors, reference_dit_from_release(tensors, CONFIG, "interleaved")


def _inputs():
    g = torch.Generator().manual_seed(3)
    video = torch.randn(1, CONFIG.latents_dim, 2, 4, 6, generator=g)
    audio = torch.randn(1, CONFIG.audio_latents_dim, 6, generator=g)
    text = torch.randn(1, 5, CONFIG.text_dim, generator=g)
    return video, audio, text, 0.7, 0.3


def _error_against(reference, model) -> float:
    video, audio, text, tv, ta = _inputs()
    with torch.no_grad():
        ours = our_rows(*model(video, audio, text, torch.tensor([tv * 1000]), torch.tensor([ta * 1000])))
    theirs = reference_dit_rows(reference, video, audio, text, tv, ta)
    return max(relative_error(o, t) for o, t in zip(ours, theirs))


def test_released_shards_load_like_diffusers_reads_them(release, tmp_path):
    tensors, reference = release
    write_release_transformer(tensors, CONFIG, tmp_path / "transformer")
    for path in (tmp_path, tmp_path / "transformer"):  # the partition folder and the transformer folder both load
        model = load_minimax_h3_dit(path, device="cpu", dtype=torch.float32)
        assert model.weights_source.startswith("checkpoint")
        assert "interleaved" in model.checkpoint_layout and "release layout" in model.checkpoint_layout
        assert _error_against(reference, model) <= MAX_RELATIVE_ERROR


def test_the_other_qkv_order_is_far_off(release, tmp_path):
    """Negative control: the same files read as a stacked re-export."""
    tensors, reference = release
    write_release_transformer(tensors, CONFIG, tmp_path / "transformer")
    model = load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.float32, qkv_layout="stacked")
    assert _error_against(reference, model) > 100 * MAX_RELATIVE_ERROR


def test_diffusers_folder_loads(release, tmp_path):
    _, reference = release
    reference.save_pretrained(tmp_path / "transformer", max_shard_size="50KB")  # several shards + index
    model = load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.float32)
    assert model.checkpoint_layout == "diffusers"
    assert _error_against(reference, model) <= MAX_RELATIVE_ERROR


def test_stacked_single_file_needs_its_layout_said(release, tmp_path):
    tensors, reference = release
    single = {**tensors, **stacked_release_qkv(reference)}
    path = tmp_path / "minimax_h3_fl2va.safetensors"
    save_file({k: v.contiguous() for k, v in single.items()}, str(path))
    with pytest.raises(CheckpointError, match="cannot tell how the fused QKV rows"):
        load_minimax_h3_dit(path, device="cpu", dtype=torch.float32)
    with pytest.raises(CheckpointError, match="does not match|has shape"):  # no config: the released sizes
        load_minimax_h3_dit(path, device="cpu", dtype=torch.float32, qkv_layout="stacked")


def test_stacked_file_with_its_layout_in_metadata_loads(release, tmp_path):
    tensors, reference = release
    directory = write_release_transformer(tensors, CONFIG, tmp_path / "transformer")
    for shard in directory.glob("model-*.safetensors"):
        shard.unlink()
    (directory / "model.safetensors.index.json").unlink()
    single = {**tensors, **stacked_release_qkv(reference)}
    save_file({k: v.contiguous() for k, v in single.items()}, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match="qkv_layout='interleaved' or 'stacked'"):  # merged by hand: ambiguous
        load_minimax_h3_dit(directory, device="cpu", dtype=torch.float32)
    model = load_minimax_h3_dit(directory, device="cpu", dtype=torch.float32, qkv_layout="stacked")
    assert _error_against(reference, model) <= MAX_RELATIVE_ERROR

    save_file(
        {k: v.contiguous() for k, v in single.items()},
        str(directory / "model.safetensors"),
        metadata={"qkv_layout": "stacked"},
    )
    model = load_minimax_h3_dit(directory, device="cpu", dtype=torch.float32)
    assert "metadata" in model.checkpoint_layout and _error_against(reference, model) <= MAX_RELATIVE_ERROR
    with pytest.raises(CheckpointError, match="metadata says 'stacked'"):
        load_minimax_h3_dit(directory, device="cpu", dtype=torch.float32, qkv_layout="interleaved")


def test_mixed_precision_and_rope_table(release, tmp_path):
    tensors, _ = release
    bf16 = {k: (v if k in FP32_PARAMETER_NAMES or k == "rope.inv_freq" else v.bfloat16()) for k, v in tensors.items()}
    write_release_transformer(bf16, CONFIG, tmp_path / "transformer")
    model = load_minimax_h3_dit(tmp_path, device="cpu", dtype=torch.float16)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert {dtypes[n] for n in FP32_PARAMETER_NAMES} == {torch.float32}
    assert {d for n, d in dtypes.items() if n not in FP32_PARAMETER_NAMES} == {torch.float16}
    assert torch.equal(model.rope.inv_freq, tensors["rope.inv_freq"])  # read back
    del bf16["rope.inv_freq"]
    write_release_transformer(bf16, CONFIG, tmp_path / "again" / "transformer")
    rebuilt = load_minimax_h3_dit(tmp_path / "again", device="cpu", dtype=torch.float16)
    assert relative_error(rebuilt.rope.inv_freq, tensors["rope.inv_freq"]) <= 4 * 2.0**-24  # recomputed: pow vs 1/pow


def test_missing_unexpected_and_misshapen_tensors_are_named(release, tmp_path):
    tensors, _ = release
    missing = {k: v for k, v in tensors.items() if k != "blocks.1.mlp.fc2.weight"}
    write_release_transformer(missing, CONFIG, tmp_path / "a" / "transformer")
    with pytest.raises(CheckpointError, match=r"1 missing: blocks\.1\.mlp\.fc2\.weight"):
        load_minimax_h3_dit(tmp_path / "a", device="cpu", dtype=torch.float32)
    extra = {**tensors, "blocks.0.attn.bogus.weight": torch.zeros(2)}
    write_release_transformer(extra, CONFIG, tmp_path / "b" / "transformer")
    with pytest.raises(CheckpointError, match=r"1 unexpected: blocks\.0\.attn\.bogus\.weight"):
        load_minimax_h3_dit(tmp_path / "b", device="cpu", dtype=torch.float32)
    directory = write_release_transformer(tensors, CONFIG, tmp_path / "c" / "transformer")
    config = json.loads((directory / "config.json").read_text())
    config["ffn_hidden_size"] = 96
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="mlp.fc1.weight has shape"):
        load_minimax_h3_dit(tmp_path / "c", device="cpu", dtype=torch.float32)
    with pytest.raises(CheckpointError, match="no MiniMax H3 transformer"):
        load_minimax_h3_dit(tmp_path / "nowhere", device="cpu", dtype=torch.float32)
    (tmp_path / "root" / "FL2VA" / "transformer").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="looks like the release root"):
        load_minimax_h3_dit(tmp_path / "root", device="cpu", dtype=torch.float32)


def test_random_builder_says_so():  # seeded alike on every rank: the conformance suite (tests/conformance)
    assert build_random_minimax_h3_dit(CONFIG, seed=7).weights_source == RANDOM_WEIGHTS == "random (no checkpoint)"


def test_config_round_trips_through_diffusers_names():
    assert MiniMaxH3Config.from_diffusers_dict(CONFIG.to_diffusers_dict()) == CONFIG
    assert MiniMaxH3Config.from_diffusers_dict({}) == MiniMaxH3Config()  # diffusers' defaults are the release's
