"""run_t2va.py as users run H3: keyframes, references and LoRAs on the command line (tiny random model, CPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples/minimax_h3/run_t2va.py"


def _script():
    spec = importlib.util.spec_from_file_location("run_t2va", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lora_and_reference_arguments():
    script = _script()
    assert script.lora_argument("a/b.safetensors:0.5") == (Path("a/b.safetensors"), 0.5)
    assert script.lora_argument("a/b.safetensors") == (Path("a/b.safetensors"), 1.0)
    assert script.lora_argument("C:/loras/x.safetensors") == (Path("C:/loras/x.safetensors"), 1.0)
    kinds = [script.reference_kind(Path(name)) for name in ("a.PNG", "b.mp4", "c.wav")]
    assert kinds == ["image", "video", "audio"]
    with pytest.raises(ValueError, match="cannot tell"):
        script.reference_kind(Path("notes.txt"))


def _tiny_lora(path: Path) -> Path:
    from telefuser.models.minimax_h3 import MiniMaxH3Config
    from telefuser.models.minimax_h3.dit import MiniMaxH3DiT

    with torch.device("meta"):
        model = MiniMaxH3DiT(MiniMaxH3Config.tiny())
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name in ("blocks.0.attn.qkv_proj", "blocks.1.mlp.fc1"):
        rows, columns = model.get_submodule(name).weight.shape
        tensors[f"diffusion_model.{name}.lora_A.weight"] = torch.randn(4, columns, generator=g) * 0.1
        tensors[f"diffusion_model.{name}.lora_B.weight"] = torch.randn(rows, 4, generator=g) * 0.1
    save_file(tensors, str(path))
    return path


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "clip.mp4"
    args = [sys.executable, str(SCRIPT), "--config", "tiny", "--device", "cpu", "--dtype", "float32", "--duration"]
    args += ["1", "--resolution", "32", "--steps", "3", "--no-progress", "--output", str(out), *extra]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.with_suffix(".json").read_text())


def test_first_and_last_keyframes_with_a_merged_lora(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("first.png", "last.png"):
        Image.fromarray(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)).save(tmp_path / name)
    lora = _tiny_lora(tmp_path / "tiny_lora.safetensors")
    metrics = _run(
        tmp_path, "--image", str(tmp_path / "first.png"), "--last-image", str(tmp_path / "last.png"),
        "--lora", f"{lora}:0.5",
    )  # fmt: skip
    assert metrics["launch"]["task"] == "fl2va" and metrics["weights"]["loras"] == "tiny_lora x0.5"
    assert metrics["frames"] == 39


def test_a_lora_for_the_other_partition_is_refused_before_loading(tmp_path):
    lora = tmp_path / "ref.safetensors"
    save_file({"transformer_ref.blocks.0.attn.qkv_proj.lora_A.weight": torch.zeros(2, 8)}, str(lora))
    args = [sys.executable, str(SCRIPT), "--config", "tiny", "--device", "cpu", "--lora", str(lora), "--no-progress"]
    done = subprocess.run(args + ["--output", str(tmp_path / "x.mp4")], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and not (tmp_path / "x.mp4").exists()
    assert "Traceback" not in done.stderr and "error:" in done.stderr, done.stderr[-2000:]
    assert "Ref2VA" in done.stderr or "transformer_ref" in done.stderr, done.stderr[-2000:]
