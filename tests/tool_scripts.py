"""Import a script by its path as a module, so that its main() and helpers can be tested (examples/ is not a package;
the tools are: import them as `tools.bench.<name>`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative_path: str, *, register: bool = False) -> ModuleType:
    """The script at `relative_path` (from the repository root), imported as a module named after its file;
    `register` also puts it in sys.modules, which dataclasses defined in it need."""
    path = REPO / relative_path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
