"""`ReleasedConfig`: ``from_dict`` / ``from_json`` / ``to_dict`` for a config named after a released ``config.json``.

Metadata keys (``_class_name`` ...) are skipped silently, other unknown keys logged and ignored.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, fields
from pathlib import Path
from typing import ClassVar, TypeVar

ConfigT = TypeVar("ConfigT", bound="ReleasedConfig")


class ReleasedConfig:
    """Inherit it from a frozen dataclass config and set, as plain class attributes: `required_keys` (the keys a
    released config must carry: they fix weight shapes), `config_error` (the model package's ValueError subclass),
    `model_label` (the model's name in messages) and `logger` (the config module's own, for ignored keys). Tuple
    fields (``patch_size``) are written as JSON lists."""

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
