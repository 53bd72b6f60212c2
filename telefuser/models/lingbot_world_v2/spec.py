"""LingBot-World v2's `ModelSpec`: its flags, its parallel plan (Ulysses only), its loaders, pipeline and stream
adapter.

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
from ..spec import Flag, ModelSpec

CUDA_GRAPHS = ("auto", "on", "off")
EXAMPLE = "telefuser.models.lingbot_world_v2.example"
# What the tools run the example at: a chunk read after `history_chunks` committed ones, more frames than the window
# holds, so it has rolled. tiny: two sessions, 6 chunks of 2 frames through the 10-frame window; official: an 832x480
# chunk of 4 latent frames (1560 tokens each) after 5 such chunks, 20 frames through the 18-frame window
EXAMPLE_SHAPES = {
    "tiny": {"batch": 2, "history_chunks": 6},
    "official": {"frames": 4, "height": 60, "width": 104, "history_chunks": 5},
}


def head_dim(args) -> int | None:
    """The DiT's attention head dim that the flags in `args` describe: the random sizes' (tiny 16, official 128);
    None for a checkpoint, whose config is read only when it loads."""
    if LINGBOT_WORLD_V2.option(args, "checkpoint") is not None:
        return None
    return LINGBOT_WORLD_V2.config_of(LINGBOT_WORLD_V2.option(args, "config")).head_dim


def parallelize(model, mesh, *, communicator_factory=None):
    """Ulysses over `mesh.ulysses_group` with one communicator for all blocks; LingBot has no TP plan. KV windows made
    before this call hold the wrong heads and are refused; make new ones."""
    parallel = mesh.config
    if parallel.tp_degree != 1:
        raise ValueError(f"LingBot-World v2 supports Ulysses only; tp_degree {parallel.tp_degree} was asked for")
    parallel.check_heads(model.config.num_heads)
    model.open_ulysses(mesh, communicator_factory)
    return model


LINGBOT_WORLD_V2 = ModelSpec(
    name="lingbot_world_v2",
    title="LingBot-World v2 image-to-video world sessions",
    model_class="telefuser.models.lingbot_world_v2.dit:LingBotWorldV2DiT",
    head_dim="telefuser.models.lingbot_world_v2.spec:head_dim",
    flags=(
        config_flag(),
        checkpoint_flag(
            "folder with Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/ and the DiT "
            "(transformers/ or the folder itself), or a diffusers folder; random weights when omitted"
        ),
        attn_impl_flag(),
        quantization_flag("fp8: the DiT blocks' projection and FFN GEMMs in FP8 (opt-in accuracy-for-speed trade)"),
        vae_dtype_flag(
            "the VAE's dtype for the condition encode and the decode (float32, as the reference; bfloat16 is faster, "
            "see docs/perf)"
        ),
        Flag(
            ("--vae-fast",),
            {
                "action": "store_true",
                "help": "channels-last VAE weights and one compiled kernel per norm + SiLU pair: the same result up "
                "to rounding order, faster (docs/perf)",
            },
        ),
        Flag(
            ("--cuda-graphs",),
            {
                "choices": CUDA_GRAPHS,
                "default": "auto",
                "help": "replay every chunk's DiT forwards as CUDA graphs, each captured at its first call (default "
                "auto: on for CUDA under Ulysses, where they measured faster, unless the DiT's blocks stream; off "
                "runs them eagerly)",
            },
        ),
        offload_flag(),
        gpu_memory_flag(),
    ),
    attention_impls=ATTENTION_IMPLS,
    quantizations=QUANTIZATIONS,
    plan=parallelize,
    pipeline="telefuser.pipelines.lingbot_world_v2.loading:pipeline_from_args",
    memory="telefuser.pipelines.lingbot_world_v2.memory:workload",
    memory_request="telefuser.pipelines.lingbot_world_v2.loading:request_from_args",
    memory_alternatives="telefuser.pipelines.lingbot_world_v2.memory:alternatives",
    adapters={"stream": "telefuser.serving.stream.lingbot:build_lingbot_factory"},
    loaders={
        "random": "telefuser.models.lingbot_world_v2.checkpoint:build_random_lingbot_dit",
        "checkpoint": "telefuser.models.lingbot_world_v2.checkpoint:load_lingbot_dit",
    },
    serve_defaults={"config": "official"},  # a service runs the released sizes unless told
    sizes=SIZES,
    dit_config=f"{EXAMPLE}:dit_config",
    example=f"{EXAMPLE}:example",
    example_shapes=EXAMPLE_SHAPES,
    flops=f"{EXAMPLE}:flops",
    checkpoint_writer="telefuser.models.lingbot_world_v2.checkpoint_writer:write_lingbot_checkpoint",
)
