"""LoRA merging for MiniMax H3 (models/minimax_h3/lora.py) against diffusers' own LoRA loading, and its bookkeeping.

Parity: random factors for every linear of a tiny random DiT are written in each producer's format (ai-toolkit,
ComfyUI/reference names, musubi-tuner, kohya, DiffSynth-Studio, diffusers/peft). diffusers loads each file into
`MiniMaxH3Transformer3DModel` (holding the same base weights as ours, through diffusers' checkpoint converter) and
fuses it: with its own `load_lora_weights` + `fuse_lora` when peft is installed, and always "by hand" (diffusers'
`lora_state_dict`, then ``W += scale * alpha/rank * B @ A`` on diffusers' module names, with the alphas the test
wrote). Ours reads the same file with `read_lora` and merges it with `merge`. One DiT forward and the merged weights
(diffusers' mapped to our names by the checkpoint loader's diffusers recipes) are compared.

Bounds (fp32, unit roundoff u = 6e-8). Merged weights: both sides compute ``W + c * (B @ A)`` with another grouping
of the scalars (peft scales the product, kohya's alpha is folded into the factors by diffusers), rank <= 4 dot
products: a few u of the largest weight; bound 1e-6 relative (~17 u). Forward: the same paths as the base-model
comparison in test_minimax_h3_faithfulness.py (bound 1e-5, ~170 u, measured up to 3.2e-7 there) on weights that
agree to a few u, which perturbs the output by the same order; bound 1e-5. Measured: 0 for both, every format, with
peft and by hand, AVX-512 and portable kernels (the same operations on the same numbers). Negative controls,
required 100x above: fc1's gate and up halves of the LoRA swapped (measured 0.28), a Ref2VA LoRA forced into FL2VA
(0.85); the LoRA itself moves the output by 0.47 to 0.75. Restoring (unmerge, switching) is data movement, and an
FP8 merge is the same computation as merging before quantizing: torch.equal.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit, load_minimax_h3_dit
from telefuser.models.minimax_h3.checkpoint_formats import TransformerLayout, diffusers_name
from telefuser.models.minimax_h3.dit import MiniMaxH3DiT
from telefuser.models.minimax_h3.lora import (
    BLOCK_LINEARS,
    REFINER_LINEARS,
    TOP_LINEARS,
    Lora,
    LoraError,
    ModuleLora,
    applied_loras,
    apply,
    keep_dense_weights,
    keep_originals,
    merge,
    our_module,
    read_lora,
    unmerge,
)
from telefuser.ops.fp8 import Float8Linear
from tests.minimax_h3_reference import (
    our_rows,
    reference_dit_from_release,
    reference_dit_rows,
    release_dit_tensors,
    write_release_transformer,
)
from tests.numerics import UNIT_ROUNDOFF, relative_error

# diffusers reads DiffSynth-Studio's per-head interleaved QKV with the release's head dim, 128
CONFIG = MiniMaxH3Config.tiny(num_attention_heads=2, attention_head_dim=128)
WEIGHT_BOUND = 1e-6
DIT_BOUND = 1e-5
SCALE = 0.8
FORMATS = ("ai-toolkit", "comfy", "musubi", "kohya", "diffsynth", "diffusers")
AITOOLKIT_ALPHA = 2.0  # recorded in the ai-toolkit file's __metadata__


def _peft_available() -> bool:
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


# -- the models ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(ours loaded from a release folder, diffusers' transformer on the same tensors), fp32, no LoRA."""
    tensors = release_dit_tensors(CONFIG, seed=5)
    folder = write_release_transformer(tensors, CONFIG, tmp_path_factory.mktemp("h3lora") / "transformer")
    ours = load_minimax_h3_dit(folder, device="cpu", dtype=torch.float32)
    return ours, reference_dit_from_release(tensors, CONFIG, "interleaved")


def _inputs():
    g = torch.Generator().manual_seed(3)
    video = torch.randn(1, CONFIG.latents_dim, 2, 4, 6, generator=g)
    audio = torch.randn(1, CONFIG.audio_latents_dim, 6, generator=g)
    text = torch.randn(1, 5, CONFIG.text_dim, generator=g)
    return video, audio, text, 0.7, 0.3


