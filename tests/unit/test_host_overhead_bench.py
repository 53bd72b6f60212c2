"""tools/bench/host_overhead_bench.py on the CPU: `call` runs every registered model's tiny DiT through its spec (the
example forward at the spec's tiny shape) as pieces and as regions, and the old `minimax` mode still means MiniMax H3's
call. The timings and compile counts themselves are a GPU matter (a CPU compiles no regions)."""

from __future__ import annotations

import importlib
import json

import pytest

from telefuser.models import registry


def _bench():
    return importlib.import_module("tools.bench.host_overhead_bench")


@pytest.mark.parametrize("model", registry.names())
def test_call_runs_every_registered_model_as_pieces_and_regions(model, tmp_path):
    out = tmp_path / "call.json"
    argv = ["call", "--model", model, "--config", "tiny", "--device", "cpu", "--iters", "1", "--variants", "bf16"]
    assert _bench().main(argv + ["--output", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["path"] for row in rows] == ["pieces", "regions"]
    for row in rows:
        assert row["model"] == model and row["layers"] == 2 and row["quantization"] == "none"
        assert row["seconds_per_call"] > 0 and row["enqueue_s"] > 0
        assert row["compiles_while_timed"] == 0


def test_the_modes_name_their_model_once():
    bench = _bench()
    args = bench.parse_args(["minimax", "--layers", "8", "--variants", "bf16"])  # the spelling the plans use
    assert (args.mode, args.model, args.layers) == ("call", "minimax_h3", 8)
    assert bench.parse_args(["call", "--model", "wan2.2-ti2v-5b"]).model == "wan2.2-ti2v-5b"
    assert bench.parse_args(["forward"]).model is None  # forward and session measure the session model
    for refused in (["call"], ["forward", "--model", "minimax_h3"], ["minimax", "--model", "lingbot_world_v2"]):
        with pytest.raises(SystemExit):
            bench.parse_args(refused)
    with pytest.raises(SystemExit):
        bench.parse_args(["call", "--model", "minimax"])  # registry names only
