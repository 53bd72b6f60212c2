"""`ModelSpec`: what an entry point needs to know about one model, declared once in the model's ``spec.py``.

A spec names the model and its command-line flags, applies its parallel plan (`parallelize`: TP, then Ulysses) and
points at its loaders, its pipeline builder and the service adapters that serve it. For tests, tools and benches it
also names the DiT's sizes (``"tiny"``, ``"official"``), one forward on example inputs and the shapes worth running it
at per size, that forward's FLOP count, the head and layer counts, whether the plan takes tensor parallelism, and the
checkpoint writer: what the conformance suite (tests/conformance) and the tools run for every model, so that no tool
names a model to know how to build or call it.
Everything heavy is referenced as a ``"module:attribute"`` string (or a `lazy_partial` of one, for a function a model's
variants share) and imported at first use, so that importing a spec (and building a command line from it) does not
import torch.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any


def resolve(reference: str | Callable[..., Any]) -> Any:
    """``"package.module:name"`` -> that attribute, imported now; a callable (a `lazy_partial`) as it is."""
    if callable(reference):
        return reference
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def lazy_partial(reference: str, *args: Any) -> Callable[..., Any]:
    """The function at `reference` with its first arguments `args`, imported when called: how the specs of a model's
    variants point at one function they share (``lazy_partial("pkg.loading:workload", "t2v-a14b")``) without
    importing it."""
    return functools.partial(_call, reference, *args)


def _call(reference: str, *args: Any, **kwargs: Any) -> Any:
    return resolve(reference)(*args, **kwargs)


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a model: its option strings and argparse keyword arguments."""

    names: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.options.get("dest") or self.names[0].lstrip("-").replace("-", "_")

    @property
    def default(self) -> Any:
        return self.options.get("default", False if self.options.get("action") == "store_true" else None)

    def add_to(self, parser, **overrides) -> None:
        """Add the flag; `overrides` replace its argparse options. Choices narrowed to leave the declared default
        out make their first one the default (argparse would hand out the refused one). A help's ``%(default)s``
        shows the declared default where the entry point fills it in later (None or SUPPRESS)."""
        options = {**self.options, **overrides}
        if "choices" in overrides and "default" not in overrides and self.default not in (None, *options["choices"]):
            options["default"] = next(iter(options["choices"]))
        if options.get("default") in (None, argparse.SUPPRESS) and "help" in options:
            options["help"] = options["help"].replace("%(default)s", str(self.default))
        parser.add_argument(*self.names, **options)


@dataclass(frozen=True)
class Example:
    """One forward of a DiT on seeded random inputs built once: `run()` calls the model and returns its outputs as a
    tuple of tensors (fp32 predictions). `shape` holds the sizes the inputs were made for (batch, latent frames,
    height, width, ...), the keywords `ModelSpec.forward_flops` takes."""

    run: Callable[[], tuple]
    shape: Mapping[str, int]
    names: tuple[str, ...] = ()  # what run()'s outputs are, in order, for reports; empty: unnamed

    def output_names(self, count: int) -> tuple[str, ...]:
        """The names of `count` outputs of `run()`: the declared ones, else ``output 0``, ``output 1``, ..."""
        return self.names if len(self.names) == count else tuple(f"output {i}" for i in range(count))


