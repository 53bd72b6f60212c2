"""Wan 2.2's `ModelSpec`s, one per released variant (T2V-A14B, TI2V-5B): flags, the parallel plan (Ulysses), loaders,
pipeline and video adapter (`telefuser serve --model wan2.2-t2v-a14b`: serving/video/wan2_2.py, text to video without
audio, with classifier-free guidance); and for tests, tools and benches the DiT by size, one step's forward on example
inputs and its FLOP count.

The example is one denoising step of the pipeline: a CFG batch of two (cond, uncond) at their own timesteps against
the prompt K/V computed once (`text_kv`, outside the step). The default latent grid, 2 frames of 3 x 3 tokens (18
rows), splits unevenly over 4 Ulysses ranks, so padding rows are exercised.

Importing this module imports no torch: the plan, the loaders and the example import the model's modules when they
run.
"""

from __future__ import annotations

from ..flags import (
    ATTENTION_IMPLS,
    QUANTIZATIONS,
    SIZES,
    attn_impl_flag,
    checkpoint_flag,
    config_flag,
    gpu_memory_flag,
    offload_flag,
    quantization_flag,
    vae_dtype_flag,
)
from ..spec import Example, ModelSpec, lazy_partial
from .config import Wan22Config, release

# What --attn-impl auto picks: SageAttention2's SM90 kernel when it is installed (it passes Wan's quality gate,
# tools/validation/sage_quality_gate.py, and is faster), else torch SDPA
AUTO_ATTENTION = ("sage_sm90", "sdpa")

HEAD_DIM = 128  # both variants: 5120 / 40 and 3072 / 24
SPEC = "telefuser.models.wan2_2.spec"  # this module, whose functions the specs point at
LOADING = "telefuser.pipelines.wan2_2.loading"  # the pipeline from the flags, their request, its memory workload
# What the tools run the example at, official: one CFG step at the release's canvas and frames in latent units
# (config.release: T2V-A14B 1280x720, 81 frames, VAE 8x; TI2V-5B 1280x704, 121 frames, VAE 16x; both 4x in time);
# tiny runs the example's defaults
EXAMPLE_SHAPES = {
    "t2v-a14b": {"frames": 21, "height": 90, "width": 160},
    "ti2v-5b": {"frames": 31, "height": 44, "width": 80},
}


def head_dim(args) -> int:
    """The DiT's attention head dim that the flags in `args` describe: tiny 16, the released variants 128."""
    return 16 if getattr(args, "config", "tiny") == "tiny" and getattr(args, "checkpoint", None) is None else HEAD_DIM


def parallelize(model, mesh, *, communicator_factory=None):
    """Ulysses over `mesh.ulysses_group` with one communicator for all of an expert's blocks; no TP plan. The loader
    hands T2V-A14B's second expert the first one's communicator (`communicator_factory`)."""
    parallel = mesh.config
    if parallel.tp_degree != 1:
        raise ValueError(f"Wan 2.2 supports Ulysses only; tp_degree {parallel.tp_degree} was asked for")
    parallel.check_heads(model.config.num_heads)
    model.open_ulysses(mesh, communicator_factory)
    return model


def dit_config(variant: str, size: str) -> Wan22Config:
    return release(variant, size).dit


def example(model, *, seed: int = 0, batch: int = 2, frames: int = 2, height: int = 6, width: int = 6, text_rows=7):
    """`model(latents, t, text_kv)` on seeded inputs; sizes in latent units (`text_rows` of encoder states, zero-padded
    to the model's text_len)."""
    from ..wan.example import random_inputs

    shape = {"batch": batch, "frames": frames, "height": height, "width": width, "text_rows": text_rows}
    device = model.patch_embedding.weight.device
    latents, t, text = random_inputs(model.config, seed=seed, device=device, **shape)
    text_kv = model.text_kv(text)
    return Example(run=lambda: (model(latents, t, text_kv),), shape=shape, names=("flow",))


def flops(config: Wan22Config, *, batch: int, frames: int, height: int, width: int, text_rows: int = 0) -> int:
    """One step's forward (the prompt is padded to text_len, so `text_rows` does not change it)."""
    from ..wan.example import dit_flops, token_rows

    rows = token_rows(config, frames, height, width)
    return dit_flops(config, batch=batch, rows=rows, key_rows=rows)


def _spec(variant: str, title: str, checkpoint_help: str) -> ModelSpec:
    return ModelSpec(
        name=f"wan2.2-{variant}",
        title=title,
        model_class="telefuser.models.wan2_2.dit:Wan22DiT",
        flags=(
            config_flag(),
            checkpoint_flag(checkpoint_help),
            attn_impl_flag(default="auto", auto=AUTO_ATTENTION),
            quantization_flag("fp8: the DiT blocks' projection and FFN GEMMs in FP8 (opt-in accuracy-for-speed trade)"),
            offload_flag(),  # model: T2V-A14B keeps only the running expert on the GPU; block: the blocks stream
            gpu_memory_flag(),
            vae_dtype_flag(
                "the VAE's dtype for the decode (and TI2V-5B's image encode): float32, as diffusers' and the "
                "release's pipelines run it; bfloat16 halves the decode's memory (not yet measured on released weights)"
            ),
        ),
        attention_impls=ATTENTION_IMPLS,
        auto_attention=AUTO_ATTENTION,
        quantizations=QUANTIZATIONS,
        head_dim=f"{SPEC}:head_dim",
        plan=parallelize,
        pipeline=lazy_partial(f"{LOADING}:pipeline_from_args", variant),
        adapters={"video": "telefuser.serving.video.wan2_2:build_wan22_runner"},
        loaders={
            "random": "telefuser.models.wan2_2.checkpoint:build_random_wan22_dit",
            "checkpoint": "telefuser.models.wan2_2.checkpoint:load_wan22_dit",
        },
        sizes=SIZES,
        dit_config=lazy_partial(f"{SPEC}:dit_config", variant),
        example=f"{SPEC}:example",
        example_shapes={"official": EXAMPLE_SHAPES[variant]},
        flops=f"{SPEC}:flops",
        checkpoint_writer="telefuser.models.wan2_2.checkpoint:write_wan22_expert",
        memory=lazy_partial(f"{LOADING}:workload", variant),
        memory_request=lazy_partial(f"{LOADING}:request_from_args", variant),
        memory_alternatives=lazy_partial(f"{LOADING}:alternatives", variant),
    )


WAN22_T2V_A14B = _spec(
    "t2v-a14b",
    "Wan 2.2 T2V-A14B text-to-video (two 14B experts)",
    "Wan2.2-T2V-A14B root (high_noise_model/ + low_noise_model/, Wan2.1_VAE.pth, umT5) or its diffusers folder "
    "(transformer/ + transformer_2/); random weights when omitted",
)
WAN22_TI2V_5B = _spec(
    "ti2v-5b",
    "Wan 2.2 TI2V-5B text-to-video (one 5B DiT, Wan 2.2 VAE)",
    "Wan2.2-TI2V-5B diffusers folder (the original layout's DiT and umT5 load too; its Wan2.2_VAE.pth does not); "
    "random weights when omitted",
)
