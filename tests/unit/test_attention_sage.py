"""``sage_sm90`` (SageAttention2's SM90 kernel with our quantization, ops/attention_sage.py) on the CPU.

* Dispatch and refusals: known, never listed without an SM90 GPU and the built extension; every refusal names what is
  missing (the build command, SM90, the per-thread stream build).
* The build check: nvcc-built shared objects with and without ``--default-stream per-thread`` (skipped without nvcc).
* The layouts, exactly: V's transposed, permuted columns; which rows and keys share each Q/K scale.
* The math: our quantization through a plain-torch emulation of the kernel (`sage_emulation.emulate_kernel`) against
  fp32 SDPA within a stated bound, with negative controls (a wrong scale layout, a wrong V order, per-chunk smoothing
  means).
* A LingBot window kept in the kernel's layout: rows written once read back bit-identical, the session's numbers
  fixed at its first write, and a tiny session with the kernel emulated against the same session in fp32.
The kernel itself is tested on the H200 (tests/gpu/test_attention_sage_cuda.py).
"""

from __future__ import annotations

import importlib.machinery
import math
import shutil
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from telefuser.models.lingbot_world_v2 import window_formats as formats
from telefuser.ops import attention_sage as sage
from telefuser.ops.attention import attention
from telefuser.ops.attention_registry import available_names, backend_names, check_backend
from tests.lingbot_session_script import GRID_HW, session_under_impl
from tests.unit import sage_emulation as emulation


