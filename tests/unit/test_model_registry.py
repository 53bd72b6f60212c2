"""Models come from the registry: specs by name, flags declared once by each spec, and a new model served by both
services' command lines with nothing changed outside its own folder (tests/stand_in_model)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from telefuser.cli import build_parser
from telefuser.models import registry
from telefuser.models.flags import ATTENTION_IMPLS, QUANTIZATIONS
from telefuser.serving.common.model_args import chosen_spec
from tools.harness.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


# -- the registry -----------------------------------------------------------------------------------------------------
def test_each_service_lists_the_models_it_can_serve():
    assert registry.names() == ["minimax_h3", "lingbot_world_v2", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"]
    video = ["minimax_h3", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"]
    assert registry.names("video") == video and registry.names("stream") == ["lingbot_world_v2"]
    with pytest.raises(registry.UnknownModelError, match=r"unknown model 'wan'; models registered: minimax_h3, ling"):
        registry.get_spec("wan")
    with pytest.raises(registry.UnknownModelError, match=r"a stream service can serve: lingbot_world_v2"):
        registry.get_spec("minimax_h3", "stream")
    assert "(models: minimax_h3, wan2.2-t2v-a14b, wan2.2-ti2v-5b)" in " ".join(build_parser().format_help().split())
    serve_help = " ".join(_subparser("serve").format_help().split())
    assert "--model MODEL the model to serve (default minimax_h3); minimax_h3: MiniMax H3" in serve_help
    assert "lingbot_world_v2: LingBot-World v2" in " ".join(_subparser("serve-stream").format_help().split())


def test_an_unknown_model_or_a_flag_of_another_model_is_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "lingbot_world_v2"])
    assert "unknown model 'lingbot_world_v2'; models a video service can serve: minimax_h3" in capsys.readouterr().err
    args = build_parser().parse_args(["serve-stream", "--fake"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve-stream", "--qkv-layout", "stacked"])  # only serve's model has it
    spec = chosen_spec(args, service="stream", command="serve-stream")
    assert spec.name == "lingbot_world_v2" and (args.config, args.attn_impl, args.cuda_graphs) == (
        "official",  # the spec's serve default: a service runs the released sizes unless told
        "sdpa",
        "auto",
    )


def test_a_flag_shared_by_two_models_is_checked_against_the_chosen_ones(monkeypatch):
    from tests.stand_in_model.spec import STAND_IN

    monkeypatch.setitem(registry.MODELS, STAND_IN.name, STAND_IN)
    args = build_parser().parse_args(["serve", "--model", "stand_in", "--qkv-layout", "stacked"])
    with pytest.raises(SystemExit, match=r"--qkv-layout is not a flag of --model stand_in \(its flags: --tint\)"):
        chosen_spec(args, service="video", command="serve")
    args = build_parser().parse_args(["serve", "--model", "stand_in"])
    assert chosen_spec(args, service="video", command="serve") is STAND_IN and args.tint == "grey"


# -- flags, declared once ---------------------------------------------------------------------------------------------
def _subparser(command: str):
    parser = build_parser()
    return next(a for a in parser._actions if a.dest == "command").choices[command]


def test_model_flags_are_declared_by_the_specs_only():
    """No entry point in the package or the examples declares a model's flag itself, and no tool its attention or
    quantization choice: they add the spec's."""
    flags = {name for spec in registry.MODELS.values() for flag in spec.flags for name in flag.names}
    sources = [*REPO.glob("telefuser/**/*.py"), *REPO.glob("examples/**/*.py")]
    tools = [*REPO.glob("tools/**/*.py")]  # benches keep their own --config (tiny/official sizes) and --checkpoint
    declared = re.compile(r"add_argument\(\s*\"(--[a-z0-9-]+)\"")
    again = sorted(
        f"{path.relative_to(REPO)}: {flag}"
        for path in sources + tools
        for flag in declared.findall(path.read_text(encoding="utf-8"))
        if flag in flags and (path not in tools or flag in ("--attn-impl", "--quantization"))
    )
    assert again == []
    serve = {a.dest: a for a in _subparser("serve")._actions}
    assert tuple(serve["attn_impl"].choices) == (*registry.get_spec("minimax_h3").attention_impls, "auto")
    from examples.lingbot_world_v2.run_i2v import parse_args

    args = parse_args(["--vae-dtype", "bfloat16"])
    assert (args.config, args.vae_dtype, args.cuda_graphs) == ("tiny", "bfloat16", "auto")


