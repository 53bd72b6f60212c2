"""Attention backends as registered records, and the queries that choose one.

A backend is an `AttentionBackend`: its name, whether it is usable here and why (`available`), which head dims,
devices and dtypes it takes (`takes`), the callable that runs it, whether a compiled region traces that callable,
whether it takes host (CPU) tensors, and the KV-window format a LingBot session keeps for it. Each backend registers
itself where it is defined, with the `attention_backend` decorator on its runner (ops/attention.py,
attention_fp8.py, attention_sage.py).

This module imports no torch: every backend's name is declared here with the module that defines it
(`BACKEND_MODULES`), so command lines offer the names without importing a kernel, and a query imports the module of
a backend at its first use. `check_backend` and `resolve_backend` are what models and entry points call: the one
check of a name (known, usable here, takes the model's head dim) and the resolution of ``auto``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AUTO = "auto"  # --attn-impl auto: a model's preferred backend that runs here (`resolve_backend`)

# Every built-in backend and the module that defines and registers it, in the order command lines list them.
BACKEND_MODULES = {
    "sdpa": "telefuser.ops.attention",
    "flash_attn_4": "telefuser.ops.attention",
    "sage": "telefuser.ops.attention",
    "cudnn_fp8": "telefuser.ops.attention_fp8",
    "sage_sm90": "telefuser.ops.attention_sage",
    "identity": "telefuser.ops.attention",
}
TEST_ONLY = ("identity",)  # returns Q: for profiling what surrounds attention; no model offers it

# How a LingBot session keeps its KV window for a backend (models/lingbot_world_v2/kv_cache.py). Every backend reads
# a plain window (each call quantizes what it needs); the others are read by their own backend only.
WINDOW_PLAIN = "plain"  # keys and values in the compute dtype
WINDOW_FP8_KEYS = "fp8_keys"  # e4m3 keys with a static per-layer scale, values plain
WINDOW_SAGE_SM90 = "sage_sm90"  # INT8 keys and transposed e4m3 values, laid out as SageAttention2's SM90 kernel reads

Verdict = tuple[bool, str]  # (yes or no, why): what `available` and `takes` answer


class AttentionBackendError(ValueError):
    """An --attn-impl this model or run cannot take (its head dim, its dtype): a start-up mistake, not a fault."""


class AttentionUnavailableError(RuntimeError):
    """An --attn-impl that this machine cannot run (not installed, no GPU, the wrong GPU): a start-up mistake."""


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    # (q, k, v, *, causal) on [B, S, H, D] tensors, one sequence -> [B, S_q, H, D], contiguous
    run: Callable[..., Any]
    available: Callable[[], Verdict]  # for the current CUDA device
    host: bool = False  # takes CPU tensors (the others are CUDA kernels)
    traced: bool = False  # a compiled region traces `run` (its quantization fuses there) instead of an opaque op
    head_dims: tuple[int, ...] | None = None  # the head dims it runs; None: any
    dtypes: tuple[str, ...] | None = None  # the torch dtype names it runs ("bfloat16", ...); None: any
    window_format: str = WINDOW_PLAIN  # the KV window a LingBot session made for it keeps

    def takes(self, head_dim: int | None = None, device: Any = None, dtype: Any = None) -> Verdict:
        """(ok, why): whether it runs heads of `head_dim` channels on `device` (a torch.device or its string) in
        `dtype`; what is not given is not checked."""
        if head_dim is not None and self.head_dims is not None and head_dim not in self.head_dims:
            return False, f"it runs head dims {_listed(self.head_dims)}"
        if device is not None and not self.host and _device_type(device) != "cuda":
            return False, f"it runs on CUDA devices only, not on {device}"
        if dtype is not None and self.dtypes is not None and _dtype_name(dtype) not in self.dtypes:
            return False, f"it runs {_listed(self.dtypes)}, not {_dtype_name(dtype)}"
        return True, "it takes them"


_BACKENDS: dict[str, AttentionBackend] = {}


def register(backend: AttentionBackend) -> AttentionBackend:
    """Add `backend`; a name already registered (or ``auto``) is refused."""
    if backend.name == AUTO:
        raise ValueError(f"{AUTO!r} names no backend (resolve_backend picks one); register it under another name")
    if backend.name in _BACKENDS:
        raise ValueError(f"attention backend {backend.name!r} is already registered ({_BACKENDS[backend.name].run})")
    _BACKENDS[backend.name] = backend
    return backend


def attention_backend(name: str, **facts) -> Callable[[Callable], Callable]:
    """Decorator: register the decorated runner as backend `name`, with the `AttentionBackend` fields in `facts`
    (``available`` at least); returns the runner unchanged."""

    def registered(run: Callable) -> Callable:
        register(AttentionBackend(name, run, **facts))
        return run

    return registered


def offered_names() -> tuple[str, ...]:
    """The built-in backends models offer on their command lines (less the test-only ones). Imports nothing."""
    return tuple(name for name in BACKEND_MODULES if name not in TEST_ONLY)


def backend_names() -> tuple[str, ...]:
    """Every backend: the built-in ones, then any registered from elsewhere."""
    return (*BACKEND_MODULES, *(name for name in _BACKENDS if name not in BACKEND_MODULES))


def get_backend(name: str) -> AttentionBackend:
    """The backend registered as `name`, its module imported at first use; an unknown name is a ValueError."""
    backend = _BACKENDS.get(name)
    if backend is not None:
        return backend
    if name not in BACKEND_MODULES:
        raise ValueError(f"unknown attention implementation {name!r}; choose one of {', '.join(backend_names())}")
    importlib.import_module(BACKEND_MODULES[name])
    if name not in _BACKENDS:
        raise RuntimeError(f"{BACKEND_MODULES[name]} registers no attention backend {name!r}, as BACKEND_MODULES says")
    return _BACKENDS[name]


def available_names() -> list[str]:
    """The backends usable on this machine (and its current CUDA device)."""
    return [name for name in backend_names() if get_backend(name).available()[0]]


def check_backend(name: str, *, head_dim: int | None = None, dtype: Any = None) -> str:
    """`name`, checked: a known backend (ValueError), usable here (RuntimeError, with its reason) and, when
    `head_dim` or `dtype` is given, one that takes them (ValueError naming the backends that do). Models call it with
    their config's head dim, entry points with the run's dtype too; `auto` is refused (an entry point resolves it,
    `resolve_backend`)."""
    if name == AUTO:
        raise ValueError(
            f"attention implementation {AUTO!r} is resolved by a model's entry point (resolve_backend with the "
            f"model's preference); name one here: {', '.join(backend_names())}"
        )
    backend = get_backend(name)
    ok, why = backend.available()
    if not ok:
        raise AttentionUnavailableError(f"attention implementation {name!r} was asked for but {why}")
    ok, why = backend.takes(head_dim=head_dim, dtype=dtype)
    if not ok:
        asked = ", ".join(
            what for what in (head_dim and f"head dim {head_dim}", dtype is not None and _dtype_name(dtype)) if what
        )
        takers = [other for other in offered_names() if get_backend(other).takes(head_dim=head_dim, dtype=dtype)[0]]
        raise AttentionBackendError(
            f"attention implementation {name!r} does not take {asked} ({why}); implementations that take it: "
            f"{', '.join(takers)}"
        )
    return name


def resolve_backend(
    requested: str, preference: Sequence[str], device: Any = None, head_dim: int | None = None, dtype: Any = None
) -> str:
    """The backend to run: `requested` itself, checked (`check_backend`, with `head_dim` and `dtype`), or for
    ``auto`` the first of `preference` that is usable here: available, taking host tensors when `device` is given and
    is not a CUDA device, and taking `head_dim` and `dtype` when given. A local decision: ranks that resolve it
    separately agree on the result (`ModelSpec.attention_impl`)."""
    if requested != AUTO:
        return check_backend(requested, head_dim=head_dim, dtype=dtype)
    known = backend_names()
    if not preference or any(name not in known for name in preference):
        raise ValueError(f"{AUTO!r} needs a preference of known attention implementations, got {list(preference)}")
    usable = [
        name for name in available_names() if get_backend(name).takes(head_dim=head_dim, device=device, dtype=dtype)[0]
    ]
    for name in preference:
        if name in usable:
            return name
    raise RuntimeError(
        f"attention implementation {AUTO!r} found none of {', '.join(preference)} usable here "
        f"(usable: {', '.join(usable)})"
    )


def warn_failed_gate(model: str, name: str, failed: Mapping[str, str]) -> None:
    """Log a warning when backend `name` failed a quality gate on `model` (`failed`: backend -> where the gate's
    result is written): it still runs, as asked, but the user is told to check the quality."""
    if name in failed:
        logging.getLogger("telefuser.attention").warning(
            "%s with %s attention failed the quality gate against bf16 attention (cosine below 0.99 on random "
            "weights; %s); check the quality",
            model,
            name,
            failed[name],
        )


def _device_type(device: Any) -> str:
    if isinstance(device, int):  # torch.device(0) is CUDA device 0
        return "cuda"
    return getattr(device, "type", None) or str(device).partition(":")[0]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _listed(values: Sequence) -> str:
    return ", ".join(str(v) for v in values)
