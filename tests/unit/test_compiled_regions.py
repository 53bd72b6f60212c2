"""One compiled region per transformer block, compiled on the CPU on purpose (Inductor's C++ backend).

* LingBot-World v2: a whole scripted session (every window length, the ring wrapping) compiles two graphs (the
  forward, and the commit's last block that stops after its K/V) and never again, not in a second session either;
  one compiled call per block and forward; its outputs match the reference path within fp32 reordering, and a region
  that writes the window one row off lands far above that bound (negative control).
* MiniMax H3: the joint blocks as regions against the reference path, with the AdaLN projection and with precomputed
  tables; another prompt length in the same packed length changes no compiled code (the documents are data); a
  second packed length recompiles once (dynamic sizes), a third not at all.
* The V-first order survives compilation: in Inductor's generated code V's submission precedes Q's projection, Q's
  precedes K's, and the block's normed input they share is passed in place (no copy).

Tolerance (fp32): Inductor fuses each elementwise chain and keeps its intermediates in fp32, as the reference does,
but reduces (layer norm, RMSNorm) in another order: a few float32 ulps per element, through two blocks and the head.
Measured max relative error 3.0e-7 over the LingBot session and 3.5e-7 over the MiniMax calls; the bounds are 1e-5
(about 30x) and 2e-6 (about 6x), those of the other fp32 reordering tests of these models. A window written one row
off measures 4e-2.
"""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from telefuser.models.lingbot_world_v2 import WindowSlots, build_random_lingbot_dit
from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit
from telefuser.ops.compile_stats import count_compiled
from telefuser.ops.regions import compile_regions_on
from tests.lingbot_session_script import CHUNKS, STEPS, covers_the_window, run_session, session_config
from tests.numerics import relative_error

pytestmark = pytest.mark.numerics

LINGBOT_BOUND = 1e-5
MINIMAX_BOUND = 2e-6
FAR = 100 * LINGBOT_BOUND


@pytest.fixture(autouse=True)
def scalar_code_under_portable_kernels():
    """Under ATEN_CPU_CAPABILITY=default (the numerics pass) ATen's vector headers compile to nothing, so Inductor's
    vectorized C++ does not build: generate scalar code there, as portable as the kernels it is compared with."""
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        yield
        return
    with torch._inductor.config.patch({"cpp.simdlen": 1}):
        yield


@pytest.fixture(scope="module")
def lingbot():
    return build_random_lingbot_dit(session_config(), seed=0)


def _max_error(records, references) -> float:
    return max(relative_error(o, r) for o, r in zip(records.outputs, references.outputs, strict=True))


def test_lingbot_session_compiles_once_and_matches_the_reference(lingbot, monkeypatch):
    reference = run_session(lingbot)
    assert covers_the_window(reference, lingbot.config)
    with compile_regions_on("cpu"):
        with count_compiled() as first:
            compiled = run_session(lingbot)
        with count_compiled() as second:
            again = run_session(lingbot)
    forwards = CHUNKS * (len(STEPS) + 1)
    assert first.compiles == 2, first  # the forward, and the commit's last block (K/V only)
    assert second.compiles == 0, second  # no window length, ring layout or new session recompiles
    assert first.calls == second.calls == forwards * lingbot.config.num_layers
    error = _max_error(compiled, reference)
    print(f"compiled regions against the reference path: {error:.3e}")
    assert error <= LINGBOT_BOUND, error
    assert all(torch.equal(a, b) for a, b in zip(compiled.outputs, again.outputs))  # the same code, the same data

    slot_rows = WindowSlots.slot_rows
    monkeypatch.setattr(WindowSlots, "slot_rows", lambda plan, device: (slot_rows(plan, device) + 1) % plan.capacity)
    with compile_regions_on("cpu"):
        wrong = run_session(lingbot)
    wrong_error = _max_error(wrong, reference)
    print(f"negative control (window written one row off): {wrong_error:.3e}")
    assert wrong_error > FAR, wrong_error