def test_the_specs_options_are_the_ops_ones():
    from telefuser.models.minimax_h3.checkpoint_formats import QKV_LAYOUTS
    from telefuser.ops.attention_registry import backend_names
    from telefuser.ops.fp8 import QUANTIZATIONS as OPS_QUANTIZATIONS

    assert set(ATTENTION_IMPLS) == set(backend_names()) - {"identity"} and QUANTIZATIONS == OPS_QUANTIZATIONS
    assert registry.get_spec("minimax_h3").flag("qkv_layout").options["choices"] == QKV_LAYOUTS


def test_building_the_command_line_imports_no_torch():
    code = "import sys; from telefuser.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_runtime_parallelize_applies_the_plan_of_the_spec_it_is_given():
    from telefuser.models.spec import ModelSpec
    from telefuser.runtime import Runtime

    mesh = SimpleNamespace(world_size=2)
    runtime = Runtime(mesh, device=None, dtype=None)
    calls = []

    def plan(model, mesh, *, communicator_factory=None):
        calls.append((model, mesh, communicator_factory))
        return model

    fields = {"name": "m", "title": "m", "model_class": "x:Y", "flags": (), "pipeline": "x:y"}
    spec = ModelSpec(**fields, attention_impls=("sdpa",), quantizations=(), plan=plan)
    model, factory = object(), object()
    assert runtime.parallelize(model, spec, communicator_factory=factory) is model
    assert calls == [(model, mesh, factory)]  # once, over the runtime's mesh, with the caller's transport


# -- the stand-in, served by both command lines -------------------------------------------------------------------------
class _Service(ServerProcess):
    """`python -m tests.stand_in_model.serve ARGS` on a free port; SIGTERM at the end must stop it cleanly."""

    def __init__(self, *args: str):
        super().__init__([sys.executable, "-m", "tests.stand_in_model.serve", *args, "--port", "0"])

    def __enter__(self) -> str:
        return self.wait_url(60)

    def __exit__(self, *exc) -> None:
        try:
            assert self.stop(signal.SIGTERM, 30) == 0, self.log
        finally:
            self.kill()


def test_the_stand_in_is_served_by_telefuser_serve(tmp_path):
    flags = ["--model", "stand_in", "--tint", "teal", "--artifacts", str(tmp_path)]
    with _Service("serve", *flags) as url, httpx.Client(base_url=url, trust_env=False, timeout=10) as http:
        metadata = http.get("/v1/service/metadata").json()
        assert metadata["models"] == ["minimax_h3", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b", "stand_in"]
        assert metadata["model"]["tint"] == "teal"
        # no --served-model-name: the model is served under its registry name, not MiniMax H3's
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["stand_in"]
        job = http.post("/v1/videos", json={"prompt": "a kite", "model": "stand_in", "seconds": 0.2}).json()
        deadline = time.monotonic() + 30
        while (status := http.get(f"/v1/videos/{job['id']}").json()["status"]) not in ("completed", "failed"):
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
        assert status == "completed"


def test_the_stand_in_is_served_by_telefuser_serve_stream():
    with _Service("serve-stream", "--model", "stand_in", "--tint", "teal") as url:
        with httpx.Client(base_url=url, trust_env=False, timeout=30) as http:
            metadata = http.get("/v1/service/metadata").json()
            assert metadata["models"] == ["lingbot_world_v2", "stand_in"] and metadata["model"]["tint"] == "teal"
            session = http.post("/v1/stream/sessions", json={"prompt": "p", "image": ONE_PIXEL_PNG}).json()
            with http.stream("GET", session["sse_path"]) as events:
                data = [json.loads(line[6:]) for line in events.iter_lines() if line.startswith("data: ")]
        assert [e["chunk"] for e in data if e["type"] == "chunk"] == [0, 1] and data[-1]["type"] == "done"
