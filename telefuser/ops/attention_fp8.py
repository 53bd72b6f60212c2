"""FP8 (e4m3) attention through NVIDIA's cuDNN frontend (``nvidia-cudnn-frontend``, import name ``cudnn``): opt-in.

`fp8_attention(q, k, v)` takes the repository's ``[B, S, H, D]`` tensors (bf16 or fp16, any strides) and returns
``[B, S_q, H, D]`` in their dtype, contiguous. Per call and per tensor, dynamically:

- Q, K, V: ``amax`` (one reduction each, kept on the GPU), ``scale = 448 / amax``, e4m3 values in a fresh
  ``[B, S, H, D]``-contiguous buffer, ``descale = 1 / scale``. On CUDA the reduction and the cast are compiled
  (`ops.fusion.cuda_fused`): one pass each that reads any input strides, so a slice of a fused QKV tensor or a
  transposed view costs nothing extra;
- softmax probabilities P (in [0, 1]): ``scale_s = 448``, ``descale_s = 1 / 448``, the bound the frontend documents
  for E4M3 without dropout (``sdpa_fp8``'s docstring, "Amax S");
- O: Hopper's FP8 kernel writes e4m3 O. ``|O| <= amax(V)`` (a convex combination of V rows), so
  ``scale_o = 0.5 * 448 / amax(V)``; the factor 0.5 covers P's rounding (the numerator sums rounded P, the
  normalizer exact P) so no O value is ever clipped, at the cost of one binade at the bottom that attention outputs do
  not reach. O is dequantized with ``1 / scale_o`` into the input dtype.

All scales are float32 ``[1]`` tensors on the GPU that the graph reads at run time: no host sync per call.

The cuDNN graph (``cudnn.pygraph`` + ``sdpa_fp8``) is built once per (device, B, S_q, S_kv, H_q, H_kv, D, causal) and
cached; the e4m3 Q/K/V/O it sees are always ``[B, S, H, D]``-contiguous (declared as dims ``[B, H, S, D]`` with the
permuted strides, as in the frontend's own FP8 tests), so shape, strides and dtypes are all fixed by that key. The
cache and the cuDNN handle are per thread (cuDNN handles must not be shared across threads); the handle runs on
torch's current stream, set before every execute.

`tools/bench/attention_fp8_bench.py` measures it against cuDNN bf16, the quantization included; the numbers are in
docs/perf.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import threading
from dataclasses import dataclass

import torch

from .attention_registry import WINDOW_FP8_KEYS, attention_backend
from .fusion import cuda_fused

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
P_SCALE = FP8_MAX  # P = exp(S - rowmax) <= 1 -> at most 448; the frontend's documented bound for E4M3, no dropout
O_HEADROOM = 0.5  # scale_o = O_HEADROOM * 448 / amax(V): see the module docstring
MIN_CUDNN_BACKEND = 91400  # cuDNN 9.14: the frontend's own FP8 SDPA tests require it (9.19 ships with torch 2.11)
_TINY = 1e-12  # an all-zero tensor keeps a finite scale (its e4m3 values are zeros either way)

# Graph tensor uids (the variant pack is keyed by them).
_Q, _K, _V, _O = 1, 2, 3, 4
_DESCALE_Q, _DESCALE_K, _DESCALE_V, _DESCALE_S, _SCALE_S, _SCALE_O = 5, 6, 7, 8, 9, 10
_AMAX_O, _AMAX_S = 11, 12

_INSTALL_HINT = "python3 -m pip install nvidia-cudnn-frontend"


def _import_cudnn():
    try:
        return importlib.import_module("cudnn")
    except Exception as exc:  # ImportError, or OSError when its libraries do not load
        raise RuntimeError(
            f"attention implementation 'cudnn_fp8' needs NVIDIA's cuDNN frontend (nvidia-cudnn-frontend, import name "
            f"cudnn; {_INSTALL_HINT}); importing it failed: {exc}"
        ) from exc


def fp8_attention_available(device: torch.device | int | None = None) -> tuple[bool, str]:
    """(usable, why): a CUDA GPU of SM90 or newer, the cuDNN frontend importable, and a cuDNN it can use."""
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return (
            False,
            f"FP8 attention needs SM90 (Hopper) or newer; {torch.cuda.get_device_name(device)} is SM{major}{minor}",
        )
    if importlib.util.find_spec("cudnn") is None:
        return False, f"nvidia-cudnn-frontend (import name cudnn) is not installed; {_INSTALL_HINT}"
    try:
        cudnn = _import_cudnn()
        version = int(cudnn.backend_version())
        version_string = cudnn.backend_version_string()
    except Exception as exc:  # noqa: BLE001 - any failure here means "not usable", with the reason
        return False, str(exc)
    if version < MIN_CUDNN_BACKEND:
        return False, f"FP8 SDPA needs cuDNN >= 9.14, the frontend found {version_string}"
    return True, f"cuDNN frontend {getattr(cudnn, '__version__', '?')} on cuDNN {version_string}, SM{major}{minor}"


def _cast(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # x * scale in fp32, rounded once to e4m3; the clamp only catches a product past 448 (fp32 rounding, or a bound
    # that was not an upper bound), which the cast would otherwise turn into NaN
    return (x.float() * scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


@cuda_fused
def _scale_and_cast(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # One reduction and one pointwise pass when compiled (the eager chain reads the tensor several times).
    amax = x.abs().amax().float().clamp_min(_TINY).reshape(1)  # max |x|, exact
    scale = FP8_MAX / amax
    return _cast(x, scale), scale


@cuda_fused
def cast_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (any strides) times a known fp32 ``[1]`` scale, in e4m3 (saturating at +-448): one pass, no reduction."""
    return _cast(x, scale)


