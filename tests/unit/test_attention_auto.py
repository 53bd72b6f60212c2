"""`--attn-impl auto`: MiniMax H3's default, resolved to SageAttention2's SM90 kernel where it is usable and to SDPA
elsewhere; LingBot keeps `sdpa` as its default and its `auto` is SDPA. Explicit names keep their errors, every rank
of a launch agrees on the result (or all raise the same error), and the video service's metadata says which
implementation `auto` chose."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from telefuser.models.flags import AUTO_ATTENTION, attn_impl_flag
from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.models.spec import ModelSpec
from telefuser.ops import attention_registry as registry
from telefuser.ops.attention_registry import AUTO, available_names, check_backend, get_backend, resolve_backend
from telefuser.runtime import Runtime

REPO = Path(__file__).resolve().parents[2]
MINIMAX_AUTO = ("sage_sm90", "sdpa")
CUDA = torch.device("cuda", 0)  # a CUDA device as far as resolution goes: nothing runs on it


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _sage_sm90_usable(usable: bool) -> registry.AttentionBackend:
    """The registered ``sage_sm90`` backend as one whose SM90 build is (or is not) usable on a Hopper GPU here."""
    why = "built, on a Hopper GPU (faked)" if usable else "the SM90 build is missing on this rank (faked)"
    return dataclasses.replace(get_backend("sage_sm90"), available=lambda: (usable, why))


def _with_sage_sm90(monkeypatch):
    """This machine as one with the SM90 build on a Hopper GPU, as far as the registry says."""
    monkeypatch.setitem(registry._BACKENDS, "sage_sm90", _sage_sm90_usable(True))


# -- resolution -------------------------------------------------------------------------------------------------------
def test_auto_picks_sdpa_without_the_sm90_build(no_gpu):
    assert "sage_sm90" not in available_names()
    assert resolve_backend(AUTO, MINIMAX_AUTO) == "sdpa"
    assert resolve_backend(AUTO, MINIMAX_AUTO, CUDA) == "sdpa"
    assert MINIMAX_H3.attention_impl(argparse.Namespace()) == "sdpa"  # the flag's default, auto
    assert MINIMAX_H3.attention_impl(argparse.Namespace(attn_impl=None)) == "sdpa"
    assert LINGBOT_WORLD_V2.attention_impl(argparse.Namespace(attn_impl="auto")) == "sdpa"


def test_auto_picks_sage_sm90_where_it_is_usable(monkeypatch):
    _with_sage_sm90(monkeypatch)
    assert resolve_backend(AUTO, MINIMAX_AUTO) == "sage_sm90"
    assert resolve_backend(AUTO, MINIMAX_AUTO, CUDA) == "sage_sm90"
    assert resolve_backend(AUTO, MINIMAX_AUTO, "cuda:1") == "sage_sm90"
    # a CPU device runs only the host implementations, whatever the GPU could
    assert resolve_backend(AUTO, MINIMAX_AUTO, torch.device("cpu")) == "sdpa"
    runtime = Runtime(None, CUDA, torch.bfloat16)
    official = argparse.Namespace(attn_impl="auto", config="official")
    assert MINIMAX_H3.attention_impl(official, runtime) == "sage_sm90"
    # the tiny sizes' 16-channel heads are not a head dim the kernel takes (64 or 128): SDPA
    assert MINIMAX_H3.attention_impl(argparse.Namespace(attn_impl="auto", config="tiny"), runtime) == "sdpa"
    # a checkpoint's head dim is read when it loads: auto takes the kernel, and the DiT refuses a head dim it cannot
    checkpoint = argparse.Namespace(attn_impl="auto", config="tiny", checkpoint=Path("/ckpt"))
    assert MINIMAX_H3.attention_impl(checkpoint, runtime) == "sage_sm90"
    assert MINIMAX_H3.attention_impl(argparse.Namespace(), Runtime(None, torch.device("cpu"), torch.float32)) == "sdpa"
    # an explicit name is what runs, and LingBot's auto prefers SDPA alone
    assert MINIMAX_H3.attention_impl(argparse.Namespace(attn_impl="sdpa"), runtime) == "sdpa"
    assert LINGBOT_WORLD_V2.attention_impl(argparse.Namespace(attn_impl="auto"), runtime) == "sdpa"
    official = argparse.Namespace(attn_impl="sage_sm90", config="official")
    assert LINGBOT_WORLD_V2.attention_impl(official, runtime) == "sage_sm90"
    # LingBot's tiny heads (16 channels) are refused at the entry point, before anything is built
    with pytest.raises(ValueError, match="'sage_sm90' does not take head dim 16"):
        LINGBOT_WORLD_V2.attention_impl(argparse.Namespace(attn_impl="sage_sm90", config="tiny"), runtime)


def test_auto_skips_the_kernel_for_head_dims_it_does_not_take(monkeypatch):
    _with_sage_sm90(monkeypatch)
    for head_dim, expected in ((64, "sage_sm90"), (128, "sage_sm90"), (16, "sdpa"), (96, "sdpa"), (256, "sdpa")):
        assert resolve_backend(AUTO, MINIMAX_AUTO, CUDA, head_dim) == expected, head_dim
    assert get_backend("sdpa").takes(16)[0] and not get_backend("sage_sm90").takes(16)[0]


def test_the_run_dtype_is_checked_at_the_entry_point_and_auto_skips_what_does_not_take_it(monkeypatch):
    """sage_sm90 runs bf16 and fp16: --dtype float32 with it is refused before any weight loads, naming the
    implementations that take float32, and `auto` falls back to SDPA for a float32 run."""
    _with_sage_sm90(monkeypatch)
    assert check_backend("sage_sm90", head_dim=128, dtype=torch.bfloat16) == "sage_sm90"
    with pytest.raises(ValueError, match=r"'sage_sm90' does not take head dim 128, float32 \(it runs bfloat16, "
                       r"float16, not float32\); implementations that take it: sdpa"):  # fmt: skip
        check_backend("sage_sm90", head_dim=128, dtype=torch.float32)
    assert resolve_backend(AUTO, MINIMAX_AUTO, CUDA, 128, torch.float32) == "sdpa"
    assert resolve_backend(AUTO, MINIMAX_AUTO, CUDA, 128, torch.bfloat16) == "sage_sm90"
    official = argparse.Namespace(attn_impl="sage_sm90", config="official")
    assert MINIMAX_H3.attention_impl(official, Runtime(None, CUDA, torch.bfloat16)) == "sage_sm90"
    with pytest.raises(ValueError, match="does not take head dim 128, float32"):
        MINIMAX_H3.attention_impl(official, Runtime(None, CUDA, torch.float32))
    auto = argparse.Namespace(attn_impl="auto", config="official")
    assert MINIMAX_H3.attention_impl(auto, Runtime(None, CUDA, torch.float32)) == "sdpa"


def test_a_dit_warns_when_its_backend_failed_the_quality_gate(monkeypatch, caplog):
    """A backend that failed a model's quality gate still runs as asked, with a warning naming where the result is;
    the others run without one."""
    from telefuser.models.wan2_2 import dit as wan_dit
    from telefuser.models.wan2_2.config import release

    config = release("t2v-a14b", "tiny").dit
    with caplog.at_level("WARNING", logger="telefuser.attention"):
        wan_dit.Wan22DiT(config, attn_impl="sdpa")
    assert not caplog.records and wan_dit.FAILED_ATTENTION_GATES == {"cudnn_fp8": "docs/perf/2026-12-07"}
    monkeypatch.setattr(wan_dit, "FAILED_ATTENTION_GATES", {"sdpa": "docs/perf/somewhere"})
    with caplog.at_level("WARNING", logger="telefuser.attention"):
        model = wan_dit.Wan22DiT(config, attn_impl="sdpa")
    assert model.attn_impl == "sdpa"
    assert [r.getMessage() for r in caplog.records] == [
        "Wan 2.2 with sdpa attention failed the quality gate against bf16 attention (cosine below 0.99 on random "
        "weights; docs/perf/somewhere); check the quality"
    ]


def test_a_minimax_dit_refuses_sage_sm90_at_a_head_dim_the_kernel_does_not_take(monkeypatch):
    from telefuser.models.minimax_h3 import dit as dit_module
    from telefuser.models.minimax_h3.config import MiniMaxH3Config

    _with_sage_sm90(monkeypatch)  # as if the kernel were installed
    with pytest.raises(
        ValueError,
        match=r"^attention implementation 'sage_sm90' does not take head dim 16 \(it runs head dims 64, 128\); "
        r"implementations that take it: sdpa, flash_attn_4, sage, cudnn_fp8$",
    ):
        dit_module.MiniMaxH3DiT(MiniMaxH3Config.tiny(), attn_impl="sage_sm90")
    assert dit_module.MiniMaxH3DiT(MiniMaxH3Config.tiny(), attn_impl="sdpa").attn_impl == "sdpa"


def test_explicit_names_are_refused_as_before_when_missing(no_gpu):
    for impl in ("sage_sm90", "cudnn_fp8"):
        with pytest.raises(RuntimeError, match=rf"implementation '{impl}' was asked for but no CUDA GPU"):
            resolve_backend(impl, MINIMAX_AUTO)
        with pytest.raises(RuntimeError, match=rf"implementation '{impl}' was asked for but no CUDA GPU"):
            MINIMAX_H3.attention_impl(argparse.Namespace(attn_impl=impl))
    assert resolve_backend("sdpa", MINIMAX_AUTO) == "sdpa"
    assert resolve_backend("identity", MINIMAX_AUTO) == "identity"  # the ops' test-only one, as before


def test_unknown_names_and_bad_preferences_are_refused():
    with pytest.raises(ValueError, match=r"unknown attention implementation 'flash'; choose one of sdpa, flash_attn_4"):
        resolve_backend("flash", MINIMAX_AUTO)
    # "auto" is no backend: a tool that takes an explicit implementation says so
    with pytest.raises(ValueError, match=r"'auto' is resolved by a model's entry point .*name one here: sdpa,"):
        check_backend(AUTO)
    with pytest.raises(
        ValueError, match=r"'auto' needs a preference of known attention implementations, got \['x', 'sdpa'\]"
    ):
        resolve_backend(AUTO, ("x", "sdpa"))
    with pytest.raises(ValueError, match=r"got \[\]"):
        resolve_backend(AUTO, ())


def test_auto_with_nothing_usable_names_what_it_looked_for(no_gpu):
    with pytest.raises(RuntimeError, match=r"'auto' found none of sage_sm90, cudnn_fp8 usable here \(usable: sdpa"):
        resolve_backend(AUTO, ("sage_sm90", "cudnn_fp8"))


# -- the flags and specs ----------------------------------------------------------------------------------------------
def test_minimax_defaults_to_auto_and_lingbot_keeps_sdpa():
    assert AUTO_ATTENTION == AUTO
    minimax, lingbot = MINIMAX_H3.flag("attn_impl"), LINGBOT_WORLD_V2.flag("attn_impl")
    assert (minimax.default, lingbot.default) == ("auto", "sdpa")
    assert MINIMAX_H3.auto_attention == MINIMAX_AUTO and LINGBOT_WORLD_V2.auto_attention == ("sdpa",)
    for spec, flag in ((MINIMAX_H3, minimax), (LINGBOT_WORLD_V2, lingbot)):
        assert tuple(flag.options["choices"]) == (*spec.attention_impls, "auto")
        assert "auto" not in spec.attention_impls  # the explicit ones, as the benches offer them
    assert "auto: the first of sage_sm90, sdpa usable on this machine" in minimax.options["help"]
    assert "auto: the first of sdpa usable" in lingbot.options["help"]


def test_the_services_default_and_help_say_what_auto_picks():
    from telefuser.cli import build_parser
    from telefuser.serving.common.model_args import chosen_spec

    args = build_parser().parse_args(["serve"])
    chosen_spec(args, service="video", command="serve")
    assert args.attn_impl == "auto"
    args = build_parser().parse_args(["serve", "--attn-impl", "sage_sm90"])
    chosen_spec(args, service="video", command="serve")
    assert args.attn_impl == "sage_sm90"
    args = build_parser().parse_args(["serve-stream"])
    chosen_spec(args, service="stream", command="serve-stream")
    assert args.attn_impl == "sdpa"
    parser = build_parser()
    serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    text = " ".join(serve.format_help().split())
    assert "--attn-impl {sdpa,flash_attn_4,sage,cudnn_fp8,sage_sm90,auto}" in text
    assert "(default auto); auto: the first of sage_sm90, sdpa usable on this machine and device" in text


def test_a_tool_narrowing_the_choices_keeps_an_explicit_default():
    """A bench offers the explicit implementations only: MiniMax's auto default becomes their first, SDPA."""
    parser = argparse.ArgumentParser()
    MINIMAX_H3.flag("attn_impl").add_to(parser, choices=(*MINIMAX_H3.attention_impls, "identity"))
    assert parser.parse_args([]).attn_impl == "sdpa"
    assert "(default sdpa)" in " ".join(parser.format_help().split())
    with pytest.raises(SystemExit):
        parser.parse_args(["--attn-impl", "auto"])
    parser = argparse.ArgumentParser()
    MINIMAX_H3.flag("attn_impl").add_to(parser, choices=("cudnn_fp8", "sdpa"), default="sdpa")  # its own default
    assert parser.parse_args([]).attn_impl == "sdpa"
    parser = argparse.ArgumentParser()
    MINIMAX_H3.flag("attn_impl").add_to(parser, default=None)  # None: the service's default, shown in the help
    assert parser.parse_args([]).attn_impl is None and "(default auto)" in " ".join(parser.format_help().split())
    from tools.bench.minimax_h3_dit_bench import parse_args

    # the DiT bench offers auto too (its default, resolved as the model's entry points resolve it) and keeps the rest
    assert parse_args([]).attn_impl == "auto" and parse_args(["--attn-impl", "sdpa"]).attn_impl == "sdpa"
    with pytest.raises(SystemExit):
        parse_args(["--attn-impl", "flash"])


