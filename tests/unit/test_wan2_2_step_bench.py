"""tools/bench/wan2_2_step_bench.py on the CPU: the tiny DiT on a small canvas, both sides compiled (aot_eager: the
tracing without code generation, seconds on 2 cores), a report whose figures add up; bad shapes refused by name. The
timings themselves are a GPU matter (tools/run plan wan-step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from telefuser.models.registry import get_spec
from telefuser.ops.compile_stats import count_compiled
from tools.bench import wan2_2_step_bench as bench

SMOKE = ["--config", "tiny", "--device", "cpu", "--frames", "5", "--warmup", "1", "--iters", "2"]


def test_the_smoke_run_times_both_sides_on_compiled_code_and_reports_them(tmp_path, capsys):
    out = tmp_path / "wan_step.json"
    argv = [*SMOKE, "--resolutions", "64x32,32x32", "--compile-backend", "aot_eager", "--output", str(out)]
    with count_compiled() as stats:
        assert bench.main(argv) == 0
    spec, config = get_spec("wan2.2-t2v-a14b"), get_spec("wan2.2-t2v-a14b").config_of("tiny")
    # ours ran as compiled regions: one call per block, per resolution, per warm-up and timed call
    assert stats.calls == config.num_layers * 2 * (1 + 2)
    report = json.loads(out.read_text())
    assert report["sides"] == ["ours", "diffusers"] and report["diffusers"]["attention_backend"] == "native"
    assert report["weights"].startswith("random") and report["batch"] == 2
    for row, (width, height, grid) in zip(report["rows"], [(64, 32, [2, 4, 8]), (32, 32, [2, 4, 4])], strict=True):
        assert (row["width"], row["height"], row["latent"]) == (width, height, grid)
        assert row["tokens"] == 2 * (grid[1] // 2) * (grid[2] // 2)
        shape = dict(batch=2, frames=grid[0], height=grid[1], width=grid[2], text_rows=config.text_len)
        assert row["flops"] == spec.forward_flops(config, **shape)
        for side in ("ours", "diffusers"):
            r = row[side]
            assert len(r["times_s"]) == 2 and r["median_s"] > 0 and r["finite"] and r["peak_bytes"] is None
            assert r["weights_bytes"] > 0
        assert row["speedup"] == pytest.approx(row["diffusers"]["median_s"] / row["ours"]["median_s"])
    printed = capsys.readouterr().out
    assert "| resolution | latent grid | tokens | side | s/step |" in printed and "64x32: " in printed


def test_one_side_alone_has_no_speed_up(tmp_path):
    out = tmp_path / "ours.json"
    argv = [*SMOKE, "--resolutions", "32x32", "--compile-backend", "none", "--sides", "ours", "--output", str(out)]
    assert bench.main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert "diffusers" not in row and "speedup" not in row


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--frames", "6"], r"--frames must be 4n \+ 1"),
        (["--resolutions", "60x32"], r"60x32 must be multiples of 16x16"),
    ],
)
def test_shapes_the_vae_and_patch_cannot_take_are_refused_by_name(argv, message):
    with pytest.raises(SystemExit, match=message):
        bench.main([*SMOKE, "--resolutions", "32x32", *argv])


def test_the_official_sizes_are_the_releases():
    args = bench.parse_args([])
    assert [r[0] for r in args.resolutions] == ["480p", "720p"] and args.frames == 81
    config = get_spec("wan2.2-t2v-a14b").config_of("official")
    assert bench.latent_grid(config, 81, 832, 480) == (21, 60, 104)  # 32,760 tokens
    assert bench.latent_grid(config, 81, 1280, 720) == (21, 90, 160)  # 75,600 tokens
    assert torch.bfloat16 == bench.DTYPE


def test_the_wan_step_plan_skips_its_bench_only_where_the_checkout_lacks_it(tmp_path):
    import subprocess

    from tools.run.plans import COMPARE_COMMIT, PLANS

    plan = PLANS["wan-step"]
    assert plan.baseline == ".baseline"  # the LingBot and MiniMax steps run before and after, interleaved
    assert plan.step("lingbot_official") == COMPARE_COMMIT.step("lingbot_official")
    assert plan.step("minimax_official") == COMPARE_COMMIT.step("minimax_official")
    for name, resolution in (("wan_480p", "480p"), ("wan_720p", "720p")):
        step = plan.step(name)
        assert "tools.bench.wan2_2_step_bench" in step.argv and resolution in step.argv
        absent = subprocess.run(step.skip_if, cwd=tmp_path).returncode  # a baseline from before the bench: skip
        present = subprocess.run(step.skip_if, cwd=Path(bench.__file__).parents[2]).returncode  # the tree
        assert (absent, present) == (0, 1)
