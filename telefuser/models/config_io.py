"""`ReleasedConfig`: ``from_dict`` / ``from_json`` / ``to_dict`` for a frozen dataclass config whose field names are
those of a released ``config.json``.

A config class inherits it and sets, as plain (unannotated) class attributes:

- ``required_keys``: the keys a released config must carry (they fix weight shapes);
- ``config_error``: the exception class to raise (a `ValueError` subclass of the model package);
- ``model_label``: the model's name in messages ("no <label> config at ...", "missing required <label> keys");
- ``logger``: the logger that reports ignored keys (the config module's own, so its name stays the module's).

Metadata keys (``_class_name``, ``_diffusers_version`` ...) are skipped silently; other unknown keys are logged and
ignored. Tuple fields (``patch_size``) are written as JSON lists.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, fields
from pathlib import Path
from typing import ClassVar, TypeVar

ConfigT = TypeVar("ConfigT", bound="ReleasedConfig")


class ReleasedConfig:
    required_keys: ClassVar[tuple[str, ...]]
    config_error: ClassVar[type[ValueError]]
    model_label: ClassVar[str]
    logger: ClassVar[logging.Logger]

    @classmethod
    def from_dict(cls: type[ConfigT], payload: dict, *, source: str = "config") -> ConfigT:
        missing = [key for key in cls.required_keys if key not in payload]
        if missing:
            raise cls.config_error(f"{source} is missing required {cls.model_label} keys: {', '.join(missing)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in payload if k not in known and not k.startswith("_"))
        if unknown:
            cls.logger.info("%s: ignoring keys this DiT does not use: %s", source, ", ".join(unknown))
        return cls(**{k: v for k, v in payload.items() if k in known})

    @classmethod
    def from_json(cls: type[ConfigT], path: str | Path) -> ConfigT:
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise cls.config_error(f"no {cls.model_label} config at {path}") from None
        if not isinstance(payload, dict):
            raise cls.config_error(f"{path} does not hold a JSON object")
        return cls.from_dict(payload, source=str(path))

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
