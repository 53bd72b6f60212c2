"""Wan 2.2's `ModelSpec`s, one per released variant (T2V-A14B, TI2V-5B): flags, the parallel plan (Ulysses), loaders,
pipeline and video adapter (`telefuser serve --model wan2.2-t2v-a14b`: serving/video/wan2_2.py, text to video without
audio, with classifier-free guidance).

Importing this module imports no torch: the plan and the loaders import the model's modules when they run.
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
from ..spec import ModelSpec

HEAD_DIM = 128  # both variants: 5120 / 40 and 3072 / 24


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


def _spec(variant: str, title: str, checkpoint_help: str) -> ModelSpec:
    example = "telefuser.models.wan2_2.example"
    memory = f"telefuser.pipelines.wan2_2.memory:{variant.replace('-', '_')}"
    return ModelSpec(
        name=f"wan2.2-{variant}",
        title=title,
        model_class="telefuser.models.wan2_2.dit:Wan22DiT",
        flags=(
            config_flag(),
            checkpoint_flag(checkpoint_help),
            attn_impl_flag(),
            quantization_flag("fp8: the DiT blocks' projection and FFN GEMMs in FP8 (opt-in accuracy-for-speed trade)"),
            offload_flag(),  # model: T2V-A14B keeps only the running expert on the GPU; block: the blocks stream
            gpu_memory_flag(),
            vae_dtype_flag(
                "the VAE's dtype for the decode (and TI2V-5B's image encode): float32, as diffusers' and the "
                "release's pipelines run it; bfloat16 halves the decode's memory (not yet measured on released weights)"
            ),
        ),
        attention_impls=ATTENTION_IMPLS,
        quantizations=QUANTIZATIONS,
        head_dim="telefuser.models.wan2_2.spec:head_dim",
        plan=parallelize,
        pipeline=f"telefuser.pipelines.wan2_2.loading:{variant.replace('-', '_')}_from_args",
        adapters={"video": "telefuser.serving.video.wan2_2:build_wan22_runner"},
        loaders={
            "random": "telefuser.models.wan2_2.checkpoint:build_random_wan22_dit",
            "checkpoint": "telefuser.models.wan2_2.checkpoint:load_wan22_dit",
        },
        sizes=SIZES,
        dit_config=f"{example}:{variant.replace('-', '_')}_config",
        example=f"{example}:example",
        flops=f"{example}:flops",
        checkpoint_writer="telefuser.models.wan2_2.checkpoint:write_wan22_expert",
        memory=f"{memory}_workload",
        memory_request=f"{memory}_request",
        memory_alternatives=f"{memory}_alternatives",
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
