"""The README's "How many GPUs of what size" table says what `telefuser plan` chooses; it must keep saying so.

Every row is re-planned here through the CLI (in-process, no GPU) and its tier, resident blocks, peak and pinned host
memory compared with the plan's output, so a recalibrated memory term that moves a row fails CI until the README
follows. The row's flags come from its model and layout cells; an unknown cell fails rather than being skipped.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from telefuser.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "### How many GPUs of what size"

# The "model, request" cell's text -> the flags of that request (the README words each row for a reader).
MODELS = {
    "MiniMax H3, 1344×768, 5 s, bf16": "--model minimax_h3".split(),
    "MiniMax H3, FP8 GEMMs": "--model minimax_h3 --quantization fp8".split(),
    "LingBot-World v2, 832×480 session, bf16, `--vae-dtype bfloat16 --vae-fast`": (
        "--model lingbot_world_v2 --vae-dtype bfloat16 --vae-fast".split()
    ),
    "LingBot-World v2, FP8 GEMMs, the same VAE flags": (
        "--model lingbot_world_v2 --vae-dtype bfloat16 --vae-fast --quantization fp8".split()
    ),
    "Wan 2.2 T2V-A14B, 1280×720, 81 frames, bf16": "--model wan2.2-t2v-a14b --resolution 1280x720".split(),
    "Wan 2.2 T2V-A14B, 832×480, 81 frames, bf16": "--model wan2.2-t2v-a14b --resolution 832x480".split(),
}


def _degrees(layout: str) -> tuple[int, int]:
    """(TP, Ulysses) of the layout cell."""
    if layout == "one GPU":
        return 1, 1
    match = re.fullmatch(r"(?:TP(\d) × )?Ulysses(\d)", layout)
    if not match:
        raise AssertionError(f"the README's layout {layout!r} is not one this test knows")
    return int(match.group(1) or 1), int(match.group(2))


def readme_rows() -> list[dict[str, str]]:
    """The table's rows as dicts, a blank model cell meaning the row above's model."""
    text = README.read_text()
    assert HEADING in text, f"README.md lost its section {HEADING!r}"
    lines = text.split(HEADING, 1)[1].splitlines()
    section = lines[: next(i for i, line in enumerate(lines) if line.startswith("## "))]
    table = [line for line in section if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows, model = [], ""
    for line in table[2:]:
        cells = dict(zip(header, (cell.strip() for cell in line.strip().strip("|").split("|")), strict=True))
        model = cells["model, request"] or model
        rows.append({**cells, "model, request": model})
    return rows


def plan_output(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["plan", "--config", "official", *argv])
    return out.getvalue()


def _number(cell: str) -> str:
    match = re.fullmatch(r"([\d.]+) GiB|(0)", cell)
    assert match, f"unexpected cell {cell!r}"
    return match.group(1) or "0.0"


ROWS = readme_rows()


def test_the_table_has_every_model_and_each_row_a_known_request():
    assert len(ROWS) >= 20, "the table was cut short or not parsed"
    assert {row["model, request"] for row in ROWS} == set(MODELS)


@pytest.mark.parametrize(
    "row", ROWS, ids=[f"{r['model, request'][:24]}|{r['layout']}|{r['GPUs × memory']}".replace("×", "x") for r in ROWS]
)
def test_each_row_is_what_the_plan_chooses(row):
    gpus, card = re.fullmatch(r"(\d) × (\d+) GB", row["GPUs × memory"]).groups()
    tp, ulysses = _degrees(row["layout"])
    assert int(gpus) == tp * ulysses, row
    degrees = ["--tp-degree", str(tp), "--ulysses-degree", str(ulysses)]
    output = plan_output([*MODELS[row["model, request"]], *degrees, "--gpu-memory-gb", card])
    offload = row["`--offload` (plan)"]
    if offload.startswith("refused"):
        assert "\nrefused: " in output, output
        needed = re.search(r"`block` needs ([\d.]+) GiB", offload).group(1)
        assert f"--offload block needs {needed} GiB" in output, output
        return
    chosen = next(line for line in output.splitlines() if line.startswith("chosen: "))
    tier = offload.split()[0]
    assert chosen.startswith(f"chosen: --offload {tier}: peak {_number(row['peak per GPU, plan'])} GiB"), chosen
    pinned = _number(row["pinned host memory per GPU"])
    if pinned == "0.0":
        assert "pinned host memory" not in chosen, chosen
    else:
        assert f"; {pinned} GiB pinned host memory" in chosen, chosen
    resident = re.search(r"(\d+) of (\d+)", offload)
    if resident:  # the block tier names how many DiT blocks stay on the GPU
        assert re.search(rf"\b{resident.group(1)}/{resident.group(2)} layers resident", chosen), chosen


def test_a_row_that_disagrees_with_the_plan_fails():
    """Negative control: the 32 GB MiniMax row with another peak must not pass."""
    row = next(
        r for r in ROWS if r["model, request"].startswith("MiniMax H3, 1344") and r["GPUs × memory"] == "1 × 32 GB"
    )
    wrong = {**row, "peak per GPU, plan": "27.3 GiB"}
    with pytest.raises(AssertionError, match="chosen: --offload block: peak "):
        test_each_row_is_what_the_plan_chooses(wrong)