def test_a_spec_whose_auto_names_an_impl_it_does_not_run_is_refused():
    fields = {"name": "m", "title": "m", "model_class": "x:Y", "flags": (attn_impl_flag(),), "plan": None}
    fields.update(quantizations=("none",), pipeline="x:build")
    assert ModelSpec(**fields, attention_impls=("sdpa",)).auto_attention == ("sdpa",)
    with pytest.raises(ValueError, match=r"m: auto_attention \('sage_sm90',\) must name some of \('sdpa',\)"):
        ModelSpec(**fields, attention_impls=("sdpa",), auto_attention=("sage_sm90",))


def test_the_specs_and_their_attention_flags_import_no_torch():
    code = (
        "import argparse, sys\n"
        "from telefuser.models.minimax_h3.spec import MINIMAX_H3\n"
        "from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2\n"
        "p = argparse.ArgumentParser(); MINIMAX_H3.add_flags(p)\n"
        "args = p.parse_args([])\n"
        "print(MINIMAX_H3.option(args, 'attn_impl'), MINIMAX_H3.auto_attention, LINGBOT_WORLD_V2.auto_attention,\n"
        "      'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["auto", "('sage_sm90',", "'sdpa')", "('sdpa',)", "False"], done.stdout


# -- every rank agrees ------------------------------------------------------------------------------------------------
def _resolve_on_ranks(ctx, requested: str, sage_on_ranks: tuple[int, ...]):
    """Resolve `requested` with MiniMax's spec on a two-rank launch where only `sage_on_ranks` have the SM90 build;
    return ("ok", impl) or ("error", type, message), after a barrier that shows no rank was left in a collective."""
    import torch.distributed as dist

    real = get_backend("sage_sm90")
    registry._BACKENDS["sage_sm90"] = _sage_sm90_usable(ctx.rank in sage_on_ranks)
    runtime = Runtime(SimpleNamespace(world_size=ctx.world_size, rank=ctx.rank), CUDA, torch.bfloat16)
    try:
        args = argparse.Namespace(attn_impl=requested, config="official")  # 128-channel heads, which the kernel takes
        outcome = ("ok", MINIMAX_H3.attention_impl(args, runtime))
    except (RuntimeError, ValueError) as exc:
        outcome = ("error", type(exc).__name__, str(exc))
    finally:
        registry._BACKENDS["sage_sm90"] = real
    dist.barrier()
    return outcome


def test_ranks_that_resolve_auto_differently_all_raise_the_same_error(ranks2):
    outcomes = ranks2.run(_resolve_on_ranks, "auto", (1,), timeout=60)
    assert outcomes[0] == outcomes[1], outcomes
    kind, message = outcomes[0][1:]
    assert kind == "RuntimeError"
    assert message.startswith(
        "ranks disagree on the attention implementation (--attn-impl auto) (rank 0: sdpa, rank 1: sage_sm90); "
        "install the same attention backends on every rank's host, or pass an explicit --attn-impl"
    ), message


def test_ranks_that_agree_all_run_it(ranks2):
    assert ranks2.run(_resolve_on_ranks, "auto", (0, 1), timeout=60) == [("ok", "sage_sm90")] * 2
    assert ranks2.run(_resolve_on_ranks, "auto", (), timeout=60) == [("ok", "sdpa")] * 2
    assert ranks2.run(_resolve_on_ranks, "sdpa", (0,), timeout=60) == [("ok", "sdpa")] * 2


def test_an_explicit_impl_one_rank_lacks_fails_on_every_rank(ranks2):
    outcomes = ranks2.run(_resolve_on_ranks, "sage_sm90", (0,), timeout=60)
    assert outcomes[0] == outcomes[1], outcomes
    kind, message = outcomes[0][1:]
    assert kind == "RuntimeError" and message.startswith(
        "the attention implementation (--attn-impl sage_sm90): rank 1: AttentionUnavailableError: attention implementation "
        "'sage_sm90' was asked for but"
    ), message
    # every rank failing alike raises its own error, as one process would
    outcomes = ranks2.run(_resolve_on_ranks, "flash", (), timeout=60)
    assert outcomes[0] == outcomes[1] and outcomes[0][1] == "ValueError", outcomes
    assert outcomes[0][2].startswith("unknown attention implementation 'flash'"), outcomes


# -- the video service says what auto chose ----------------------------------------------------------------------------
def test_serve_reports_the_resolved_and_the_requested_attention(tmp_path):
    from fastapi.testclient import TestClient

    from telefuser.cli import build_parser
    from telefuser.serving.common.model_args import chosen_spec
    from telefuser.serving.video.app import create_video_app

    args = build_parser().parse_args(["serve", "--config", "tiny", "--device", "cpu", "--dtype", "float32"])
    spec = chosen_spec(args, service="video", command="serve")
    runner = spec.adapter_builder("video")(args)  # as `telefuser serve` builds it: --attn-impl left at its default
    try:
        assert runner._pipe.dit.attn_impl == "sdpa"  # what the model runs
        with TestClient(create_video_app(runner, output_dir=tmp_path)) as client:
            model = client.get("/v1/service/metadata").json()["model"]
        assert (model["attn_impl"], model["attn_impl_requested"]) == ("sdpa", "auto")
    finally:
        runner.close()


def test_a_backend_the_run_cannot_take_ends_a_service_start_in_one_line(monkeypatch):
    from telefuser.ops.attention_registry import AttentionBackendError
    from telefuser.serving.common.startup import explain_build_error

    _with_sage_sm90(monkeypatch)
    with pytest.raises(AttentionBackendError) as refused:
        check_backend("sage_sm90", head_dim=16, dtype=torch.float32)
    mistake = explain_build_error(refused.value)
    assert mistake is not None and str(mistake.code).endswith(
        "pass one of the implementations named, or --attn-impl auto"
    )


def test_wan2_2_auto_picks_sage_sm90_where_it_is_usable(monkeypatch):
    """Wan 2.2 passed its `sage_sm90` gate (docs/perf/2026-12-07), so its default `auto` takes the kernel as MiniMax
    H3's does: on CUDA with the build and 128-channel heads; SDPA on the CPU and for the tiny sizes' heads."""
    from telefuser.models.registry import get_spec

    _with_sage_sm90(monkeypatch)
    runtime = Runtime(None, CUDA, torch.bfloat16)
    for name in ("wan2.2-t2v-a14b", "wan2.2-ti2v-5b"):
        spec = get_spec(name)
        assert spec.attention_impl(argparse.Namespace(config="official"), runtime) == "sage_sm90"
        assert spec.attention_impl(argparse.Namespace(attn_impl="auto", config="tiny"), runtime) == "sdpa"
        cpu = Runtime(None, torch.device("cpu"), torch.bfloat16)
        assert spec.attention_impl(argparse.Namespace(config="official"), cpu) == "sdpa"


def test_wan2_2_auto_is_sdpa_without_the_sm90_build(no_gpu):
    from telefuser.models.registry import get_spec

    assert get_spec("wan2.2-t2v-a14b").attention_impl(argparse.Namespace()) == "sdpa"
