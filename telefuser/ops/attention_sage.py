"""SageAttention2's SM90 kernel (INT8 Q·K, FP8 P·V, fp32+fp32 accumulation) with our own quantization: ``sage_sm90``.

SageAttention2 (thu-ml, Apache-2.0) is not on PyPI as a wheel; users build its two SM90 extensions from source
(``sageattention._qattn_sm90``, ``sageattention._fused``; `ops/README.md` has the command). We call one kernel op of
``_qattn_sm90`` directly, ``qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf`` (the op its
``sageattn_qk_int8_pv_fp8_cuda_sm90`` calls for ``pv_accum_dtype="fp32+fp32"``), and quantize Q, K and V here in torch,
so that on CUDA the quantization compiles (`ops.fusion.cuda_fused`, or traced into a block region) and reads our
``[B, S, H, D]`` tensors with any strides: no separate transpose pass.

The kernel's contract, as read from its launch code (the layouts we hand it are NHD, ``tensor_layout=0``):

- Q int8 ``[B, S_q, H_q, D]``, K int8 ``[B, S_kv, H_kv, D]``: last dim contiguous, other strides free (TMA reads them;
  rows past S are filled with zeros by the TMA unit). ``D`` is 64 or 128; ``H_q % H_kv == 0``.
- Blocks: 64 query rows per CTA, each of its 4 warps owns 16 rows; 128 keys per step.
- Q scales fp32 ``[B, H_q, n]`` contiguous, ``x ~= int8 * scale``:
  per-warp ``n = ceil(S_q/64) * 4``, one scale per 16 rows; per-thread ``n = ceil(S_q/64) * 32``: inside a warp's 16
  rows, rows ``r`` and ``r + 8`` share scale ``warp * 8 + r % 8`` (a thread's two accumulator rows).
- K scales fp32 ``[B, H_kv, m]`` contiguous: per-warp ``m = ceil(S_kv/128)``, one scale per 128-key block; per-thread
  ``m = ceil(S_kv/128) * 4``: key ``j`` of a block uses scale ``block * 4 + (j % 8) // 2`` (the key columns a thread
  holds). Q and K always share one granularity (one template argument).
- V float8_e4m3fn, transposed: ``[B, D, H_kv, L]`` in NHD mode with the key axis contiguous and ``L >= ceil(S_kv/128)
  * 128`` (any batch/head/channel strides that are multiples of 16 bytes). Inside every group of 16 keys, key ``r`` sits
  at column ``4 * ((r % 8) // 2) + 2 * (r // 8) + r % 2``: the order in which the P fragment of a thread feeds the
  FP8 MMA. Keys ``>= S_kv`` are masked in the scores, their V columns must only be finite.
- V scales fp32 ``[B, H_kv, D]`` contiguous (one per channel), applied to O after normalization.
- O: a ``[B, S_q, H_q, D]`` bf16/fp16 tensor (last dim contiguous) the kernel fills; ``sm_scale`` a float (it
  multiplies by log2(e) itself).
- The math: ``S = (q8 . k8) * q_scale * k_scale``; online softmax in base 2 per 128-key step with the running row max
  offset so that ``P = exp2(S * sm_scale * log2e - m)`` peaks at ``2^8.807 ~ 448``; P rounded to e4m3 for the P·V
  MMA, the normalizer summing the unrounded fp32 P; O divided by it, then times the V scales (the tests'
  `tests/unit/sage_emulation.py` is the same math in plain torch).

Our choices:

- **K smoothing.** K minus its per-channel mean over the keys of the call (per batch entry and head): ``q . (k - m)``
  differs from ``q . k`` by ``q . m``, the same for every key of a query row, so softmax and O are unchanged, while the
  INT8 range no longer spends itself on a shared offset. Any vector works as long as ONE is subtracted from every key
  a query sees (a LingBot window uses one per session: `models/lingbot_world_v2/window_formats.SageWindow`).
- **Granularity.** ``per_thread`` by default: the kernel reads one Q scale per thread and one K scale per 128-key
  step in both modes, and our quantization is one compiled pass either way, so the finer scales (2 query rows, 32
  interleaved keys of a block, instead of 16 rows and 128 keys) cost nothing measurable in the kernel and shrink the
  INT8 rounding error where rows differ in range. ``per_warp`` stays selectable (`TELEFUSER_SAGE_GRANULARITY`) for the
  bench and the gate to compare.
- **V.** One scale per channel, ``amax / 448`` over the keys, in the transposed, permuted layout above, written in
  the same compiled pass that reads V: no separate transpose.

The stream: the extension launches with ``<<<grid, block, smem>>>`` and no stream. Built with
``NVCC_APPEND_FLAGS="--default-stream per-thread"`` those launches go to ``cudaStreamPerThread``, which we fork from
and join back to torch's current stream with two events (`_on_caller_stream`): the kernel then follows the caller's
stream order (side streams, Ulysses overlap) and a CUDA graph captures it (the per-thread stream joins the capture
through the event). A build without the flag launches on the legacy default stream, which neither orders with
torch's non-blocking side streams nor may run while a graph is being captured: `launch_stream_of_build` reads the
extension's dynamic symbols (``__cudaLaunchKernel_ptsz`` vs ``__cudaLaunchKernel``, what nvcc's launch stubs call)
and such a build is refused with the rebuild command.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import struct
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from .attention_registry import WINDOW_SAGE_SM90, attention_backend
from .fusion import cuda_fused
from .opaque import fresh_output

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
INT8_MAX = 127.0
Q_BLOCK, WARP_ROWS, K_BLOCK = 64, 16, 128
GRANULARITIES = {"per_warp": 2, "per_thread": 3}  # the kernel's QuantGranularity codes
HEAD_DIMS = (64, 128)
P_OFFSET_LOG2 = 8.807  # the kernel's row max offset: P <= 2^8.807 ~ 448, e4m3's largest value
_TINY = 1e-12  # an all-zero group keeps a finite scale (its values are zeros either way)
_PER_THREAD_STREAM = 0x2  # cudaStreamPerThread

KERNEL_OP = "qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf"
BUILD_COMMAND = (
    "cd <SageAttention 2.2.0 source> && TORCH_CUDA_ARCH_LIST=9.0 NVCC_APPEND_FLAGS='--default-stream per-thread' "
    "EXT_PARALLEL=4 MAX_JOBS=16 python3 -m pip install --no-build-isolation ."
)
_BUILD_HINT = f"build it from source with launches on the per-thread default stream: {BUILD_COMMAND} (ops/README.md)"


def default_granularity() -> str:
    gran = os.environ.get("TELEFUSER_SAGE_GRANULARITY", "per_thread")
    if gran not in GRANULARITIES:
        raise ValueError(f"TELEFUSER_SAGE_GRANULARITY must be one of {', '.join(GRANULARITIES)}, got {gran!r}")
    return gran


# -- the build ------------------------------------------------------------------------------------------------------
def _import_extension():
    try:
        ext = importlib.import_module("sageattention._qattn_sm90")
        importlib.import_module("sageattention._fused")
    except Exception as exc:  # ImportError, or OSError when its libraries (libcuda) do not load
        raise RuntimeError(
            f"attention implementation 'sage_sm90' needs SageAttention2's SM90 extensions (sageattention._qattn_sm90 "
            f"and sageattention._fused), which did not import ({exc}); {_BUILD_HINT}"
        ) from exc
    if not hasattr(ext, KERNEL_OP):
        raise RuntimeError(f"sageattention._qattn_sm90 ({ext.__file__}) has no {KERNEL_OP}; {_BUILD_HINT}")
    return ext


def _undefined_dynamic_symbols(path: str | Path) -> set[str]:
    """Names of the undefined symbols in an ELF64 little-endian shared object's .dynsym (what it imports)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 11:  # SHT_DYNSYM
            continue
        str_offset = sections[link][4]
        for pos in range(offset + entsize, offset + size, entsize):  # entry 0 is the null symbol
            st_name, _, _, st_shndx = struct.unpack_from("<IBBH", data, pos)
            if st_shndx == 0 and st_name:
                end = data.index(b"\x00", str_offset + st_name)
                names.add(data[str_offset + st_name : end].decode("ascii", "replace"))
    return names