@dataclass(frozen=True)
class ModelSpec:
    name: str  # what --model takes and the registry's key
    title: str  # for people: help text, logs
    model_class: str  # "module:Class" of the DiT, for readers and tests (the loaders build it)
    flags: tuple[Flag, ...]
    attention_impls: tuple[str, ...]  # the implementations this model runs with: --attn-impl's choices, less "auto"
    quantizations: tuple[str, ...]  # the --quantization choices
    plan: Callable[..., Any]  # (model, mesh, *, communicator_factory) -> model: TP, then Ulysses
    # "module:function" (args, runtime, **overrides) -> the model's pipeline, from its flags
    pipeline: str | Callable[..., Any]
    adapters: Mapping[str, str] = field(default_factory=dict)  # service kind -> "module:function" (args) -> adapter
    loaders: Mapping[str, str] = field(default_factory=dict)  # "random" | "checkpoint" -> "module:function"
    serve_defaults: Mapping[str, Any] = field(default_factory=dict)  # flag defaults a service overrides
    auto_attention: tuple[str, ...] = ("sdpa",)  # what --attn-impl auto picks: the first of these usable here
    served_name: str | None = None  # the name a service lists it under by default (--served-model-name); None: `name`
    head_dim: str | None = None  # "module:function" (args) -> the DiT's attention head dim, or None when unknown
    # "module:function" (args, parallel, dtype, request) -> memory.plan.Workload: one request on one rank
    memory: str | Callable[..., Any] | None = None
    # "module:function" (args, parallel, dtype, request) -> [(flags, Workload)]: what a refusal may suggest
    memory_alternatives: str | Callable[..., Any] | None = None
    # "module:function" (args) -> the request an entry point's flags describe (the model's defaults for the rest)
    memory_request: str | Callable[..., Any] | None = None
    # -- the DiT itself, for tests, tools and benches (torchtitan's flavors and FLOP count) --
    sizes: tuple[str, ...] = ()  # the DiT's named sizes, smallest first: what `dit_config` takes
    dit_config: str | Callable[..., Any] | None = None  # "module:function" (size) -> the DiT config of that size
    example: str | None = None  # "module:function" (model, *, seed, **shape) -> Example: one forward
    flops: str | None = None  # "module:function" (config, **shape) -> FLOPs of an Example's forward of that shape
    # size -> the `example` keywords of a representative forward at that size (the official size's: the release's
    # production call); a size absent here runs the example's own defaults
    example_shapes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    heads_field: str = "num_heads"  # the DiT config's field holding its attention head count
    layers_field: str = "num_layers"  # the DiT config's field holding its block count
    tensor_parallel: bool = False  # the plan also splits the blocks over TP ranks (tp_degree > 1 is taken)
    checkpoint_writer: str | None = None  # "module:function" (model, directory) -> what loader("checkpoint") reads

    def __post_init__(self):
        object.__setattr__(self, "adapters", MappingProxyType(dict(self.adapters)))
        object.__setattr__(self, "loaders", MappingProxyType(dict(self.loaders)))
        object.__setattr__(self, "serve_defaults", MappingProxyType(dict(self.serve_defaults)))
        shapes = {size: MappingProxyType(dict(shape)) for size, shape in self.example_shapes.items()}
        object.__setattr__(self, "example_shapes", MappingProxyType(shapes))
        if not self.auto_attention or not set(self.auto_attention) <= set(self.attention_impls):
            raise ValueError(
                f"{self.name}: auto_attention {self.auto_attention} must name some of {self.attention_impls}"
            )
        if bool(self.sizes) != (self.dit_config is not None):
            raise ValueError(f"{self.name}: sizes and dit_config come together (sizes {self.sizes})")
        if not set(self.example_shapes) <= set(self.sizes):
            raise ValueError(f"{self.name}: example_shapes name sizes {sorted(self.example_shapes)} of {self.sizes}")

    # -- flags ------------------------------------------------------------------------------------------------------
    def flag(self, dest: str) -> Flag:
        for flag in self.flags:
            if flag.dest == dest:
                return flag
        raise KeyError(f"{self.name} has no flag {dest!r}; its flags: {', '.join(self.flag_names())}")

    def flag_names(self) -> list[str]:
        return [flag.names[0] for flag in self.flags]

    def add_flags(self, parser, *, only: Iterable[str] | None = None, **defaults) -> None:
        """Add this model's flags (or those whose dest is in `only`) to `parser` or an argument group; `defaults`
        overrides some of their defaults for this entry point."""
        wanted = None if only is None else set(only)
        missing = (set(defaults) | (wanted or set())) - {flag.dest for flag in self.flags}
        if missing:
            raise KeyError(f"{self.name} has no flag(s) {sorted(missing)}; its flags: {', '.join(self.flag_names())}")
        for flag in self.flags:
            if wanted is None or flag.dest in wanted:
                flag.add_to(parser, **({"default": defaults[flag.dest]} if flag.dest in defaults else {}))

    def option(self, args: argparse.Namespace, dest: str) -> Any:
        """The value of one of this model's flags in `args`; its declared default when `args` lacks it or holds
        None (a caller that built its own namespace)."""
        value = getattr(args, dest, None)
        return self.flag(dest).default if value is None else value

    def options(self, args: argparse.Namespace, *dests: str) -> dict[str, Any]:
        """{dest: `option(args, dest)`} for the named flags."""
        return {dest: self.option(args, dest) for dest in dests}

    def attention_impl(self, args: argparse.Namespace, runtime=None) -> str:
        """The attention backend --attn-impl in `args` names, checked to be installed and to take the model's
        `head_dim` (when the flags tell it) and `runtime`'s dtype; "auto" resolved to the first of `auto_attention`
        usable here (on `runtime`'s device and dtype when given, for the model's `head_dim`). With a `runtime` of several ranks, agreed by all
        of them: every rank raises the same error when one cannot run it or they resolved differently. Call it once,
        after the process group exists, and pass the result on."""
        from ..ops.attention_registry import resolve_backend

        requested = self.option(args, "attn_impl")
        device = getattr(runtime, "device", None)
        head_dim = resolve(self.head_dim)(args) if self.head_dim else None

        def decide() -> str:
            return resolve_backend(requested, self.auto_attention, device, head_dim, getattr(runtime, "dtype", None))

        if runtime is None or runtime.world_size == 1:
            return decide()
        from ..distributed.agreement import agree

        advice = "; install the same attention backends on every rank's host, or pass an explicit --attn-impl"
        return agree(f"the attention implementation (--attn-impl {requested})", decide, advice=advice)

    # -- memory -------------------------------------------------------------------------------------------------------
    def memory_workload(self, args: argparse.Namespace, parallel, dtype, request: Mapping[str, Any]):
        """The `memory.plan.Workload` of `request` on one rank of `parallel` with the flags in `args`."""
        if self.memory is None:
            raise ValueError(f"{self.name} declares no memory workload")
        return resolve(self.memory)(args, parallel, dtype, request)

    def request_from_args(self, args: argparse.Namespace) -> dict[str, Any]:
        """The request the flags in `args` describe, for the memory plan (`memory_request`)."""
        if self.memory_request is None:
            raise ValueError(f"{self.name} declares no memory request")
        return resolve(self.memory_request)(args)

    def memory_plan(self, args: argparse.Namespace, runtime, request: Mapping[str, Any]):
        """The plan for `request` on `runtime`'s device: --offload's tier (auto: the cheapest that fits) within
        --gpu-memory-gb or the device's free memory, the smallest budget of all ranks. Every rank gets the same plan
        or raises the same `memory.plan.MemoryPlanError` (naming what would fit) before anything loads; the process
        is then held to --gpu-memory-gb. Collective under torchrun."""
        from ..distributed.agreement import agree
        from ..memory.budget import agreed_budget, device_budget, hold_to, host_budget_bytes
        from ..memory.plan import TIERS, choose

        gpu_memory_gb = self.option(args, "gpu_memory_gb")
        cuda = runtime.device.type == "cuda"
        budget = agreed_budget(lambda: device_budget(runtime.device, gpu_memory_gb))
        workload = self.memory_workload(args, runtime.parallel, runtime.dtype, request)

        def decide():
            alternatives = (
                resolve(self.memory_alternatives)(args, runtime.parallel, runtime.dtype, request)
                if self.memory_alternatives
                else ()
            )
            return choose(
                workload,
                budget.bytes,
                tier=self.option(args, "offload"),
                budget_source=budget.source,
                host_bytes=host_budget_bytes() if cuda else None,
                alternatives=alternatives,
                tiers=TIERS if cuda else ("none",),
            )

        plan = agree("the memory plan", decide)
        hold_to(runtime.device, gpu_memory_gb)
        return plan

    # -- the model ----------------------------------------------------------------------------------------------------
    def parallelize(self, model, mesh, *, communicator_factory=None):
        """Apply this model's plan over `mesh`: TP, then Ulysses. Call it through `Runtime.parallelize`."""
        return self.plan(model, mesh, communicator_factory=communicator_factory)

    def loader(self, kind: str) -> Callable[..., Any]:
        """``"random"``: build a seeded dense model; ``"checkpoint"``: load one, parallelized before it is read."""
        return resolve(self.loaders[kind])

    def build_pipeline(self, args: argparse.Namespace, runtime, **overrides):
        """The model's pipeline on this rank, from its flags in `args` (defaults where `args` lacks one)."""
        return resolve(self.pipeline)(args, runtime, **overrides)

    # -- the DiT, by size ---------------------------------------------------------------------------------------------
    def config_of(self, size: str, *, layers: int | None = None):
        """The DiT config of the named size (one of `sizes`); with `layers`, that many blocks (a size's width at a
        few layers, for a bench that fits it on fewer devices)."""
        self._check_size(size)
        config = resolve(self.dit_config)(size)
        return config if layers is None else replace(config, **{self.layers_field: layers})

    def example_shape(self, size: str) -> dict[str, Any]:
        """The `example_forward` keywords of a representative forward at `size` (`example_shapes`); empty where the
        spec declares none (the example's own small defaults)."""
        self._check_size(size)
        return dict(self.example_shapes.get(size, {}))

    def build_random(self, config, *, seed: int, device="cpu", dtype=None, **options):
        """A dense DiT of `config` (or a size name) with seeded random weights, the same on every rank; `options`
        go to the model's random loader (attn_impl, init_on_device, after_block)."""
        config = self.config_of(config) if isinstance(config, str) else config
        extra = {} if dtype is None else {"dtype": dtype}
        return self.loader("random")(config, seed, device, **extra, **options)

    def example_forward(self, model, *, seed: int = 0, **shape) -> Example:
        """One forward of `model` (this spec's DiT, dense or parallelized) on seeded random inputs of `shape` (the
        model's keywords; its small defaults where absent), built on the model's device."""
        self._require("example")
        return resolve(self.example)(model, seed=seed, **shape)

    def forward_flops(self, config, **shape) -> int:
        """Floating-point operations (2 per multiply-add) of one dense `example_forward` of `shape`: every GEMM and
        attention product, as torch's FlopCounterMode counts them."""
        self._require("flops")
        return resolve(self.flops)(config, **shape)

    def num_heads(self, config) -> int:
        """The attention head count of a DiT config: what Ulysses and TP degrees must divide."""
        return getattr(config, self.heads_field)

    def num_layers(self, config) -> int:
        """The block count of a DiT config."""
        return getattr(config, self.layers_field)

    def write_checkpoint(self, model, directory):
        """Write `model`'s weights (dense) and config in the release's layout under `directory`; returns the path
        `loader("checkpoint")` reads."""
        self._require("checkpoint_writer")
        return resolve(self.checkpoint_writer)(model, directory)

    def _check_size(self, size: str) -> None:
        if size not in self.sizes:
            known = ", ".join(self.sizes) or "none"
            raise ValueError(f"{self.name} has no DiT size {size!r}; its sizes: {known}")

    def _require(self, what: str) -> None:
        if getattr(self, what) is None:
            raise ValueError(f"{self.name} declares no {what}")

    def serves(self, kind: str) -> bool:
        return kind in self.adapters

    def adapter_builder(self, kind: str) -> Callable[[argparse.Namespace], Any]:
        """The function that builds this model's adapter for a service of `kind` ("video" | "stream")."""
        if kind not in self.adapters:
            served = ", ".join(self.adapters) or "none"
            raise ValueError(f"{self.name} has no {kind} service adapter (it serves: {served})")
        return resolve(self.adapters[kind])
