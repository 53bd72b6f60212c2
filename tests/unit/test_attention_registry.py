"""The attention backend registry (ops/attention_registry.py): one record per backend, registered where it is defined.

* Every built-in backend is registered by the module `BACKEND_MODULES` names, with its facts; the models' flags offer
  exactly the registry's names (less the test-only ``identity``), and the names import no torch.
* Refusals say why: an unavailable backend, a head dim, device or dtype a backend does not take, a duplicate name.
* Every model's DiT runs the same head-dim check (LingBot's included), with one error naming the head dim and the
  backends that take it.
* Dispatch: each host backend runs through `attention`; inside a compiled region a ``traced`` backend is traced into
  the graph and any other one is the opaque ``telefuser::attention`` op (no graph break either way).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from telefuser.models.flags import ATTENTION_IMPLS
from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.models.spec import resolve
from telefuser.models.wan2_2.spec import WAN22_T2V_A14B
from telefuser.ops import attention_registry as registry
from telefuser.ops.attention import attention
from telefuser.ops.attention_registry import (
    BACKEND_MODULES,
    WINDOW_FP8_KEYS,
    WINDOW_PLAIN,
    WINDOW_SAGE_SM90,
    AttentionBackend,
    attention_backend,
    backend_names,
    check_backend,
    get_backend,
    offered_names,
    register,
)

REPO = Path(__file__).resolve().parents[2]
SAGE_HEAD_DIM_ERROR = (
    r"^attention implementation 'sage_sm90' does not take head dim 16 \(it runs head dims 64, 128\); "
    r"implementations that take it: sdpa, flash_attn_4, sage, cudnn_fp8$"
)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is, in a copy this test may add to; the real one is back afterwards."""
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))


def _as_available(monkeypatch, name: str) -> None:
    backend = dataclasses.replace(get_backend(name), available=lambda: (True, "faked"))
    monkeypatch.setitem(registry._BACKENDS, name, backend)


def _qkv(s_q=8, s_kv=12, h=2, d=16):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, s, h, d, generator=g) for s in (s_q, s_kv, s_kv))


# -- the records ------------------------------------------------------------------------------------------------------
def test_every_builtin_backend_is_registered_by_its_module_with_its_facts():
    assert backend_names()[: len(BACKEND_MODULES)] == tuple(BACKEND_MODULES)
    for name, module in BACKEND_MODULES.items():
        backend = get_backend(name)
        assert backend.name == name and backend.run.__module__ == module, name
    facts = {
        name: (b.host, b.traced, b.head_dims, b.window_format)
        for name, b in ((name, get_backend(name)) for name in BACKEND_MODULES)
    }
    assert facts == {
        "sdpa": (True, False, None, WINDOW_PLAIN),
        "flash_attn_4": (False, False, None, WINDOW_PLAIN),
        "sage": (False, False, None, WINDOW_PLAIN),
        "cudnn_fp8": (False, True, None, WINDOW_FP8_KEYS),
        "sage_sm90": (False, True, (64, 128), WINDOW_SAGE_SM90),
        "identity": (True, False, None, WINDOW_PLAIN),
    }


def test_the_models_flags_offer_the_registry_names_less_identity():
    assert ATTENTION_IMPLS == offered_names() == ("sdpa", "flash_attn_4", "sage", "cudnn_fp8", "sage_sm90")
    for spec in (MINIMAX_H3, LINGBOT_WORLD_V2, WAN22_T2V_A14B):
        assert spec.attention_impls == ATTENTION_IMPLS
        assert tuple(spec.flag("attn_impl").options["choices"]) == (*ATTENTION_IMPLS, "auto")