@functools.lru_cache(maxsize=8)  # read once per file: every kernel call checks the build it runs
def launch_stream_of_build(path: str | Path) -> str:
    """Where a CUDA extension's ``<<<>>>`` launches without a stream go, from the launch entry nvcc's stubs import:
    ``"per-thread"`` (``__cudaLaunchKernel_ptsz``: built with ``--default-stream per-thread``), ``"legacy"``
    (``__cudaLaunchKernel``), ``"mixed"`` (both: some files built either way) or ``"unknown"`` (neither: the CUDA
    runtime linked statically, or not an ELF file)."""
    try:
        symbols = _undefined_dynamic_symbols(path)
    except (OSError, ValueError, struct.error):
        return "unknown"
    per_thread, legacy = "__cudaLaunchKernel_ptsz" in symbols, "__cudaLaunchKernel" in symbols
    return {(True, False): "per-thread", (False, True): "legacy", (True, True): "mixed"}.get(
        (per_thread, legacy), "unknown"
    )


def _extension_file() -> str | None:
    """The ``_qattn_sm90`` shared object of the installed ``sageattention`` package, found without importing it."""
    spec = importlib.util.find_spec("sageattention")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("_qattn_sm90*.so"))
        if found:
            return str(found[0])
    return None


def sage_sm90_build_info() -> dict:
    """What `telefuser info` reports: whether the SM90 extension is there, where, whether it imports here, and where
    its launches go. Needs no GPU."""
    path = _extension_file()
    info: dict = {"installed": path is not None, "path": path}
    if path is None:
        info["hint"] = _BUILD_HINT
        return info
    info["launches"] = launch_stream_of_build(path)
    info["follows_caller_stream"] = info["launches"] == "per-thread"
    try:
        _import_extension()
        info["imports"] = True
    except RuntimeError as exc:
        info["imports"] = False
        info["error"] = str(exc.__cause__ or exc)
    return info


