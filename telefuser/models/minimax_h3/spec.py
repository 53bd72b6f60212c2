"""MiniMax H3's `ModelSpec`: its flags, its parallel plan (TP, then Ulysses), its loaders, pipeline and video adapter.

Importing this module imports no torch: the plan imports the model's modules when it runs.
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
)
from ..spec import Flag, ModelSpec

QKV_LAYOUTS = ("interleaved", "stacked")  # checkpoint_formats.QKV_LAYOUTS
# --attn-impl auto (the default): SageAttention2's SM90 kernel where it is built and the GPU is Hopper (it passed the
# H3 quality gate, tools/validation/sage_quality_gate.py, and is faster), else torch SDPA
AUTO_ATTENTION = ("sage_sm90", "sdpa")
EXAMPLE = "telefuser.models.minimax_h3.example"
# What the tools run the example at: tiny, two samples at their own timesteps; official, the release's 768p 5 s 16:9
# call (pipelines.minimax_h3.shapes.plan_shape: latents 37 x 48 x 84, 414 audio rows) beside a 256-row prompt
EXAMPLE_SHAPES = {
    "tiny": {"batch": 2},
    "official": {"frames": 37, "height": 48, "width": 84, "audio_rows": 414, "text_rows": 256},
}


def head_dim(args) -> int | None:
    """The DiT's attention head dim that the flags in `args` describe: the random sizes' (tiny 16, official 128);
    None for a checkpoint, whose config is read only when it loads (the released H3 has 128)."""
    if MINIMAX_H3.option(args, "checkpoint") is not None:
        return None
    return MINIMAX_H3.config_of(MINIMAX_H3.option(args, "config")).attention_head_dim


def parallelize(model, mesh, *, communicator_factory=None):
    """TP over `mesh.tp_group` (tp.MINIMAX_H3_TP_PLAN: each planned linear keeps this rank's slice, real or meta
    weights), then Ulysses over `mesh.ulysses_group` with one communicator for all blocks. Once per model: TP slicing
    is one-way, and `close()` releases only the communicator."""
    from .tp import apply_tensor_parallel

    parallel = mesh.config
    parallel.check_heads(model.config.num_attention_heads)
    if model.tensor_parallel is not None:
        raise ValueError(f"the model is already split for tp_degree {model.tensor_parallel.size}; parallelize it once")
    if parallel.tp_degree > 1:
        model.tensor_parallel = apply_tensor_parallel(model, mesh.tp_group, mesh.tp_rank, parallel.tp_degree)
    model.open_ulysses(mesh, communicator_factory)
    return model


MINIMAX_H3 = ModelSpec(
    name="minimax_h3",
    title="MiniMax H3 text-to-video+audio",
    model_class="telefuser.models.minimax_h3.dit:MiniMaxH3DiT",
    flags=(
        config_flag(),
        checkpoint_flag("MiniMax-H3 release root or its FL2VA folder"),
        attn_impl_flag(default="auto", auto=AUTO_ATTENTION),
        quantization_flag("fp8: the joint blocks' QKV, output and SwiGLU GEMMs in FP8 (opt-in accuracy-for-speed)"),
        offload_flag(),
        gpu_memory_flag(),
        Flag(
            ("--qkv-layout",),
            {
                "choices": QKV_LAYOUTS,
                "default": None,
                "help": "fused QKV row order of a single-file re-export whose metadata does not say (the release "
                "shards and diffusers folders need no flag)",
            },
        ),
        Flag(
            ("--enable-feature-cache",),
            {"action": "store_true", "help": "AdaTaylorCache with the bundled H3 params"},
        ),
    ),
    attention_impls=ATTENTION_IMPLS,
    auto_attention=AUTO_ATTENTION,
    head_dim="telefuser.models.minimax_h3.spec:head_dim",
    served_name="MiniMax-H3",
    quantizations=QUANTIZATIONS,
    plan=parallelize,
    pipeline="telefuser.pipelines.minimax_h3.loading:pipeline_from_args",
    memory="telefuser.pipelines.minimax_h3.memory:workload",
    memory_request="telefuser.pipelines.minimax_h3.loading:request_from_args",
    memory_alternatives="telefuser.pipelines.minimax_h3.memory:alternatives",
    adapters={"video": "telefuser.serving.video.minimax:build_minimax_runner"},
    loaders={
        "random": "telefuser.models.minimax_h3.checkpoint:build_random_minimax_h3_dit",
        "checkpoint": "telefuser.models.minimax_h3.checkpoint:load_minimax_h3_dit",
    },
    sizes=SIZES,
    dit_config=f"{EXAMPLE}:dit_config",
    example=f"{EXAMPLE}:example",
    example_shapes=EXAMPLE_SHAPES,
    flops=f"{EXAMPLE}:flops",
    heads_field="num_attention_heads",
    tensor_parallel=True,
    checkpoint_writer="telefuser.models.minimax_h3.checkpoint_writer:write_minimax_h3_release",
)
