"""The stand-in's `ModelSpec`. In the package, registering it would be one line in `telefuser.models.registry`."""

from __future__ import annotations

from telefuser.models.spec import Flag, ModelSpec

ADAPTERS = "tests.stand_in_model.adapters"


def parallelize(model, mesh, *, communicator_factory=None):
    """Nothing to split: every rank computes the same test pattern."""
    return model


STAND_IN = ModelSpec(
    name="stand_in",
    title="a test pattern that says which tint it was asked for",
    model_class=f"{ADAPTERS}:StandInModel",
    flags=(Flag(("--tint",), {"choices": ("grey", "teal"), "default": "grey", "help": "the stand-in's own flag"}),),
    attention_impls=("sdpa",),
    quantizations=("none",),
    plan=parallelize,
    pipeline=f"{ADAPTERS}:pipeline_from_args",
    adapters={"video": f"{ADAPTERS}:build_video_runner", "stream": f"{ADAPTERS}:build_session_factory"},
)