def _check_launch_stream(ext) -> None:
    mode = launch_stream_of_build(ext.__file__)
    if mode in ("legacy", "mixed"):
        raise RuntimeError(
            f"attention implementation 'sage_sm90': {ext.__file__} launches its kernels on CUDA's legacy default "
            f"stream ({mode}), which does not follow torch's streams and breaks CUDA graph capture; rebuild it with "
            f"NVCC_APPEND_FLAGS='--default-stream per-thread': {BUILD_COMMAND}"
        )


def sage_sm90_available(device: torch.device | int | None = None) -> tuple[bool, str]:
    """(usable, why): a CUDA GPU of compute capability 9.0 (the kernels are sm_90a), the two extensions importable,
    and a build whose launches go to the per-thread default stream (or one we cannot tell: a static CUDA runtime)."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    try:
        ext = _import_extension()
    except RuntimeError as exc:
        return False, str(exc)
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return False, (
            f"attention implementation 'sage_sm90' runs SageAttention2's sm_90a kernel, which needs an SM90 (Hopper) "
            f"GPU; {torch.cuda.get_device_name(device)} is SM{major}{minor}"
        )
    try:
        _check_launch_stream(ext)
    except RuntimeError as exc:
        return False, str(exc)
    return True, f"SageAttention2 SM90 ({ext.__file__}, launches {launch_stream_of_build(ext.__file__)})"


# -- quantization (plain torch: the CPU reference, compiled on CUDA) ------------------------------------------------
def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-x.shape[1]) % multiple
    return F.pad(x, (0, 0, 0, 0, 0, pad)) if pad else x


def _int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # round to nearest; the clamp only catches fp32 rounding of x / (amax / 127) just past 127
    return (x / scale).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)


def _quantize_q(q: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    b, s, h, d = q.shape
    x = _pad_rows(q.float(), Q_BLOCK)
    tiles = x.shape[1] // WARP_ROWS
    if granularity == "per_warp":
        g = x.view(b, tiles, WARP_ROWS, h, d)
        scale = g.abs().amax(dim=(2, 4)).clamp_min(_TINY) / INT8_MAX  # [b, tiles, h]
        q8 = _int8(g, scale[:, :, None, :, None])
    else:  # rows r and r + 8 of a warp's 16 share a scale
        g = x.view(b, tiles, 2, 8, h, d)
        scale = g.abs().amax(dim=(2, 5)).clamp_min(_TINY) / INT8_MAX  # [b, tiles, 8, h]
        q8 = _int8(g, scale[:, :, None, :, :, None])
        scale = scale.reshape(b, tiles * 8, h)
    return q8.reshape(b, -1, h, d)[:, :s], scale.transpose(1, 2).contiguous()


def _k_scales(x: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x fp32 ``[B, L, H, D]`` with L a multiple of 128 -> (the scale of each element's group broadcastable to a
    ``[B, L // 128, ...]`` view of x, the kernel's ``[B, H, m]`` scales)."""
    b, length, h, d = x.shape
    blocks = length // K_BLOCK
    if granularity == "per_warp":  # one scale per 128-key block
        g = x.view(b, blocks, K_BLOCK, h, d)
        scale = g.abs().amax(dim=(2, 4)).clamp_min(_TINY) / INT8_MAX  # [b, blocks, h]
        return scale[:, :, None, :, None], scale.transpose(1, 2).contiguous()
    g = x.view(b, blocks, 16, 4, 2, h, d)  # key j = 8 * (j // 8) + 2 * group + (j % 2): group = (j % 8) // 2
    scale = g.abs().amax(dim=(2, 4, 6)).clamp_min(_TINY) / INT8_MAX  # [b, blocks, 4, h]
    return scale[:, :, None, :, None, :, None], scale.reshape(b, blocks * 4, h).transpose(1, 2).contiguous()