def _qkv(b=1, s_q=200, s_kv=300, h=2, d=64, *, offset=0.0, q_gain=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h, d, generator=g) * q_gain
    k = torch.randn(b, s_kv, h, d, generator=g) + offset * torch.randn(d, generator=g)
    v = torch.randn(b, s_kv, h, d, generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def _fp32_reference(q, k, v):
    h_q, h_kv = q.shape[2], k.shape[2]
    k, v = (t.float().repeat_interleave(h_q // h_kv, 2).transpose(1, 2) for t in (k, v))
    return F.scaled_dot_product_attention(q.float().transpose(1, 2), k, v).transpose(1, 2)


def _cosine(a, b):
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# -- dispatch and refusals ----------------------------------------------------------------------------------------------
@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake H200")


def _fake_extension(monkeypatch, so_path: str):
    ext = types.ModuleType("sageattention._qattn_sm90")
    ext.__file__ = so_path
    setattr(ext, sage.KERNEL_OP, lambda *a: None)
    package = types.ModuleType("sageattention")
    package.__spec__ = importlib.machinery.ModuleSpec("sageattention", None)
    monkeypatch.setitem(sys.modules, "sageattention", package)
    monkeypatch.setitem(sys.modules, "sageattention._qattn_sm90", ext)
    monkeypatch.setitem(sys.modules, "sageattention._fused", types.ModuleType("sageattention._fused"))


def test_sage_sm90_is_known_next_to_the_triton_sage():
    assert {"sage", "sage_sm90"} <= set(backend_names())


def test_not_listed_and_refused_without_a_gpu(no_gpu):
    assert "sage_sm90" not in available_names()
    with pytest.raises(RuntimeError, match="'sage_sm90' was asked for but no CUDA GPU"):
        check_backend("sage_sm90")


def test_refused_with_the_build_command_when_the_extension_is_missing(fake_hopper, monkeypatch):
    monkeypatch.setitem(sys.modules, "sageattention._qattn_sm90", None)  # import -> ImportError
    with pytest.raises(RuntimeError, match="sageattention._qattn_sm90.*--default-stream per-thread") as info:
        check_backend("sage_sm90")
    assert "TORCH_CUDA_ARCH_LIST=9.0" in str(info.value)
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="did not import"):
        attention(q, k, v, impl="sage_sm90")


def test_refused_on_a_gpu_that_is_not_sm90(fake_hopper, monkeypatch, tmp_path):
    _fake_extension(monkeypatch, str(tmp_path / "not-an-elf.so"))
    (tmp_path / "not-an-elf.so").write_bytes(b"nothing")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    with pytest.raises(RuntimeError, match="needs an SM90 \\(Hopper\\) GPU; fake H200 is SM100"):
        check_backend("sage_sm90")


def test_cpu_tensors_are_refused_with_the_extension_importable(fake_hopper, monkeypatch, tmp_path):
    _fake_extension(monkeypatch, str(tmp_path / "x.so"))
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        attention(q, k, v, impl="sage_sm90")


NVCC = shutil.which("nvcc")
_KERNEL_SOURCE = """
__global__ void bump(float* x) { x[threadIdx.x] += 1.f; }
extern "C" void launch(float* x) { bump<<<1, 32, 0>>>(x); }
"""


@pytest.fixture(scope="module")
def nvcc_builds(tmp_path_factory):
    """Two shared objects like a torch CUDA extension (dynamic CUDA runtime): legacy and per-thread launches."""
    if NVCC is None:
        pytest.skip("nvcc is not on the PATH")
    folder = tmp_path_factory.mktemp("builds")
    (folder / "k.cu").write_text(_KERNEL_SOURCE)
    built = {}
    for name, extra in (("legacy", []), ("per-thread", ["--default-stream", "per-thread"])):
        out = folder / f"{name}.so"
        cmd = [
            NVCC,
            "-cudart",
            "shared",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            *extra,
            "-o",
            str(out),
            str(folder / "k.cu"),
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        built[name] = str(out)
    return built


def test_the_launch_stream_of_a_build_is_read_from_its_symbols(nvcc_builds, tmp_path):
    assert sage.launch_stream_of_build(nvcc_builds["per-thread"]) == "per-thread"
    assert sage.launch_stream_of_build(nvcc_builds["legacy"]) == "legacy"
    (tmp_path / "text.so").write_text("not an ELF file")
    assert sage.launch_stream_of_build(tmp_path / "text.so") == "unknown"
    assert sage.launch_stream_of_build(tmp_path / "missing.so") == "unknown"


def test_a_legacy_stream_build_is_refused_with_the_rebuild_command(nvcc_builds, fake_hopper, monkeypatch):
    _fake_extension(monkeypatch, nvcc_builds["legacy"])
    with pytest.raises(RuntimeError, match="legacy default stream.*NVCC_APPEND_FLAGS='--default-stream per-thread'"):
        check_backend("sage_sm90")
    _fake_extension(monkeypatch, nvcc_builds["per-thread"])
    assert check_backend("sage_sm90") == "sage_sm90"
    assert "sage_sm90" in available_names()


def test_build_info_without_the_extension(monkeypatch):
    monkeypatch.setattr(sage, "_extension_file", lambda: None)
    info = sage.sage_sm90_build_info()
    assert info["installed"] is False and "--default-stream per-thread" in info["hint"]


# -- layouts, exactly -------------------------------------------------------------------------------------------------
def test_value_layout_permutes_each_group_of_16_keys_and_transposes():
    x = torch.randn(2, 48, 3, 8)
    laid = sage.value_layout(x).contiguous()
    assert laid.shape == (2, 3, 8, 48) and laid.stride()[-1] == 1
    # key r of a group of 16 sits at column 4 * ((r % 8) // 2) + 2 * (r // 8) + r % 2 (the P fragment's order)
    assert sage.value_columns(torch.arange(16)).tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
    cols = sage.value_columns(torch.arange(48))
    assert torch.equal(laid[..., cols].permute(0, 3, 1, 2), x)
    assert torch.equal(sage.value_rows(laid), x)


@pytest.mark.parametrize("granularity", ["per_thread", "per_warp"])
def test_each_scale_covers_the_rows_and_keys_the_kernel_pairs_with_it(granularity):
    # one magnitude per row, so each scale names the rows it was taken over
    s_q, s_kv, h, d = 100, 300, 2, 64
    rows_q = torch.arange(1, s_q + 1, dtype=torch.float32)
    rows_k = torch.arange(1, s_kv + 1, dtype=torch.float32)
    q = (torch.ones(1, s_q, h, d) * rows_q[None, :, None, None]).bfloat16()
    k = (torch.ones(1, s_kv, h, d) * rows_k[None, :, None, None]).bfloat16()  # smoothed: rows minus their mean
    q8, q_scale = sage.quantize_queries(q, granularity)
    k_scale = sage._quantize_k(k, granularity)[1]
    per_thread = granularity == "per_thread"
    assert q_scale.shape == (1, h, math.ceil(s_q / 64) * (32 if per_thread else 4))
    assert k_scale.shape == (1, h, math.ceil(s_kv / 128) * (4 if per_thread else 1))
    for r in range(s_q):
        index = (r // 16) * 8 + r % 8 if per_thread else r // 16
        members = [m for m in range(s_q) if ((m // 16) * 8 + m % 8 if per_thread else m // 16) == index]
        assert q_scale[0, 0, index].item() == pytest.approx((max(members) + 1) / 127, rel=1e-6)
    mean = k.float().mean(dim=1, keepdim=True)
    for j in range(0, s_kv, 7):
        index = (j // 128) * 4 + (j % 8) // 2 if per_thread else j // 128
        group = [m for m in range(s_kv) if ((m // 128) * 4 + (m % 8) // 2 if per_thread else m // 128) == index]
        expected = (k.float()[0, group, 0] - mean[0, 0, 0]).abs().max().item() / 127
        assert k_scale[0, 0, index].item() == pytest.approx(expected, rel=1e-6)
    # and the int8 values dequantize to the inputs within half a step of their own group's scale
    qs = emulation.expand_q_scales(q_scale, s_q, granularity)[..., None]
    assert ((q8.float() * qs - q.float()).abs() <= qs / 2 + 1e-6).all()
    assert q8.abs().max().item() == 127


# -- the kernel's math against fp32 --------------------------------------------------------------------------------------
# INT8 Q/K (2^-8 relative per element at a group's max, smaller inside), e4m3 P and V (2^-4 relative per element) over
# hundreds of keys: the SageAttention2 paper and the probe on the H200 report cosine ~0.9992 against fp32 (rel. L2
# ~4e-2). Bound: rel. L2 <= 0.06 and cosine >= 0.998 on random, key-offset and sharp inputs; each negative control
# is a real bug (a wrong scale layout, V in row order, a smoothing mean per chunk) and lands at least 3x above it.
REL_L2_BOUND, COSINE_BOUND = 0.06, 0.998
CASES = {"random": {}, "key-offset": {"offset": 8.0}, "sharp": {"offset": 8.0, "q_gain": 4.0}}


def _emulated(q, k, v, granularity, **overrides):
    q8, q_scale, k8, k_scale, v8, v_scale = sage.quantize(q, k, v, granularity)
    parts = {"q8": q8, "q_scale": q_scale, "k8": k8, "k_scale": k_scale, "v8": v8, "v_scale": v_scale, **overrides}
    return emulation.emulate_kernel(**parts, granularity=granularity)


@pytest.mark.numerics
@pytest.mark.parametrize("granularity", ["per_thread", "per_warp"])
@pytest.mark.parametrize("case", list(CASES))
def test_quantized_attention_matches_fp32_within_the_bound(granularity, case):
    q, k, v = _qkv(b=2, s_q=200, s_kv=300, h=4, d=64, **CASES[case])
    ours, reference = _emulated(q, k, v, granularity), _fp32_reference(q, k, v)
    rel, cos = _rel_l2(ours, reference), _cosine(ours, reference)
    print(f"{granularity} {case}: rel L2 {rel:.3e}, cosine {cos:.6f}")
    assert 0 < rel <= REL_L2_BOUND and cos >= COSINE_BOUND, (rel, cos)


@pytest.mark.numerics
def test_grouped_query_heads_use_their_kv_head():
    q, k, v = _qkv(s_q=80, s_kv=150, h=2, d=64, seed=3)
    q = torch.cat([q, q.flip(1)], dim=2)  # 4 query heads over 2 kv heads
    ours, reference = _emulated(q, k, v, "per_thread"), _fp32_reference(q, k, v)
    assert _rel_l2(ours, reference) <= REL_L2_BOUND


@pytest.mark.numerics
def test_negative_controls_land_far_above_the_bound():
    q, k, v = _qkv(b=1, s_q=200, s_kv=300, h=2, d=64, offset=8.0, q_gain=4.0, seed=1)
    reference = _fp32_reference(q, k, v)
    _, q_scale, _, _, v8, _ = sage.quantize(q, k, v, "per_thread")
    # 1. the Q scales in per-warp order though the kernel reads them per thread (rows grouped wrongly)
    wrong_q = q_scale.view(1, 2, -1, 8, 4).transpose(-1, -2).reshape(q_scale.shape).contiguous()
    # 2. V handed over in row order instead of the kernel's permuted columns
    wrong_v = sage.value_rows(v8).permute(0, 2, 3, 1).contiguous()
    errors = {
        "q scale layout": _emulated(q, k, v, "per_thread", q_scale=wrong_q),
        "v column order": _emulated(q, k, v, "per_thread", v8=wrong_v),
    }
    # 3. a smoothing mean per chunk: two 128-key chunks (keys drifting between them) smoothed separately
    drift = torch.cat(
        [
            k[:, :128],
            k[:, 128:256] + (2 * torch.randn(k.shape[-1], generator=torch.Generator().manual_seed(9))).bfloat16(),
        ],
        dim=1,
    )
    halves = [sage._quantize_k(part, "per_warp") for part in (drift[:, :128], drift[:, 128:])]
    q8w, q_scale_w, _, _, v8w, v_scale_w = sage.quantize(q, drift, v[:, :256], "per_warp")
    per_chunk = emulation.emulate_kernel(
        q8w, q_scale_w, torch.cat([h[0] for h in halves], 1), torch.cat([h[1] for h in halves], 2).contiguous(),
        v8w, v_scale_w, granularity="per_warp",
    )  # fmt: skip
    drift_reference = _fp32_reference(q, drift, v[:, :256])
    assert _rel_l2(_emulated(q, drift, v[:, :256], "per_warp"), drift_reference) <= REL_L2_BOUND  # one mean: fine
    errors["a mean per chunk"] = (per_chunk, drift_reference)
    for name, result in errors.items():
        out, ref = result if isinstance(result, tuple) else (result, reference)
        rel = _rel_l2(out, ref)
        print(f"negative control, {name}: rel L2 {rel:.3e}")
        assert rel > 3 * REL_L2_BOUND, (name, rel)


# -- a LingBot window in the kernel's layout -----------------------------------------------------------------------------
def _sage_buffers(b=1, capacity=300, h=2, d=64, layers=2):
    return formats.SAGE_WINDOW.allocate(
        layers, (b, capacity, h, d), [], device=torch.device("cpu"), dtype=torch.bfloat16
    )


def _session_plans(capacity: int, sink: int, frame_rows: int, chunk_frames: list[int]):
    """The plans of a session's committed chunks, as KVWindow makes them (appends, then ring slots that wrap)."""
    from telefuser.models.lingbot_world_v2.kv_cache import WindowSlots

    committed, ring_head = 0, 0
    for frames in chunk_frames:
        plan = WindowSlots(capacity, sink, committed, frames * frame_rows, ring_head)
        yield plan
        committed = plan.total
        if plan.evicted:
            ring_head = (plan.ring_head + plan.evicted) % plan.ring_rows


@settings(max_examples=60, deadline=None)
@given(
    frame_rows=st.integers(1, 300),
    frames=st.integers(2, 12),
    sink=st.integers(0, 3),
    chunks=st.lists(st.integers(1, 6), min_size=1, max_size=8),
)
def test_touched_blocks_name_each_block_of_a_write_in_order(frame_rows, frames, sink, chunks):
    sink = min(sink, frames - 1)
    chunks = [min(c, frames - sink) for c in chunks]
    capacity = frames * frame_rows
    spare = -(-capacity // sage.K_BLOCK)
    for plan in _session_plans(capacity, sink * frame_rows, frame_rows, chunks):
        slots = plan.slot_rows("cpu")
        blocks = formats.touched_blocks(slots, spare)
        expected = torch.unique_consecutive(slots // sage.K_BLOCK)
        assert blocks.shape == (-(-plan.new_rows // sage.K_BLOCK) + formats.WINDOW_BLOCK_SLACK,)
        assert torch.equal(blocks[: len(expected)], expected)
        assert (blocks[len(expected) :] == spare).all()


def _drifting_chunk(g, rows, h=2, d=64, *, shared, drift):
    """Keys with a per-channel offset shared by the session plus one of the chunk's own (RoPE moves an offset with
    position), and values."""
    k = torch.randn(1, rows, h, d, generator=g) + shared + drift * torch.randn(d, generator=g)
    return k.bfloat16(), torch.randn(1, rows, h, d, generator=g).bfloat16()


@pytest.mark.parametrize("granularity", ["per_thread", "per_warp"])
def test_window_keeps_its_rows_exactly_and_every_block_quantized_from_them(granularity, monkeypatch):
    monkeypatch.setenv("TELEFUSER_SAGE_GRANULARITY", granularity)
    buffers = _sage_buffers()
    layer = buffers.layers[0]
    assert layer.k.dtype == torch.int8 and layer.v.dtype == sage.FP8 and layer.v.shape == (1, 2, 64, 384)
    assert layer.k.shape[1] == layer.key_rows.shape[1] == 384 + sage.K_BLOCK  # and a spare block
    assert formats.window_granularity(layer.key_int8_scales, layer.k.shape[1]) == granularity
    g = torch.Generator().manual_seed(5)
    shared = 3 * torch.randn(64, generator=g)
    written = {}
    # chunks of 70 rows into a 300-row window with a 40-row sink: appends, then ring slots that wrap; keys drift
    for index, plan in enumerate(_session_plans(300, 40, 70, [1] * 7)):
        slots = plan.slot_rows("cpu")
        k, v = _drifting_chunk(g, 70, shared=shared, drift=4.0 * index)
        formats.SAGE_WINDOW.write(layer, k, v, slots, plan.kept == 0)
        if index == 0:
            first = layer.key_mean.clone(), layer.value_scale.clone()
            assert torch.equal(first[0], k.float().mean(dim=1))  # the first chunk's numbers
        for i, row in enumerate(slots.tolist()):
            written[row] = (k[:, i], formats.window_values(v, first[1])[..., i])
    # the session's numbers stay those of the first write
    assert torch.equal(layer.key_mean, first[0]) and torch.equal(layer.value_scale, first[1])
    # data movement, exactly: bf16 keys by row, e4m3 values by the kernel's column
    values = sage.value_rows(layer.v)
    for row, (k_row, v8_row) in written.items():
        assert torch.equal(layer.key_rows[:, row], k_row)
        assert torch.equal(values[:, row].view(torch.uint8), v8_row.view(torch.uint8))
    # every block is what quantizing its rows now gives (no block kept scales its rows outgrew), bit for bit
    k8, scales = formats.window_key_blocks(layer.key_rows[:, :384], layer.key_mean, granularity)
    groups = scales.shape[-1]
    assert torch.equal(layer.k[:, :384], k8) and torch.equal(layer.key_int8_scales[..., :groups], scales)
    # so nothing saturates: every key dequantizes to within half a step of its group's scale, though the last
    # chunk's keys sit 24 standard deviations from the first chunk's mean
    rows = torch.tensor(sorted(written))
    step = emulation.expand_k_scales(layer.key_int8_scales, 384, granularity)[:, rows, :, None]
    dequantized = layer.k[:, rows].float() * step + layer.key_mean[:, None]
    assert ((dequantized - layer.key_rows[:, rows].float()).abs() <= step / 2 + 1e-5).all()
    # the other layer was never written
    other = buffers.layers[1]
    assert not other.key_mean.any() and not other.k.any() and not other.v.view(torch.uint8).any()
    formats.SAGE_WINDOW.load(buffers, [])  # a new session in these buffers starts from scratch
    assert not layer.k.any() and not layer.key_rows.any() and (layer.value_scale == 1).all()
    assert torch.equal(layer.key_mean, torch.zeros(1, 2, 64))


def test_pooled_buffers_refuse_a_session_of_another_kind():
    from telefuser.models.lingbot_world_v2.kv_cache import KVWindow, WindowError

    buffers = _sage_buffers(capacity=300, h=2, d=64)
    shape = dict(
        batch=1, num_layers=2, tokens_per_frame=100, local_attn_size=3, sink_size=1, local_heads=2, head_dim=64
    )
    with pytest.raises(WindowError, match="in the 'sage_sm90' format, not 2 of .* in 'plain'"):
        KVWindow(
            **shape, ulysses_degree=1, cross_kv=[], device=torch.device("cpu"), dtype=torch.bfloat16, buffers=buffers
        )


@pytest.mark.numerics
def test_window_attention_matches_fp32_with_keys_drifting_between_chunks():
    """Three chunks whose keys share an offset and drift by one of their own: within the kernel-level bound; the
    first design (one INT8 key scale per head fixed by the first chunk, 1.25x headroom) lands far above it."""
    layer = _sage_buffers(capacity=300).layers[0]
    g = torch.Generator().manual_seed(7)
    shared = 6 * torch.randn(64, generator=g)
    ks, vs = [], []
    for index, plan in enumerate(_session_plans(300, 100, 100, [1, 1, 1])):
        k, v = _drifting_chunk(g, 100, shared=shared, drift=0.0 if index == 0 else 2.0)
        formats.SAGE_WINDOW.write(layer, k, v, plan.slot_rows("cpu"), plan.kept == 0)
        ks.append(k)
        vs.append(v)
    q = (3 * torch.randn(1, 90, 2, 64, generator=g)).bfloat16()
    reference = _fp32_reference(q, torch.cat(ks, 1), torch.cat(vs, 1))
    ours = _window_emulated(q, layer, 300)
    rel = _rel_l2(ours, reference)
    print(f"window attention against fp32, drifting keys: rel L2 {rel:.3e}")
    assert 0 < rel <= REL_L2_BOUND
    # negative control: the first design's keys (saturating where a chunk drifted past the first chunk's range)
    first = ks[0].float()
    mean = first.mean(dim=1)
    head_scale = (first - mean[:, None]).abs().amax(dim=(1, 3)) * (1.25 / 127)  # [B, H]
    k8 = sage._int8(torch.cat(ks, 1).float() - mean[:, None], head_scale[:, None, :, None])
    k_scales = head_scale[:, :, None].expand(1, 2, layer.key_int8_scales.shape[-1]).contiguous()
    old = emulation.emulate_kernel(
        *sage.quantize_queries(q, "per_thread"), k8, k_scales[..., :12].contiguous(), layer.v, layer.value_scale,
        granularity="per_thread",
    )  # fmt: skip
    old_rel = _rel_l2(old, reference)
    print(f"negative control, one key scale per head from the first chunk: rel L2 {old_rel:.3e}")
    assert old_rel > 3 * REL_L2_BOUND


def _window_emulated(q, layer, kv_rows: int):
    """What the kernel op computes for a window (`SageWindow.attend`): Q quantized per call, the window's keys and
    values."""
    granularity = formats.window_granularity(layer.key_int8_scales, layer.k.shape[1])
    q8, q_scale = sage.quantize_queries(q, granularity)
    return _emulated_window_kernel(
        q8, q_scale, layer.k, layer.key_int8_scales, layer.v, layer.value_scale, out_dtype=torch.float32,
        granularity=granularity, kv_rows=torch.tensor([kv_rows]),
    )  # fmt: skip


# -- inside the model, the kernel emulated --------------------------------------------------------------------------------
SESSION_BOUND = REL_L2_BOUND / 2


def _emulated_window_kernel(q8, q_scale, k8, k_scale, v8, v_scale, *, out_dtype, granularity, kv_rows):
    rows = int(kv_rows)
    groups = math.ceil(rows / sage.K_BLOCK) * (4 if granularity == "per_thread" else 1)
    k_scale = k_scale[..., :groups].contiguous()
    return emulation.emulate_kernel(q8, q_scale, k8[:, :rows], k_scale, v8, v_scale, granularity=granularity).to(
        out_dtype
    )


@pytest.mark.numerics
def test_a_session_with_a_sage_window_matches_fp32(monkeypatch):
    from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, WindowError, build_random_lingbot_dit
    from telefuser.models.wan import attention as wan_attention_module

    monkeypatch.delenv("TELEFUSER_SAGE_WINDOW", raising=False)  # the quantized window is the default
    model = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=0).to(torch.bfloat16)
    reference_session, reference = session_under_impl(model, "sdpa")
    # cross-attention runs plain SDPA here: the window (written and attended through the kernel's layout) is under test
    monkeypatch.setattr(formats, "attention", lambda q, k, v, impl, kv_rows: attention(q, k, v, kv_rows=kv_rows))
    monkeypatch.setattr(wan_attention_module, "attention", lambda q, k, v, impl: attention(q, k, v))  # cross-attention
    monkeypatch.setattr(formats, "sage_sm90_quantized", _emulated_window_kernel)
    session, ours = session_under_impl(model, "sage_sm90")
    assert session.format is formats.SAGE_WINDOW and reference_session.format is formats.PLAIN_WINDOW
    assert session.layers[0].k.dtype == torch.int8
    # attention's error (the kernel-level bound) is diluted by the residual stream on its way to the flow
    # prediction: half the kernel-level bound for the whole model
    error = max(_rel_l2(o.float(), r.float()) for o, r in zip(ours, reference, strict=True))
    print(f"sage window session against bf16 SDPA: max rel L2 {error:.3e}")
    assert 0 < error <= SESSION_BOUND, error

    # negative control: V read with its scales doubled
    def doubled(*args, **kwargs):
        args = list(args)
        args[5] = args[5] * 2
        return _emulated_window_kernel(*args, **kwargs)

    monkeypatch.setattr(formats, "sage_sm90_quantized", doubled)
    _, wrong = session_under_impl(model, "sage_sm90")
    wrong_error = max(_rel_l2(o.float(), r.float()) for o, r in zip(wrong, reference, strict=True))
    print(f"negative control: {wrong_error:.3e}")
    assert wrong_error > 3 * SESSION_BOUND, wrong_error
    # the session serves only the implementation it was made for
    model.attn_impl = "sdpa"
    latents = torch.randn(1, model.config.in_dim, 1, *GRID_HW)
    with pytest.raises(
        WindowError,
        match=r"^the KV window is kept in the 'sage_sm90' format, which attention sage_sm90 reads; the model "
        r"now runs 'sdpa': make a new window$",
    ):
        model.forward_chunk(session, latents, torch.tensor([500.0]), None, update_cache=False)


def test_a_sage_session_keeps_a_bf16_window_quantized_per_call_when_asked(monkeypatch):
    """``TELEFUSER_SAGE_WINDOW=0``: a ``sage_sm90`` session keeps a bf16 window and every call goes through the
    generic ``attention(..., impl="sage_sm90")`` (which quantizes Q, K and V itself); any other value is refused."""
    from telefuser.models.lingbot_world_v2 import LingBotWorldV2Config, build_random_lingbot_dit
    from telefuser.models.wan import attention as wan_attention_module

    monkeypatch.setenv("TELEFUSER_SAGE_WINDOW", "0")
    model = build_random_lingbot_dit(LingBotWorldV2Config.tiny(), seed=0).to(torch.bfloat16)
    impls = []

    def recorded(q, k, v, impl, kv_rows=None):
        impls.append(impl)
        return attention(q, k, v, kv_rows=kv_rows)

    monkeypatch.setattr(formats, "attention", recorded)
    monkeypatch.setattr(wan_attention_module, "attention", recorded)  # cross-attention
    session, outputs = session_under_impl(model, "sage_sm90")
    assert session.format is formats.PLAIN_WINDOW and session.layers[0].k.dtype == torch.bfloat16
    assert "sage_sm90" in impls and all(torch.isfinite(o).all() for o in outputs)
    monkeypatch.setenv("TELEFUSER_SAGE_WINDOW", "yes")
    with pytest.raises(ValueError, match="TELEFUSER_SAGE_WINDOW must be 0 or 1, got 'yes'"):
        session_under_impl(model, "sage_sm90")