def _ours_rows(model):
    video, audio, text, tv, ta = _inputs()
    with torch.no_grad():
        return our_rows(*model(video, audio, text, torch.tensor([tv * 1000.0]), torch.tensor([ta * 1000.0])))


def _reference_rows(reference):
    return reference_dit_rows(reference, *_inputs())


def _dit_error(ours, reference) -> float:
    return max(relative_error(o, t) for o, t in zip(_ours_rows(ours), _reference_rows(reference)))


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


# -- LoRA files in each producer's format ----------------------------------------------------------------------------
def _rank(name: str) -> int:
    return 2 if "adaln_proj" in name or name.startswith("norm_out") else 4  # mixed ranks, as published H3 LoRAs


def _factors(shapes: dict[str, tuple[int, int]], seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(A [r, in], B [out, r]) per module: the update B @ A is about 0.3x the N(0, 1/in) weights."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (rows, columns) in sorted(shapes.items()):
        r = _rank(name)
        out[name] = (torch.randn(r, columns, generator=g) / math.sqrt(columns), torch.randn(rows, r, generator=g) * 0.3)
    return out


def _kohya_alpha(name: str) -> float:
    return 1.0 if _rank(name) == 2 else 3.0  # alpha/rank 0.5 and 0.75, folded into the factors by diffusers


def _interleave_qkv(up: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[Q; K; V] rows -> the release's per-head [(q_h, k_h, v_h) for h in heads] (DiffSynth-Studio's layout)."""
    rank = up.shape[1]
    return up.reshape(3, -1, head_dim, rank).transpose(0, 1).reshape(-1, rank)


def write_lora(factors, fmt: str, path: Path) -> Path:
    """`factors` in this model's layout (our names, QKV rows [Q; K; V], fc1 rows [gate; up]) under `fmt`'s keys."""
    tensors, metadata = {}, None
    for name, (down, up) in factors.items():
        if fmt == "ai-toolkit":
            tensors[f"diffusion_model.{name}.lora_A.weight"] = down
            tensors[f"diffusion_model.{name}.lora_B.weight"] = up
            metadata = {"alpha": str(AITOOLKIT_ALPHA)}
        elif fmt == "comfy":
            tensors[f"{name}.lora_A.weight"], tensors[f"{name}.lora_B.weight"] = down, up
        elif fmt in ("musubi", "kohya"):
            base = "lora_unet_" + name.replace(".", "_") if fmt == "musubi" else name
            tensors[f"{base}.lora_down.weight"], tensors[f"{base}.lora_up.weight"] = down, up
            tensors[f"{base}.alpha"] = torch.tensor(_kohya_alpha(name))
        elif fmt == "diffsynth":
            if name.endswith("attn.qkv_proj"):
                up = _interleave_qkv(up, CONFIG.attention_head_dim)
            tensors[f"{name}.lora_A.default.weight"], tensors[f"{name}.lora_B.default.weight"] = down, up
        else:
            raise ValueError(fmt)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


def _truth_alpha(fmt: str, name: str) -> float:
    """The alpha each of our modules' update carries in `fmt`'s file."""
    if fmt == "ai-toolkit":
        return AITOOLKIT_ALPHA
    if fmt in ("musubi", "kohya"):
        return _kohya_alpha(name)
    return float(_rank(name))


# diffusers' own format: a LoRA trained on diffusers' module names (separate to_q/to_k/to_v, each with its own
# lora_A), saved with diffusers' adapter config (a rank pattern and an alpha pattern, peft's pattern syntax).
DIFFUSERS_CONFIG = {
    "r": 4,
    "lora_alpha": 4.0,
    "rank_pattern": {"adaln_proj.linear": 2, "norm_out.linear": 2},
    "alpha_pattern": {"transformer_blocks.1.attn.to_k": 8.0, "adaln_proj.linear": 1.0},
}


def _diffusers_alpha(module: str) -> float:
    """DIFFUSERS_CONFIG's alpha of `module`, stated explicitly."""
    if module == "transformer_blocks.1.attn.to_k":
        return 8.0
    if module.endswith("adaln_proj.linear"):
        return 1.0
    return 4.0


def write_diffusers_lora(reference, path: Path, *, prefix: str = "transformer", seed: int = 9) -> Path:
    shapes = {name: tuple(m.weight.shape) for name, m in _linears(reference).items()}
    tensors = {}
    for name, (down, up) in _factors(shapes, seed).items():
        tensors[f"{prefix}.{name}.lora_A.weight"], tensors[f"{prefix}.{name}.lora_B.weight"] = down, up
    config = {**DIFFUSERS_CONFIG, "target_modules": sorted(shapes)}
    metadata = {"lora_adapter_metadata": json.dumps({f"{prefix}.{k}": v for k, v in config.items()})}
    save_file(tensors, str(path), metadata={"format": "pt", **metadata})
    return path


def _our_factors(model: MiniMaxH3DiT, seed: int = 7):
    return _factors({name: tuple(m.weight.shape) for name, m in _linears(model).items()}, seed)


# -- diffusers' side -------------------------------------------------------------------------------------------------
def _diffusers_fused(reference, path: Path, *, peft: bool, alpha_of, scale: float = SCALE):
    """A copy of `reference` with the LoRA at `path` fused by diffusers (peft) or by hand on diffusers' names."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    model = copy.deepcopy(reference)
    if peft:

        class Pipeline(MiniMaxH3LoraLoaderMixin):  # the mixin needs only the component and these two attributes
            hf_device_map = None

            def __init__(self, transformer):
                self.transformer = transformer

            @property
            def components(self):
                return {"transformer": self.transformer}

        pipeline = Pipeline(model)
        pipeline.load_lora_weights(str(path))
        pipeline.fuse_lora(lora_scale=scale)
        return model
    state = MiniMaxH3LoraLoaderMixin.lora_state_dict(str(path))
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key in (k for k in state if k.endswith(".lora_A.weight")):
            name = key.removeprefix("transformer.").removesuffix(".lora_A.weight")
            down, up = state[key], state[key.replace(".lora_A.", ".lora_B.")]
            weight = modules[name].weight
            weight += scale * alpha_of(name) / down.shape[0] * (up @ down)
    return model


def _diffusers_weights_as_ours(reference, ours: MiniMaxH3DiT) -> dict[str, torch.Tensor]:
    """diffusers' (fused) weights under our names, through the checkpoint loader's diffusers recipes."""
    state = {k.replace(".base_layer", ""): v for k, v in reference.state_dict().items() if ".lora_" not in k}
    layout = TransformerLayout("diffusers", None, CONFIG)
    out = {}
    for key, tensor in ours.state_dict().items():
        if key == "rope.inv_freq":
            continue
        recipe = layout.recipe(key, tuple(tensor.shape))
        parts = [state[name] if index is None else state[name][index] for name, index in recipe.parts]
        joined = parts[0] if len(parts) == 1 else torch.cat(parts)
        out[key] = recipe.finish(joined) if recipe.finish is not None else joined
    return out


def _write_format(fmt: str, ours, reference, directory: Path) -> tuple[Path, Callable[[str], float]]:
    """(the file, diffusers' alpha of each diffusers module as the file says) for `fmt`."""
    path = directory / f"{fmt}.safetensors"
    if fmt == "diffusers":
        return write_diffusers_lora(reference, path), _diffusers_alpha
    write_lora(_our_factors(ours), fmt, path)
    if fmt == "ai-toolkit":
        return path, lambda name: AITOOLKIT_ALPHA
    # alpha-less files, and kohya's alphas, which diffusers folds into the factors: fused at alpha == rank
    return path, lambda name: float(_rank(name))


# -- parity with diffusers ---------------------------------------------------------------------------------------------
@pytest.mark.numerics  # float results of other computation orders (tests/numerics.py)
@pytest.mark.parametrize("fuse", ["by-hand", "peft"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_merge_matches_diffusers(pair, tmp_path, fmt, fuse):
    if fuse == "peft" and not _peft_available():
        pytest.skip("peft is not installed: diffusers' load_lora_weights/fuse_lora need it (the by-hand variant ran)")
    base, reference = pair
    path, alpha_of = _write_format(fmt, base, reference, tmp_path)
    theirs = _diffusers_fused(reference, path, peft=fuse == "peft", alpha_of=alpha_of)
    ours = copy.deepcopy(base)
    lora = read_lora(path)
    assert set(lora.modules) == set(_linears(ours))  # every linear of the model, nothing else
    merge(ours, [(lora, SCALE)])
    assert [(a.name, a.scale) for a in applied_loras(ours)] == [(fmt, SCALE)]

    expected = _diffusers_weights_as_ours(theirs, ours)
    for key, tensor in ours.state_dict().items():
        if key in expected:
            assert relative_error(tensor, expected[key]) <= WEIGHT_BOUND, key
    assert _dit_error(ours, theirs) <= DIT_BOUND
    assert _dit_error(base, theirs) > 100 * DIT_BOUND  # the LoRA changes the output far above the bound


@pytest.mark.numerics
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "diffusers"])
def test_merged_weights_are_the_written_update(pair, tmp_path, fmt):
    """Each format's file means, in our layout, exactly the factors it was written from (DiffSynth's interleaved
    QKV de-interleaved, kohya's alpha folded, ai-toolkit's metadata alpha)."""
    base, _ = pair
    factors = _our_factors(base)
    lora = read_lora(write_lora(factors, fmt, tmp_path / f"{fmt}.safetensors"))
    ours = copy.deepcopy(base)
    merge(ours, [(lora, SCALE)])
    weights = dict(base.named_parameters())
    for name, (down, up) in factors.items():
        update = SCALE * _truth_alpha(fmt, name) / down.shape[0] * (up @ down)
        merged = ours.get_submodule(name).weight
        assert relative_error(merged, weights[f"{name}.weight"] + update) <= WEIGHT_BOUND, name


@pytest.mark.numerics
def test_swapped_swiglu_halves_land_far_above_the_bound(pair, tmp_path):
    """Negative control: fc1's update with its gate and up halves swapped (the [value; gate] vs [gate; up] mix-up)."""
    base, reference = pair
    path, alpha_of = _write_format("comfy", base, reference, tmp_path)
    theirs = _diffusers_fused(reference, path, peft=False, alpha_of=alpha_of)
    lora = read_lora(path)
    swapped = dict(lora.modules)
    for name in [n for n in swapped if n.endswith("mlp.fc1")]:
        gate, up = swapped[name].up.chunk(2)
        swapped[name] = ModuleLora(swapped[name].down, torch.cat([up, gate]), swapped[name].alpha)
    ours = copy.deepcopy(base)
    merge(ours, [(Lora(lora.path, lora.partition, swapped), SCALE)])
    assert _dit_error(ours, theirs) > 100 * DIT_BOUND


@pytest.mark.numerics
def test_a_ref2va_lora_is_refused_and_forcing_it_changes_the_output(pair, tmp_path):
    base, reference = pair
    path = write_diffusers_lora(reference, tmp_path / "ref2va.safetensors", prefix="transformer_ref")
    with pytest.raises(LoraError, match=r"Ref2VA partition .*runs FL2VA.*allow_other_partition=True"):
        read_lora(path)
    lora = read_lora(path, allow_other_partition=True)
    assert lora.partition == "transformer_ref"
    assert read_lora(path, partition="transformer_ref").partition == "transformer_ref"
    forced = copy.deepcopy(base)
    merge(forced, [(lora, SCALE)])
    # diffusers merges nothing into an FL2VA-only pipeline (it refuses the file): forcing it lands far away
    assert _dit_error(forced, reference) > 100 * DIT_BOUND
    if _peft_available():
        with pytest.raises(ValueError, match="transformer_ref"):
            _diffusers_fused(reference, path, peft=True, alpha_of=None)


# -- names -----------------------------------------------------------------------------------------------------------
def test_every_linear_is_a_lora_target_and_maps_from_its_diffusers_name():
    with torch.device("meta"):
        model = MiniMaxH3DiT(CONFIG)
    linears = set(_linears(model))
    templates = set(TOP_LINEARS)
    templates |= {f"blocks.{i}.{n}" for i in range(CONFIG.num_layers) for n in BLOCK_LINEARS}
    templates |= {
        f"token_refiner.blocks.{i}.{n}" for i in range(CONFIG.token_refiner_num_layers) for n in REFINER_LINEARS
    }
    assert templates == linears
    for name in linears:
        theirs = diffusers_name(f"{name}.weight").removesuffix(".weight")
        if name.endswith("qkv_proj"):
            for section, p in enumerate("qkv"):
                assert our_module(theirs.replace("qkv_proj", f"to_{p}")) == (name, section)
        else:
            assert our_module(theirs) == (name, None)
    assert our_module("transformer_blocks.0.attn.to_x") is None
    assert our_module("transformer_blocks.0.norm1") is None


# -- reading ---------------------------------------------------------------------------------------------------------
def _small_model(dtype=torch.float32) -> MiniMaxH3DiT:
    return build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=0, dtype=dtype)


def _small_factors(seed: int, names=None):
    model = _small_model()
    shapes = {n: tuple(m.weight.shape) for n, m in _linears(model).items() if names is None or n in names}
    return _factors(shapes, seed)


def test_alpha_from_the_metadata_or_equal_to_the_rank(tmp_path):
    factors = _small_factors(1)
    with_alpha = read_lora(write_lora(factors, "ai-toolkit", tmp_path / "a.safetensors"))
    assert {(m.rank, m.alpha) for m in with_alpha.modules.values()} == {(4, AITOOLKIT_ALPHA), (2, AITOOLKIT_ALPHA)}
    without = read_lora(write_lora(factors, "comfy", tmp_path / "b.safetensors"))
    assert {(m.rank, m.alpha) for m in without.modules.values()} == {(4, 4.0), (2, 2.0)}
    for name, (down, up) in factors.items():  # unconverted factors come through bit for bit
        assert torch.equal(without.modules[name].down, down) and torch.equal(without.modules[name].up, up), name


def test_a_key_that_maps_to_nothing_is_named(tmp_path):
    factors = _small_factors(2, names={"blocks.0.attn.out_proj"})
    tensors = {
        f"diffusion_model.{n}.lora_{k}.weight": t for n, (a, b) in factors.items() for k, t in (("A", a), ("B", b))
    }
    tensors["diffusion_model.blocks.0.attn.bogus.lora_A.weight"] = torch.zeros(4, 64)
    tensors["diffusion_model.blocks.0.attn.bogus.lora_B.weight"] = torch.zeros(64, 4)
    save_file(tensors, str(tmp_path / "bogus.safetensors"))
    with pytest.raises(LoraError, match=r"blocks\.0\.attn\.bogus"):
        read_lora(tmp_path / "bogus.safetensors")
    # a diffusers-named file: its keys pass diffusers' reader unchanged, and ours names the one it cannot place
    save_file(
        {
            "transformer.transformer_blocks.0.attn.to_x.lora_A.weight": torch.zeros(4, 64),
            "transformer.transformer_blocks.0.attn.to_x.lora_B.weight": torch.zeros(64, 4),
        },
        str(tmp_path / "to_x.safetensors"),
    )
    with pytest.raises(LoraError, match=r"transformer\.transformer_blocks\.0\.attn\.to_x"):
        read_lora(tmp_path / "to_x.safetensors")


def test_a_layer_the_model_lacks_fails_before_anything_is_merged(tmp_path):
    model = _small_model()
    good = _small_factors(3, names={"blocks.0.attn.out_proj", "blocks.1.mlp.fc2"})
    beyond = {
        "blocks.7.attn.out_proj": tuple(t.clone() for t in good["blocks.0.attn.out_proj"]),
        **good,
    }  # the tiny model has 2 blocks
    lora = read_lora(write_lora(beyond, "comfy", tmp_path / "beyond.safetensors"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(LoraError, match=r"blocks\.7\.attn\.out_proj \(no such linear layer"):
        merge(model, [(lora, 1.0)])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert applied_loras(model) == ()
    wrong_shape = read_lora(
        write_lora(_factors({"blocks.0.attn.out_proj": (64, 32)}, 0), "comfy", tmp_path / "s.safetensors")
    )
    with pytest.raises(LoraError, match=r"blocks\.0\.attn\.out_proj \(LoRA \(64, 32\), weight \(64, 128\)\)"):
        merge(model, [(wrong_shape, 1.0)])


def test_dora_and_missing_files_are_refused(tmp_path):
    with pytest.raises(LoraError, match="no LoRA file"):
        read_lora(tmp_path / "absent.safetensors")
    factors = _small_factors(4, names={"blocks.0.attn.out_proj"})
    tensors = {f"{n}.lora_{k}.weight": t for n, (a, b) in factors.items() for k, t in (("A", a), ("B", b))}
    tensors["blocks.0.attn.out_proj.dora_scale"] = torch.ones(64, 1)
    save_file(tensors, str(tmp_path / "dora.safetensors"))
    with pytest.raises(LoraError, match="DoRA"):
        read_lora(tmp_path / "dora.safetensors")


# -- merging, stacking, restoring ------------------------------------------------------------------------------------
def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _equal(model: nn.Module, snapshot: dict[str, torch.Tensor]) -> bool:
    state = model.state_dict()
    return state.keys() == snapshot.keys() and all(torch.equal(state[k], snapshot[k]) for k in state)


def _two_loras(tmp_path):
    first = read_lora(write_lora(_small_factors(11), "comfy", tmp_path / "first.safetensors"))
    some = {"blocks.0.attn.qkv_proj", "blocks.1.mlp.fc1", "blocks.1.adaln_proj.linear", "final_layer.video_out"}
    second = read_lora(write_lora(_small_factors(12, names=some), "ai-toolkit", tmp_path / "second.safetensors"))
    return first, second


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_stacked_loras_add_in_fp32_and_cast_once(tmp_path, dtype):
    first, second = _two_loras(tmp_path)
    model = _small_model(dtype)
    weights = {n: m.weight.detach().clone() for n, m in _linears(model).items()}
    merge(model, [(first, 0.5), (second, -1.25)])
    u = UNIT_ROUNDOFF[torch.float32]
    controls = []
    for name, weight in weights.items():
        exact = weight.double()
        for lora, scale in ((first, 0.5), (second, -1.25)):
            if name in lora.modules:
                m = lora.modules[name]
                exact = exact + scale * m.scale * (m.up.double() @ m.down.double())
        got = model.get_submodule(name).weight.double()
        # the fp32 sum within a few u of the exact one, then one rounding to the weight's dtype (its unit roundoff;
        # 0 extra for fp32 weights: the time embedder and the heads stay fp32 in a bf16 model)
        cast = 0.0 if weight.dtype == torch.float32 else UNIT_ROUNDOFF[weight.dtype]
        bound = (cast + 16 * u) * exact.abs() + 16 * u * exact.abs().max()
        assert ((got - exact).abs() <= bound).all(), name
        if cast and name in first.modules and name in second.modules:  # control: a rounding after each LoRA
            twice = weight.float()
            for lora, scale in ((first, 0.5), (second, -1.25)):
                m = lora.modules[name]
                twice = (twice + scale * m.scale * (m.up @ m.down)).to(weight.dtype).float()
            controls.append(bool(((twice.double() - exact).abs() > bound).any()))
    assert controls == ([] if dtype == torch.float32 else [True] * len(controls)) and (
        dtype == torch.float32 or controls
    )


def test_unmerge_restores_the_weights_exactly(tmp_path):
    first, second = _two_loras(tmp_path)
    model = _small_model(torch.bfloat16)
    before = _snapshot(model)
    merge(model, [(first, 0.5), (second, -1.25)])
    assert not _equal(model, before)
    assert [a.name for a in applied_loras(model)] == ["first", "second"]
    with pytest.raises(LoraError, match="already merged"):
        merge(model, [(first, 1.0)])
    assert [a.name for a in unmerge(model)] == ["first", "second"]
    assert _equal(model, before)
    assert unmerge(model) == ()
    # the originals stay for the next merge, which copies nothing more to the host
    originals = dict(model.lora_state.dense)
    assert applied_loras(model) == () and set(originals) == set(first.modules) | set(second.modules)
    merge(model, [(second, 1.0)])
    assert all(model.lora_state.dense[name] is copy for name, copy in originals.items())
    unmerge(model)
    assert _equal(model, before)


def test_keep_originals_ahead_of_the_first_merge(tmp_path):
    first, second = _two_loras(tmp_path)
    model = _small_model(torch.bfloat16)
    before = _snapshot(model)
    names = sorted(set(first.modules) | set(second.modules))
    weight = model.get_submodule(names[0]).weight
    assert keep_originals(model, names) == sum(
        model.get_submodule(n).weight.numel() * model.get_submodule(n).weight.element_size() for n in names
    )
    assert keep_originals(model, names) == 0  # kept once
    kept = dict(model.lora_state.dense)
    assert torch.equal(kept[names[0]], weight) and kept[names[0]].data_ptr() != weight.data_ptr()
    merge(model, [(first, 0.5)])
    assert all(model.lora_state.dense[n] is kept[n] for n in names)
    with pytest.raises(LoraError, match="unmerge first"):
        keep_originals(model, names)
    unmerge(model)
    assert _equal(model, before)
    with pytest.raises(LoraError, match="no linear layer"):
        keep_originals(model, ["blocks.0.attn.nothing"])


def test_apply_switches_from_one_set_to_another(tmp_path):
    first, second = _two_loras(tmp_path)
    model, fresh = _small_model(torch.bfloat16), _small_model(torch.bfloat16)
    before = _snapshot(model)
    apply(model, [(first, 1.0)])
    apply(model, [(second, 0.7), (first, 0.2)])
    merge(fresh, [(second, 0.7), (first, 0.2)])
    assert _equal(model, _snapshot(fresh))  # the same arithmetic from the same originals
    assert [(a.name, a.scale) for a in applied_loras(model)] == [("second", 0.7), ("first", 0.2)]
    apply(model, [])
    assert _equal(model, before) and applied_loras(model) == ()


def test_an_irreversible_merge_keeps_no_copy_and_cannot_be_undone(tmp_path):
    first, _ = _two_loras(tmp_path)
    model, reversible = _small_model(), _small_model()
    merge(model, [(first, 1.0)], reversible=False)
    merge(reversible, [(first, 1.0)])
    assert model.lora_state.dense == {} and _equal(model, _snapshot(reversible))
    with pytest.raises(LoraError, match="reversible=False"):
        unmerge(model)


def _fp8_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]


def test_fp8_linears_are_requantized_from_the_dense_weight_and_restored_exactly(tmp_path):
    first, second = _two_loras(tmp_path)
    loras = [(first, 0.5), (second, -1.25)]
    # merged while dense, then quantized: what an FP8 merge must reproduce
    merged_first = _small_model(torch.bfloat16)
    merge(merged_first, loras)
    merged_first.quantize("fp8")

    model = _small_model(torch.bfloat16)
    kept = keep_dense_weights(model)
    dense = dict(model.lora_state.dense)
    assert kept == sum(model.get_submodule(n).weight.numel() * 2 for n in dense)
    assert len(dense) == len(model.blocks) * len(model.FP8_LINEARS)
    model.quantize("fp8")
    assert set(_fp8_names(model)) == set(dense)
    before = _snapshot(model)
    merge(model, loras)
    assert _equal(model, _snapshot(merged_first))  # codes and scales: never merged into the e4m3 codes
    unmerge(model)
    assert _equal(model, before)
    # the original codes stay beside the dense weights for the next merge
    touched = set(first.modules) | set(second.modules)
    assert set(model.lora_state.codes) == touched & set(dense)
    assert set(model.lora_state.dense) == set(dense) | touched  # touched dense linears: their originals too
    assert all(model.lora_state.dense[name] is copy for name, copy in dense.items())
    merge(model, loras)  # and again, from the kept dense weights
    assert _equal(model, _snapshot(merged_first))


def test_an_fp8_linear_without_its_dense_weight_is_refused(tmp_path):
    first, _ = _two_loras(tmp_path)
    model = _small_model(torch.bfloat16)
    model.quantize("fp8")
    before = _snapshot(model)
    with pytest.raises(LoraError, match=r"blocks\.0\.attn\.qkv_proj \(FP8, its dense weight was not kept"):
        merge(model, [(first, 1.0)])
    assert _equal(model, before)
    with pytest.raises(LoraError, match="already FP8"):
        keep_dense_weights(model)
