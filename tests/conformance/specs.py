"""The models the conformance suite runs: every spec in the registry, and the tests' stand-in (a model from outside
the package, registered the way an out-of-tree model would be; not added to `MODELS` here, so the registry tests keep
their exact lists).

Rank functions take a spec's name, not the spec: specs hold mapping proxies, which do not pickle to a rank pool.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from telefuser.models.registry import MODELS
from telefuser.models.spec import ModelSpec
from tests.stand_in_model.spec import STAND_IN


def specs() -> dict[str, ModelSpec]:
    return {**MODELS, STAND_IN.name: STAND_IN}


def spec_named(name: str) -> ModelSpec:
    return specs()[name]


def each_model():
    """`pytest.mark.parametrize` over every model's name."""
    return pytest.mark.parametrize("name", list(specs()))


def tiny(name: str, seed: int = 0, **options):
    """The model's tiny DiT with seeded random weights (fp32 unless `options` say otherwise)."""
    return spec_named(name).build_random("tiny", seed=seed, **options)


def state_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in state-dict order."""
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.detach().contiguous().flatten().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
