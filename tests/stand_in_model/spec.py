"""The stand-in's `ModelSpec`. In the package, registering it would be one line in `telefuser.models.registry`."""

from __future__ import annotations

from telefuser.models.spec import Flag, ModelSpec

ADAPTERS = "tests.stand_in_model.adapters"
DIT = "tests.stand_in_model.dit"


def parallelize(model, mesh, *, communicator_factory=None):
    """Ulysses over the mesh (the services' fakes never build the DiT)."""
    from .dit import parallelize as ulysses

    return ulysses(model, mesh, communicator_factory=communicator_factory)


STAND_IN = ModelSpec(
    name="stand_in",
    title="a test pattern that says which tint it was asked for",
    model_class=f"{DIT}:StandInDiT",
    flags=(Flag(("--tint",), {"choices": ("grey", "teal"), "default": "grey", "help": "the stand-in's own flag"}),),
    attention_impls=("sdpa",),
    quantizations=("none", "fp8"),  # its DiT quantizes its block linears (no --quantization flag: tests only)
    plan=parallelize,
    pipeline=f"{ADAPTERS}:pipeline_from_args",
    adapters={"video": f"{ADAPTERS}:build_video_runner", "stream": f"{ADAPTERS}:build_session_factory"},
    loaders={"random": f"{DIT}:build_random_stand_in_dit", "checkpoint": f"{DIT}:load_stand_in_dit"},
    sizes=("tiny",),
    dit_config=f"{DIT}:dit_config",
    example=f"{DIT}:example",
    flops=f"{DIT}:flops",
    checkpoint_writer=f"{DIT}:write_stand_in_dit",
)