def _quantize_k(k: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = k.float()
    x = _pad_rows(x - x.mean(dim=1, keepdim=True), K_BLOCK)  # smoothed; padding rows stay 0
    k8, scales = quantize_key_blocks(x, granularity)
    return k8[:, : k.shape[1]], scales


def quantize_key_blocks(x: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Smoothed fp32 keys of whole 128-key blocks ``[B, L, H, D]`` -> (int8 keys of the same shape, the kernel's
    scales ``[B, H, L // 128 * groups per block]``), each group scaled to its own max."""
    b, length, h, d = x.shape
    broadcast, scales = _k_scales(x, granularity)
    return _int8(_grouped(x, granularity), broadcast).reshape(b, length, h, d), scales


def _grouped(x: torch.Tensor, granularity: str) -> torch.Tensor:
    b, length, h, d = x.shape
    if granularity == "per_warp":
        return x.view(b, length // K_BLOCK, K_BLOCK, h, d)
    return x.view(b, length // K_BLOCK, 16, 4, 2, h, d)


def value_layout(x: torch.Tensor) -> torch.Tensor:
    """``[B, L, H, D]`` (L a multiple of 16) -> the kernel's ``[B, H, D, L]`` with each group of 16 keys permuted:
    key ``8a + 2g + i`` to column ``4g + 2a + i`` (a view chain; `.contiguous()` materializes it)."""
    b, length, h, d = x.shape
    return x.view(b, length // 16, 2, 4, 2, h, d).permute(0, 5, 6, 1, 3, 2, 4).reshape(b, h, d, length)


def value_rows(v_t: torch.Tensor) -> torch.Tensor:
    """The inverse of `value_layout`: the kernel's ``[B, H, D, L]`` back to ``[B, L, H, D]`` rows (tests, tools)."""
    b, h, d, length = v_t.shape
    return v_t.reshape(b, h, d, length // 16, 4, 2, 2).permute(0, 3, 5, 4, 6, 1, 2).reshape(b, length, h, d)


def value_columns(rows: torch.Tensor) -> torch.Tensor:
    """The kernel-layout column of each key row (int64, any device): where `write` puts a window row's V."""
    r = rows % 16
    return rows - r + 4 * ((r % 8) // 2) + 2 * (r // 8) + r % 2


def cast_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale in e4m3, saturating at +-448 (a value scale that was not an upper bound clips instead of NaN)."""
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _quantize_v(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = _pad_rows(v.float(), K_BLOCK)
    scale = x.abs().amax(dim=1).clamp_min(_TINY) / FP8_MAX  # [b, h, d]
    return value_layout(cast_e4m3(x, scale[:, None])).contiguous(), scale


@cuda_fused
def _quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, granularity: str):
    q8, q_scale = _quantize_q(q, granularity)
    k8, k_scale = _quantize_k(k, granularity)
    v8, v_scale = _quantize_v(v)
    return q8, q_scale, k8, k_scale, v8, v_scale


@cuda_fused
def _quantize_queries(q: torch.Tensor, granularity: str):
    return _quantize_q(q, granularity)


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, granularity: str | None = None):
    """``[B, S, H, D]`` Q, K, V (any strides) -> what the kernel takes: ``(q8, q_scale, k8, k_scale, v8, v_scale)``
    (layouts in the module docstring; q8/k8 are row views of buffers padded to whole blocks). K is smoothed by its
    per-channel mean over the keys."""
    return _quantize(q, k, v, granularity or default_granularity())


def quantize_queries(q: torch.Tensor, granularity: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Q alone: ``(q8, q_scale)``, as in `quantize` (a KV window's keys and values are quantized when written)."""
    return _quantize_queries(q, granularity or default_granularity())


# -- the kernel -----------------------------------------------------------------------------------------------------
class _Events(threading.local):
    def __init__(self):
        self.by_device: dict[int, tuple[torch.cuda.Event, torch.cuda.Event]] = {}


_events = _Events()


def _on_caller_stream(device: torch.device, launch) -> None:
    """Run `launch` (whose kernels go to ``cudaStreamPerThread``) ordered inside torch's current stream: the
    per-thread stream waits for what the caller enqueued before, and the caller for the kernel. Under CUDA graph
    capture the first event pulls the per-thread stream into the capture and the second joins it back. The tensors
    the kernel touches were allocated on the caller's stream, which cannot reuse them before the join."""
    pair = _events.by_device.get(device.index)
    if pair is None:
        pair = _events.by_device[device.index] = (torch.cuda.Event(), torch.cuda.Event())
    ready, done = pair
    caller = torch.cuda.current_stream(device)
    kernel_stream = torch.cuda.ExternalStream(_PER_THREAD_STREAM, device=device)
    ready.record(caller)
    kernel_stream.wait_event(ready)
    launch()
    done.record(kernel_stream)
    caller.wait_event(done)


def _check_inputs(q8, q_scale, k8, k_scale, v8, v_scale, granularity: str) -> None:
    b, s_q, h_q, d = q8.shape
    _, s_kv, h_kv, _ = k8.shape
    if q8.dtype != torch.int8 or k8.dtype != torch.int8 or v8.dtype != FP8:
        raise ValueError(f"expected int8 Q/K and float8_e4m3fn V, got {q8.dtype}, {k8.dtype}, {v8.dtype}")
    if d not in HEAD_DIMS or k8.shape[0] != b or k8.shape[3] != d or h_q % h_kv:
        raise ValueError(f"shapes do not fit the kernel (head dim 64 or 128): q {tuple(q8.shape)}, k {tuple(k8.shape)}")
    if v8.shape[:3] != (b, h_kv, d) or v8.shape[3] < math.ceil(s_kv / K_BLOCK) * K_BLOCK or v8.stride(3) != 1:
        raise ValueError(
            f"v must be the kernel's [B, H_kv, D, L >= {math.ceil(s_kv / K_BLOCK) * K_BLOCK}] layout, got "
            f"{tuple(v8.shape)} strides {v8.stride()}"
        )
    per_thread = granularity == "per_thread"
    q_groups = math.ceil(s_q / Q_BLOCK) * (32 if per_thread else 4)
    for name, t, shape in (
        ("q_scale", q_scale, (b, h_q, q_groups)),
        ("k_scale", k_scale, (b, h_kv, math.ceil(s_kv / K_BLOCK) * (4 if per_thread else 1))),
        ("v_scale", v_scale, (b, h_kv, d)),
    ):
        if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous float32 {shape}, got {t.dtype} {tuple(t.shape)}")


def _run_kernel(q8, q_scale, k8, k_scale, v8, v_scale, granularity: str, causal: bool, out_dtype, sm_scale):
    if not q8.is_cuda:
        raise RuntimeError(f"attention implementation 'sage_sm90' needs CUDA tensors, got one on {q8.device}")
    ext = _import_extension()
    _check_launch_stream(ext)
    major, minor = torch.cuda.get_device_capability(q8.device)
    if (major, minor) != (9, 0):
        raise RuntimeError(
            f"attention implementation 'sage_sm90' needs an SM90 (Hopper) GPU; {q8.device} is SM{major}{minor}"
        )
    _check_inputs(q8, q_scale, k8, k_scale, v8, v_scale, granularity)
    out = torch.empty(q8.shape, dtype=out_dtype, device=q8.device)
    kernel = getattr(ext, KERNEL_OP)
    with torch.cuda.device(q8.device):
        _on_caller_stream(
            q8.device,
            lambda: kernel(
                q8, k8, v8.permute(0, 2, 1, 3), out, q_scale, k_scale, v_scale,
                0, int(causal), GRANULARITIES[granularity], float(sm_scale), 0,
            ),
        )  # fmt: skip
    return out


def sage_sm90_quantized(
    q8: torch.Tensor,
    q_scale: torch.Tensor,
    k8: torch.Tensor,
    k_scale: torch.Tensor,
    v8: torch.Tensor,
    v_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype,
    granularity: str | None = None,
    causal: bool = False,
    kv_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The kernel alone, on inputs laid out as in the module docstring -> ``[B, S_q, H_q, D]`` in `out_dtype`.
    `kv_rows` (CPU int64 ``[1]``): attend to the first kv_rows keys only; `k_scale` may then cover more blocks (a
    window's capacity) and is cut to the blocks attended. Inside a compiled region this is the opaque op
    ``telefuser::sage_sm90_attention``."""
    granularity = granularity or default_granularity()
    if torch.compiler.is_compiling():
        return torch.ops.telefuser.sage_sm90_attention(
            q8, q_scale, k8, k_scale, v8, v_scale, out_dtype, granularity, causal, kv_rows
        )
    return _kernel_call(q8, q_scale, k8, k_scale, v8, v_scale, out_dtype, granularity, causal, kv_rows)


def _kernel_call(q8, q_scale, k8, k_scale, v8, v_scale, out_dtype, granularity: str, causal: bool, kv_rows):
    if kv_rows is not None:
        k8 = k8[:, : int(kv_rows)]
    groups = math.ceil(k8.shape[1] / K_BLOCK) * (4 if granularity == "per_thread" else 1)
    k_scale = k_scale[..., :groups].contiguous()  # a no-op unless a window's scales cover more blocks
    return _run_kernel(
        q8, q_scale, k8, k_scale, v8, v_scale, granularity, causal, out_dtype, 1.0 / math.sqrt(q8.shape[-1])
    )


@torch.library.custom_op("telefuser::sage_sm90_attention", mutates_args=())
def _sage_op(
    q8: torch.Tensor,
    q_scale: torch.Tensor,
    k8: torch.Tensor,
    k_scale: torch.Tensor,
    v8: torch.Tensor,
    v_scale: torch.Tensor,
    out_dtype: torch.dtype,
    granularity: str,
    causal: bool,
    kv_rows: torch.Tensor | None,
) -> torch.Tensor:
    out = _kernel_call(q8, q_scale, k8, k_scale, v8, v_scale, out_dtype, granularity, causal, kv_rows)
    return fresh_output(out, q8, k8, v8)


@_sage_op.register_fake
def _(q8, q_scale, k8, k_scale, v8, v_scale, out_dtype, granularity, causal, kv_rows):
    return torch.empty(q8.shape, dtype=out_dtype, device=q8.device)


# traced: inside a block region the quantization fuses with its neighbours; a LingBot session keeps its window in the
# kernel's layout for it
@attention_backend(
    "sage_sm90",
    available=sage_sm90_available,
    traced=True,
    head_dims=HEAD_DIMS,
    dtypes=("bfloat16", "float16"),
    window_format=WINDOW_SAGE_SM90,
)
def sage_sm90_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, granularity: str | None = None
) -> torch.Tensor:
    """Softmax attention on ``[B, S, H, D]`` CUDA tensors (bf16/fp16, any strides) through SageAttention2's SM90
    kernel with our quantization; returns ``[B, S_q, H, D]`` in q's dtype, contiguous."""
    if not torch.compiler.is_compiling():
        _import_extension()  # the clearest error first
        if not q.is_cuda:
            raise RuntimeError(f"attention implementation 'sage_sm90' needs CUDA tensors, got one on {q.device}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected [B, S, H, D] tensors, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q, k, v must share one dtype, bf16 or fp16; got {q.dtype}, {k.dtype}, {v.dtype}")
    granularity = granularity or default_granularity()
    q8, q_scale, k8, k_scale, v8, v_scale = _quantize(q, k, v, granularity)
    return sage_sm90_quantized(
        q8, q_scale, k8, k_scale, v8, v_scale, out_dtype=q.dtype, granularity=granularity, causal=causal
    )
