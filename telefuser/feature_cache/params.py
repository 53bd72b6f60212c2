"""AdaTaylorCache parameter files: calibrated magnitude ratios plus the skip-schedule knobs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PARAMS_DIR = Path(__file__).parent / "params"


@dataclass(frozen=True)
class AdaTaylorParams:
    mag_ratios: tuple[float, ...]
    K: int = 2
    retention_ratio: float = 0.2
    thresh: float = 0.03
    sigma_shift: float | None = None
    num_inference_steps: int | None = None  # DiT calls the ratios were calibrated over
    notes: dict = field(default_factory=dict)

    @property
    def is_placeholder(self) -> bool:
        """True for parameters whose ``_provenance`` declares them a placeholder (not calibrated on real weights)."""
        return str(self.notes.get("_provenance", "")).upper().startswith("PLACEHOLDER")

    @classmethod
    def load(cls, path: str | Path) -> AdaTaylorParams:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        # Single-branch files (H3) may carry only ``mag_ratios``; CFG-style files carry cond/uncond lists.
        ratios = raw.get("mag_ratios", raw.get("cond_mag_ratios"))
        if not ratios:
            raise ValueError(f"{path} has no mag_ratios / cond_mag_ratios")
        return cls(
            mag_ratios=tuple(float(r) for r in ratios),
            K=int(raw.get("K", 2)),
            retention_ratio=float(raw.get("retention_ratio", 0.2)),
            thresh=float(raw.get("thresh", 0.03)),
            sigma_shift=raw.get("sigma_shift"),
            num_inference_steps=raw.get("num_inference_steps"),
            notes={k: v for k, v in raw.items() if k.startswith("_")},
        )

    def save(self, path: str | Path) -> None:
        payload = {k: v for k, v in asdict(self).items() if k not in ("mag_ratios", "notes")}
        ratios = list(self.mag_ratios)
        # Written under the shared names too, so the file reads the same as the reference's single-branch files.
        payload.update(mag_ratios=ratios, cond_mag_ratios=ratios, uncond_mag_ratios=ratios, **self.notes)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def params_path(model: str) -> Path:
    """The bundled parameter file of a model, e.g. ``minimax_h3``."""
    path = PARAMS_DIR / f"{model}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no AdaTaylorCache parameters for {model!r} (expected {path})")
    return path