@cuda_fused
def _dequantize(o8: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (o8.float() * descale).to(dtype)  # e4m3 -> fp32 is exact; one rounding into dtype


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (any strides) -> (e4m3 values, contiguous in x's shape; fp32 scale [1]; fp32 descale [1]) with
    ``x ~= values * descale``, ``descale = 1 / scale``. Per-tensor and dynamic; nothing leaves the device."""
    values, scale = _scale_and_cast(x)
    return values.contiguous(), scale, scale.reciprocal()  # the compiled kernel may keep a strided input's layout


@dataclass
class _Graph:
    graph: object
    workspace_bytes: int
    declares_amax_s: bool


class _ThreadState(threading.local):
    def __init__(self):
        self.handles: dict[int, object] = {}  # device index -> cudnn.Handle
        self.constants: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # device index -> (scale_s, descale_s)
        self.graphs: dict[tuple, _Graph] = {}


_state = _ThreadState()
_builds_lock = threading.Lock()
_builds = [0]  # graphs built in this process, all threads (the cache tests count them)


def fp8_graph_cache_info() -> dict[str, int]:
    """``builds``: graphs built so far in this process; ``cached``: graphs cached for the calling thread."""
    return {"builds": _builds[0], "cached": len(_state.graphs)}


def clear_fp8_graph_cache() -> None:
    """Drop the calling thread's cached graphs (the next call per shape builds again)."""
    _state.graphs.clear()


def _handle(cudnn, device: torch.device):
    handle = _state.handles.get(device.index)
    if handle is None:
        handle = _state.handles[device.index] = cudnn.create_handle()  # bound to the current (= this) device
    return handle


def _constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    consts = _state.constants.get(device.index)
    if consts is None:  # torch.full: a fill kernel, no host-to-device copy
        scale_s = torch.full((1,), P_SCALE, dtype=torch.float32, device=device)
        consts = _state.constants[device.index] = (scale_s, scale_s.reciprocal())
    return consts


def _bshd_tensor(graph, data_type, uid: int, b: int, s: int, h: int, d: int, batch_stride: int):
    # dims [B, H, S, D] over memory that is [S, H, D]-contiguous per batch entry (a window's prefix has a longer
    # batch stride than S * H * D)
    return graph.tensor(uid=uid, dim=(b, h, s, d), stride=(batch_stride, d, h * d, 1), data_type=data_type)


def _build(cudnn, handle, key: tuple, declare_amax_s: bool) -> _Graph:
    _, b, s_q, s_kv, h_q, h_kv, d, causal, (q_stride, k_stride, v_stride) = key
    fp8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(
        name="telefuser_sdpa_fp8", io_data_type=fp8, intermediate_data_type=f32, compute_data_type=f32, handle=handle
    )

    def scalar(uid: int):
        return graph.tensor(uid=uid, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)

    kwargs = {
        "q": _bshd_tensor(graph, fp8, _Q, b, s_q, h_q, d, q_stride),
        "k": _bshd_tensor(graph, fp8, _K, b, s_kv, h_kv, d, k_stride),
        "v": _bshd_tensor(graph, fp8, _V, b, s_kv, h_kv, d, v_stride),
        "descale_q": scalar(_DESCALE_Q),
        "descale_k": scalar(_DESCALE_K),
        "descale_v": scalar(_DESCALE_V),
        "descale_s": scalar(_DESCALE_S),
        "scale_s": scalar(_SCALE_S),
        "scale_o": scalar(_SCALE_O),
        "generate_stats": False,  # inference: no softmax stats
        "attn_scale": 1.0 / math.sqrt(d),  # torch SDPA's default
    }
    if causal:  # torch's is_causal: top-left aligned, key j <= query i
        kwargs.update(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, right_bound=0)
    o, _stats, amax_s, amax_o = graph.sdpa_fp8(**kwargs)
    o.set_uid(_O).set_output(True).set_dim((b, h_q, s_q, d)).set_stride((s_q * h_q * d, d, h_q * d, 1))
    o.set_data_type(fp8)  # Hopper's FP8 SDPA writes FP8 O
    amax_o.set_uid(_AMAX_O).set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
    if declare_amax_s:  # deprecated output; only declared if a backend refuses the graph without it
        amax_s.set_uid(_AMAX_S).set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return _Graph(graph, int(graph.get_workspace_size()), declare_amax_s)


def _graph(cudnn, handle, key: tuple) -> _Graph:
    entry = _state.graphs.get(key)
    if entry is not None:
        return entry
    errors = []
    for declare_amax_s in (False, True):  # the frontend's tests leave Amax_S virtual; older backends may want it
        try:
            entry = _build(cudnn, handle, key, declare_amax_s)
            break
        except Exception as exc:  # noqa: BLE001 - reported below with the shape
            errors.append(f"{'with' if declare_amax_s else 'without'} Amax_S: {type(exc).__name__}: {exc}")
    if entry is None:
        _, b, s_q, s_kv, h_q, h_kv, d, causal, _ = key
        raise RuntimeError(
            f"cuDNN cannot build an FP8 SDPA graph for B={b} S_q={s_q} S_kv={s_kv} H_q={h_q} H_kv={h_kv} D={d} "
            f"causal={causal}: " + "; ".join(errors)
        )
    with _builds_lock:
        _builds[0] += 1
    _state.graphs[key] = entry
    return entry


def _check_device(t: torch.Tensor) -> None:
    if not t.is_cuda:
        raise RuntimeError(f"attention implementation 'cudnn_fp8' needs CUDA tensors, got one on {t.device}")
    major, minor = torch.cuda.get_device_capability(t.device)
    if major < 9:
        raise RuntimeError(
            f"attention implementation 'cudnn_fp8' needs SM90 (Hopper) or newer, {t.device} is SM{major}{minor}"
        )


def fp8_attention_quantized(
    q8: torch.Tensor,
    k8: torch.Tensor,
    v8: torch.Tensor,
    descale_q: torch.Tensor,
    descale_k: torch.Tensor,
    descale_v: torch.Tensor,
    scale_o: torch.Tensor,
    *,
    causal: bool = False,
    kv_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The cuDNN FP8 kernel alone: e4m3 ``[B, S, H, D]`` Q/K/V, each ``[S, H, D]``-contiguous per batch entry (any
    batch stride: a window buffer's prefix qualifies), and their fp32 ``[1]`` descales (see `quantize_fp8`) -> e4m3
    O ``[B, S_q, H_q, D]`` contiguous, ``O ~= result / scale_o``. `kv_rows` (CPU int64 ``[1]``): attend to the first
    kv_rows rows of K and V only. Inside a compiled region this is the opaque op ``telefuser::cudnn_fp8_sdpa``."""
    if torch.compiler.is_compiling():
        return torch.ops.telefuser.cudnn_fp8_sdpa(q8, k8, v8, descale_q, descale_k, descale_v, scale_o, causal, kv_rows)
    if kv_rows is not None:
        rows = int(kv_rows)
        k8, v8 = k8[:, :rows], v8[:, :rows]
    return _cudnn_fp8_sdpa(q8, k8, v8, descale_q, descale_k, descale_v, scale_o, causal)


@torch.library.custom_op("telefuser::cudnn_fp8_sdpa", mutates_args=())
def _cudnn_fp8_sdpa_op(
    q8: torch.Tensor,
    k8: torch.Tensor,
    v8: torch.Tensor,
    descale_q: torch.Tensor,
    descale_k: torch.Tensor,
    descale_v: torch.Tensor,
    scale_o: torch.Tensor,
    causal: bool,
    kv_rows: torch.Tensor | None,
) -> torch.Tensor:
    return fp8_attention_quantized(q8, k8, v8, descale_q, descale_k, descale_v, scale_o, causal=causal, kv_rows=kv_rows)


@_cudnn_fp8_sdpa_op.register_fake
def _(q8, k8, v8, descale_q, descale_k, descale_v, scale_o, causal, kv_rows):
    return q8.new_empty(q8.shape)


def _cudnn_fp8_sdpa(q8, k8, v8, descale_q, descale_k, descale_v, scale_o, causal: bool) -> torch.Tensor:
    cudnn = _import_cudnn()
    _check_device(q8)
    for name, t in (("q", q8), ("k", k8), ("v", v8)):
        if t.dtype != FP8 or t.dim() != 4 or t.device != q8.device or not _rows_contiguous(t):
            raise ValueError(
                f"{name} must be a 4-D float8_e4m3fn [B, S, H, D] tensor on {q8.device}, [S, H, D]-contiguous per "
                f"batch entry; got {t.dtype} {tuple(t.shape)} strides {t.stride()} on {t.device}"
            )
    b, s_q, h_q, d = q8.shape
    _, s_kv, h_kv, _ = k8.shape
    if k8.shape != v8.shape or k8.shape[0] != b or k8.shape[3] != d or h_q % h_kv:
        raise ValueError(f"shapes do not fit attention: q {tuple(q8.shape)}, k {tuple(k8.shape)}, v {tuple(v8.shape)}")
    device = q8.device
    strides = tuple(t.stride(0) for t in (q8, k8, v8))
    key = (device.index, b, s_q, s_kv, h_q, h_kv, d, bool(causal), strides)
    with torch.cuda.device(device):
        handle = _handle(cudnn, device)
        cudnn.set_stream(handle, torch.cuda.current_stream(device).cuda_stream)  # a no-op while it is unchanged
        entry = _graph(cudnn, handle, key)
        scale_s, descale_s = _constants(device)
        o8 = torch.empty((b, s_q, h_q, d), dtype=FP8, device=device)
        pack = {
            _Q: q8,
            _K: k8,
            _V: v8,
            _O: o8,
            _DESCALE_Q: descale_q,
            _DESCALE_K: descale_k,
            _DESCALE_V: descale_v,
            _DESCALE_S: descale_s,
            _SCALE_S: scale_s,
            _SCALE_O: scale_o,
            _AMAX_O: torch.empty((1,), dtype=torch.float32, device=device),
        }
        if entry.declares_amax_s:
            pack[_AMAX_S] = torch.empty((1,), dtype=torch.float32, device=device)
        workspace = torch.empty((max(entry.workspace_bytes, 1),), dtype=torch.uint8, device=device)
        entry.graph.execute(pack, workspace, handle=handle)
    return o8


def _rows_contiguous(t: torch.Tensor) -> bool:
    _, _, h, d = t.shape
    return t.stride()[1:] == (h * d, d, 1)


# traced: inside a block region the quantization fuses with its neighbours; a LingBot KV window keeps FP8 keys for it
@attention_backend("cudnn_fp8", available=fp8_attention_available, traced=True, window_format=WINDOW_FP8_KEYS)
def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """Softmax attention on ``[B, S, H, D]`` CUDA tensors in FP8 (e4m3) through cuDNN, per-tensor dynamic scales;
    returns ``[B, S_q, H, D]`` in q's dtype, contiguous. See the module docstring for the recipe."""
    if not torch.compiler.is_compiling():  # checked eagerly; a compiled region meets the kernel op's own checks
        _import_cudnn()  # the clearest error first
        _check_device(q)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected [B, S, H, D] tensors, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    q8, _, descale_q = quantize_fp8(q)
    k8, _, descale_k = quantize_fp8(k)
    v8, scale_v, descale_v = quantize_fp8(v)
    scale_o = scale_v * O_HEADROOM
    o8 = fp8_attention_quantized(q8, k8, v8, descale_q, descale_k, descale_v, scale_o, causal=causal)
    return _dequantize(o8, descale_v / O_HEADROOM, q.dtype)


def fp8_attention_known_scales(
    q: torch.Tensor,
    k8: torch.Tensor,
    descale_k: torch.Tensor,
    v: torch.Tensor,
    amax_v: torch.Tensor,
    *,
    kv_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 attention over a cache that keeps K in e4m3 and knows a bound on V (a LingBot KV window, `KVWindow`):
    Q ``[B, S_q, H, D]`` (bf16/fp16) is quantized per call as in `fp8_attention`; K ``[B, S_kv, H, D]`` is already
    e4m3 (``K ~= k8 * descale_k``); V (bf16/fp16, any strides) is cast with ``scale = 448 / amax_v`` in one pass,
    with no reduction over its rows, where ``amax_v >= max |V|`` (fp32 ``[1]``; a bound that is too low clips at
    448). `kv_rows` (CPU int64 ``[1]``): K and V are whole window buffers of which the first kv_rows rows are
    attended (V is cast whole: once the window is full, that is every row anyway). Returns ``[B, S_q, H, D]`` in q's
    dtype, contiguous."""
    if not torch.compiler.is_compiling():
        _import_cudnn()
        _check_device(q)
    if not (q.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(f"q and v must share one floating dtype, got {q.dtype}, {v.dtype}")
    q8, _, descale_q = quantize_fp8(q)
    scale_v = FP8_MAX / amax_v.float().clamp_min(_TINY)
    v8 = cast_fp8(v, scale_v).contiguous()
    scale_o = scale_v * O_HEADROOM  # |O| <= max |V| <= amax_v, as in fp8_attention
    o8 = fp8_attention_quantized(q8, k8, v8, descale_q, descale_k, scale_v.reciprocal(), scale_o, kv_rows=kv_rows)
    return _dequantize(o8, scale_o.reciprocal(), q.dtype)