def test_the_names_import_no_torch():
    code = (
        "import sys\n"
        "from telefuser.ops.attention_registry import offered_names\n"
        "from telefuser.models.flags import ATTENTION_IMPLS\n"
        "print(ATTENTION_IMPLS == offered_names(), 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "False"], done.stdout


# -- refusals say why -------------------------------------------------------------------------------------------------
def test_an_unavailable_backend_says_why(no_gpu, monkeypatch):
    for name in ("cudnn_fp8", "sage_sm90"):
        assert get_backend(name).available() == (False, "no CUDA GPU")
        with pytest.raises(RuntimeError, match=rf"^attention implementation '{name}' was asked for but no CUDA GPU$"):
            check_backend(name)
    real_find_spec = importlib.util.find_spec
    missing = {"flash_attn", "sageattention"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in missing else real_find_spec(n, *a))
    assert get_backend("flash_attn_4").available() == (False, "flash-attn-4 is not installed")
    assert get_backend("sage").available() == (False, "sageattention is not installed")
    with pytest.raises(RuntimeError, match=r"^attention implementation 'sage' was asked for but sageattention is not"):
        check_backend("sage")
    assert get_backend("sdpa").available() == (True, "part of torch")
    assert check_backend("sdpa") == "sdpa" and check_backend("identity") == "identity"


def test_a_backend_that_refuses_a_head_dim_device_or_dtype_says_why():
    sage = get_backend("sage_sm90")
    assert sage.takes(head_dim=96) == (False, "it runs head dims 64, 128")
    assert sage.takes(head_dim=128, device="cuda:1", dtype=torch.bfloat16) == (True, "it takes them")
    assert sage.takes(device=torch.device("cpu")) == (False, "it runs on CUDA devices only, not on cpu")
    assert sage.takes(dtype=torch.float32) == (False, "it runs bfloat16, float16, not float32")
    assert get_backend("cudnn_fp8").takes(head_dim=96, device=0)[0]  # torch.device(0) is a CUDA device
    assert not get_backend("cudnn_fp8").takes(device="cpu")[0]
    assert get_backend("sdpa").takes(head_dim=16, device="cpu", dtype=torch.float32)[0]
    assert not get_backend("flash_attn_4").takes(dtype=torch.float32)[0]


def test_check_backend_refuses_a_head_dim_naming_the_backends_that_take_it(monkeypatch):
    _as_available(monkeypatch, "sage_sm90")
    with pytest.raises(ValueError, match=SAGE_HEAD_DIM_ERROR):
        check_backend("sage_sm90", head_dim=16)
    assert check_backend("sage_sm90", head_dim=128) == "sage_sm90"
    assert check_backend("sdpa", head_dim=16) == "sdpa"


def test_an_unavailable_backend_is_refused_before_its_head_dim(no_gpu):
    with pytest.raises(RuntimeError, match="'sage_sm90' was asked for but no CUDA GPU"):
        check_backend("sage_sm90", head_dim=16)


@pytest.mark.parametrize("spec", [LINGBOT_WORLD_V2, MINIMAX_H3, WAN22_T2V_A14B], ids=lambda spec: spec.name)
def test_every_dit_refuses_a_head_dim_its_backend_does_not_take_alike(spec, monkeypatch):
    """LingBot, MiniMax H3 and Wan 2.2 run one check: their tiny sizes' 16-channel heads against sage_sm90."""
    _as_available(monkeypatch, "sage_sm90")  # as if the SM90 build were there
    config = spec.config_of("tiny")
    dit_class = resolve(spec.model_class)
    with pytest.raises(ValueError, match=SAGE_HEAD_DIM_ERROR):
        dit_class(config, attn_impl="sage_sm90")
    assert dit_class(config, attn_impl="sdpa").attn_impl == "sdpa"


def test_an_explicit_name_is_checked_against_the_specs_head_dim(monkeypatch):
    import argparse

    _as_available(monkeypatch, "sage_sm90")
    with pytest.raises(ValueError, match=SAGE_HEAD_DIM_ERROR):
        MINIMAX_H3.attention_impl(argparse.Namespace(attn_impl="sage_sm90", config="tiny"))
    assert MINIMAX_H3.attention_impl(argparse.Namespace(attn_impl="sage_sm90", config="official")) == "sage_sm90"


def test_unknown_names_are_refused_naming_the_known_ones():
    with pytest.raises(
        ValueError, match=r"^unknown attention implementation 'flash'; choose one of sdpa, flash_attn_4"
    ):
        get_backend("flash")


# -- registration -----------------------------------------------------------------------------------------------------
def test_registering_a_duplicate_name_is_refused(scratch_registry):
    with pytest.raises(ValueError, match=r"^attention backend 'sdpa' is already registered"):
        register(AttentionBackend("sdpa", run=lambda q, k, v, *, causal=False: q, available=lambda: (True, "")))
    with pytest.raises(ValueError, match=r"'auto' names no backend"):
        register(AttentionBackend("auto", run=lambda q, k, v, *, causal=False: q, available=lambda: (True, "")))

    @attention_backend("scaled_q", available=lambda: (True, "always"), host=True)
    def scaled_q(q, k, v, *, causal=False):
        return (2 * q).contiguous()

    assert get_backend("scaled_q").run is scaled_q
    assert backend_names()[-1] == "scaled_q" and "scaled_q" not in offered_names()  # no model offers it
    with pytest.raises(ValueError, match="'scaled_q' is already registered"):
        attention_backend("scaled_q", available=lambda: (True, "always"))(scaled_q)
    q, k, v = _qkv()
    assert torch.equal(attention(q, k, v, impl="scaled_q"), 2 * q)


# -- dispatch ---------------------------------------------------------------------------------------------------------
def test_each_host_backend_runs_through_attention():
    q, k, v = _qkv()
    expected = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
    assert torch.equal(attention(q, k, v, impl="sdpa", causal=True), expected)
    assert torch.equal(attention(q, k, v, impl="identity"), q)
    with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
        attention(q, k, v, impl="flash")


def _graph_ops(impl: str, q, k, v) -> list[str]:
    """The call targets of the one graph dynamo captures around `attention(impl=...)` (fullgraph: no break)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(lambda q, k, v: attention(q, k, v, impl=impl) + 1, backend=keep, fullgraph=True)
    out = compiled(q, k, v)
    assert torch.equal(out, attention(q, k, v, impl=impl) + 1)
    assert len(graphs) == 1
    return [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]


def test_a_compiled_region_traces_a_traced_backend_and_keeps_the_others_opaque(scratch_registry):
    torch._dynamo.reset()
    attention_backend("traced_double_q", available=lambda: (True, "always"), host=True, traced=True)(
        lambda q, k, v, *, causal=False: q * 2
    )
    q, k, v = _qkv()
    opaque = _graph_ops("sdpa", q, k, v)
    assert any("telefuser.attention" in op for op in opaque), opaque
    traced = _graph_ops("traced_double_q", q, k, v)
    assert not any("telefuser.attention" in op for op in traced) and any("mul" in op for op in traced), traced
    torch._dynamo.reset()