def _minimax_inputs(config, text_rows: int, frames: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    video = torch.randn(1, config.latents_dim, frames, 8, 8, generator=g)
    audio = torch.randn(1, config.audio_latents_dim, 6, generator=g)
    text = torch.randn(1, text_rows, config.text_dim, generator=g)
    return video, audio, text, torch.tensor([700.0]), torch.tensor([300.0])


def test_minimax_blocks_as_regions_match_the_reference_and_recompile_once_per_new_shape():
    model = build_random_minimax_h3_dit(MiniMaxH3Config.tiny(), seed=0)
    # packed rows (aligned to 64): 5 text + 6 audio + 32 video -> 64; 13 text -> 64 (other documents); 2 and 3 more
    # video frames -> 128 and 192
    shapes = ((5, 2), (13, 2), (5, 4), (9, 6))
    inputs = [_minimax_inputs(model.config, rows, frames, seed) for seed, (rows, frames) in enumerate(shapes)]
    with torch.no_grad():
        references = [model(*x) for x in inputs]
        tables = model.precompute_adaln([inputs[0][3]], [inputs[0][4]])
        with compile_regions_on("cpu"):
            with count_compiled() as first:
                compiled = [model(*inputs[0]), model(*inputs[0], adaln=tables)]
            counts, outputs = [], []
            for x in inputs[1:]:
                with count_compiled() as stats:
                    outputs.append(model(*x))
                counts.append(stats.compiles)
    assert first.compiles == 2, first  # AdaLN projected in the region, then read from tables
    assert first.calls == 2 * model.config.num_layers
    assert counts == [0, 1, 0], counts  # other documents: none; a new packed length: once; then dynamic
    pairs = [(compiled[0], references[0]), (compiled[1], references[0]), *zip(outputs, references[1:])]
    errors = [relative_error(got, want) for outs, ref in pairs for got, want in zip(outs, ref, strict=True)]
    print(f"MiniMax H3 regions against the reference path: {max(errors):.3e}")
    assert max(errors) <= MINIMAX_BOUND, errors


# -- the V-first order in the generated code ----------------------------------------------------------------------
class _Handle:
    def __init__(self, tensor):
        self.tensor = tensor

    def wait(self):
        return self.tensor


class _TwoRankStub:
    """Shapes of a two-rank exchange, for code generation only (the data is not a real exchange's)."""

    world_size, rank = 2, 0

    def scatter_heads(self, x, *, tag=None, barrier=True):
        return _Handle(torch.cat([x[:, :, : x.shape[2] // 2]] * 2, dim=1))

    def gather_heads(self, o):
        return _Handle(torch.cat([o[:, : o.shape[1] // 2]] * 2, dim=2))


def test_compiled_block_keeps_the_v_first_order_and_passes_its_input_in_place(lingbot):
    from telefuser.distributed.ulysses.compiled_ops import exchange_key
    from telefuser.models.lingbot_world_v2 import KVWindow
    from telefuser.models.lingbot_world_v2.attention import ChunkInputs, window_rows
    from telefuser.models.lingbot_world_v2.blocks import block_region
    from telefuser.models.wan.rope import chunk_rope

    config, stub = lingbot.config, _TwoRankStub()
    head_dim, heads = config.head_dim, config.num_heads
    text_kv = (torch.randn(1, config.text_len, heads, head_dim), torch.randn(1, config.text_len, heads, head_dim))
    window = KVWindow(
        batch=1,
        num_layers=1,
        tokens_per_frame=6,
        local_attn_size=config.local_attn_size,
        sink_size=config.sink_size,
        local_heads=heads // 2,
        head_dim=head_dim,
        ulysses_degree=2,
        cross_kv=[text_kv],
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    plan = window.plan(2)
    cos, sin = chunk_rope(0, 2, 2, 3, head_dim)
    slots, rows = plan.slot_rows("cpu"), window_rows(plan)
    chunk = ChunkInputs(cos, sin, slots, rows, 12, exchange_key(stub), "sdpa", window.format, plan.kept == 0)
    x, t_mod = torch.randn(1, 6, config.dim), torch.randn(1, 6, config.dim)
    with torch.no_grad(), compile_regions_on("cpu"):
        _, (code,) = run_and_get_code(block_region, lingbot.blocks[0], x, t_mod, None, window.layers[0], chunk)
    lines = [line.strip() for line in code.splitlines()]
    calls = [  # in launch order: the projections and the exchange's ops (calls, not the kernels' definitions)
        line.split(" = ", 1)[-1]
        for line in lines
        if line.startswith("extern_kernels.addmm(") or "torch.ops.telefuser.ulysses_scatter_" in line.split("(")[0]
    ]
    # the first five: V's projection, V leaves, Q's projection, Q leaves, K's projection; then K completes the group
    kinds = ["mm" if "addmm" in line else line.split("ulysses_scatter_")[1].split(".")[0] for line in calls[:6]]
    assert kinds == ["mm", "deferred", "mm", "deferred", "mm", "complete"], calls[:6]
    assert "'v'" in calls[1] and "'q'" in calls[3], calls[:4]
    anchor = calls[1].split("default(")[1].split(",")[0]  # the buffer declared written by V's submission ...
    for mm in (calls[0], calls[2], calls[4]):  # ... is the one the three projections read: no copy in between
        assert f"reinterpret_tensor({anchor}," in mm, (anchor, mm)
    assert not [line for line in lines if ".clone()" in line or "aten.copy" in line or "copy_(" in line]
