"""The models this package knows, by name. A new model is one folder with a ``spec.py`` and one line in `MODELS`.

    spec = get_spec("minimax_h3")            # KeyError-like UnknownModelError naming the known ones
    names("video")                           # the models a service of that kind can serve

`register` adds a spec at run time, for a model that lives outside the package (the tests' stand-in).
"""

from __future__ import annotations

from .lingbot_world_v2.spec import LINGBOT_WORLD_V2
from .minimax_h3.spec import MINIMAX_H3
from .spec import ModelSpec
from .wan2_2.spec import WAN22_T2V_A14B, WAN22_TI2V_5B

MODELS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (MINIMAX_H3, LINGBOT_WORLD_V2, WAN22_T2V_A14B, WAN22_TI2V_5B)
}


class UnknownModelError(LookupError):
    """No registered spec by that name."""


def register(spec: ModelSpec) -> ModelSpec:
    """Add `spec` under its name; a name already taken by another spec is refused."""
    if MODELS.get(spec.name, spec) is not spec:
        raise ValueError(f"a model named {spec.name!r} is already registered")
    MODELS[spec.name] = spec
    return spec


def names(service: str | None = None) -> list[str]:
    """Every registered model's name, or those with an adapter for a service of kind `service`."""
    return [name for name, spec in MODELS.items() if service is None or spec.serves(service)]


def get_spec(name: str, service: str | None = None) -> ModelSpec:
    """The spec registered as `name`; with `service`, one that the service of that kind can serve."""
    spec = MODELS.get(name)
    if spec is None or (service is not None and not spec.serves(service)):
        known = ", ".join(names(service)) or "none"
        what = f"a {service} service can serve" if service else "registered"
        raise UnknownModelError(f"unknown model {name!r}; models {what}: {known}")
    return spec
