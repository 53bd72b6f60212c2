"""The memory plan: a request's device peak for each offload tier, computed before anything loads.

A model describes one request (or session) as a `Workload`: its weight stacks (bytes that can stream a layer at a time,
and bytes that cannot), what it holds from start to end (latents, a KV window), and its stages in order (encode the
prompt, denoise, decode), each with the bytes it holds only while it runs and the stacks it computes with. The peak is
what stays on the device plus the largest stage. A `Placement` says which layers of each stack stay on the device:

* ``none``: everything on the device.
* ``model``: the stacks that run once per request (a text encoder, MiniMax H3's AdaLN projections and VAEs) live in
  pinned host memory and stream to the device a layer at a time (a VAE, and Wan 2.2 T2V-A14B's experts, which take
  turns: whole) while they run; an every-step DiT stays resident.
* ``block``: the DiT's blocks stream too (`streaming.StreamedLayers`: the next block's copy overlaps the current
  block's compute).

Within a tier, whatever budget is left keeps leading layers resident (the DiT's first, whose streaming repeats every
step, then the once-per-request stacks'), so a tier streams only what does not fit. `choose` takes the cheapest tier
that fits the budget, or raises `MemoryPlanError` naming what would fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

GIB = 1 << 30
TIERS = ("none", "model", "block")
AUTO = "auto"
# Of a device's memory, the share a plan may fill; the rest absorbs the allocator's rounding and fragmentation and
# the kernels' own workspaces.
HEADROOM = 0.9
STREAM_SLOTS = 2  # a streamed stack computes from one device slot while the next layer is copied into the other


class MemoryPlanError(ValueError):
    """The request cannot fit the budget with what was asked for; the message says what would."""


def gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class Stack:
    """One component's weights: `count` equal layers of `layer` bytes that can stream, and `fixed` bytes that do not
    (embeddings, heads). `per_request`: it runs once per request (offloaded from the model tier on), not every step.
    `fixed_offloads`: once the stack is offloaded its fixed bytes leave the device too; `fixed_lent`: and visit it
    while the stack runs (a VAE lent whole; a text encoder's embedding table is looked up on the host instead).
    `whole_until_block`: the model tier keeps the whole stack in host memory and lends it whole while its stage runs
    (Wan 2.2 T2V-A14B's experts, which take turns); the block tier streams its layers, its fixed part on the device."""

    name: str
    fixed: int
    layer: int = 0
    count: int = 0
    per_request: bool = False
    fixed_offloads: bool = False
    fixed_lent: bool = True
    whole_until_block: bool = False

    @property
    def total(self) -> int:
        return self.fixed + self.layer * self.count


def text_encoder_stack(fixed: int, layer: int, count: int) -> Stack:
    """A prompt encoder's weights: run once per request, its token embedding (`fixed`) looked up on the host once
    offloaded."""
    return Stack(
        "text_encoder", fixed=fixed, layer=layer, count=count, per_request=True, fixed_offloads=True, fixed_lent=False
    )


@dataclass(frozen=True)
class Stage:
    """A step of the request: the stacks it computes with and the bytes it holds only while it runs."""

    name: str
    uses: tuple[str, ...] = ()
    transient: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "transient", dict(self.transient))  # a copy: plain data, picklable


@dataclass(frozen=True)
class Workload:
    """What one request of a model needs (`title` says which request, for messages)."""

    title: str
    stacks: tuple[Stack, ...]
    stages: tuple[Stage, ...]
    held: Mapping[str, int] = field(default_factory=dict)  # from the first stage to the last (latents, a KV window)
    refused_tiers: Mapping[str, str] = field(default_factory=dict)  # tier -> why this launch cannot use it

    def __post_init__(self):
        object.__setattr__(self, "held", dict(self.held))  # copies: plain data, picklable (ranks agree on plans)
        object.__setattr__(self, "refused_tiers", dict(self.refused_tiers))
        names = [s.name for s in self.stacks]
        unknown = {u for stage in self.stages for u in stage.uses} - set(names)
        if unknown or len(set(names)) != len(names):
            raise ValueError(f"{self.title}: stages use unknown stacks {sorted(unknown)} or stack names repeat")

    def stack(self, name: str) -> Stack:
        return next(s for s in self.stacks if s.name == name)

    @property
    def weight_bytes(self) -> int:
        return sum(s.total for s in self.stacks)


@dataclass(frozen=True)
class Placement:
    """Where each stack's layers live: `resident[name]` leading layers on the device, the rest streamed from host
    memory; `offloaded` names the stacks whose host copies exist (their fixed part follows `Stack.fixed_offloads`)."""

    tier: str
    resident: Mapping[str, int]
    offloaded: frozenset[str] = frozenset()

    def __post_init__(self):
        object.__setattr__(self, "resident", dict(self.resident))

    def streams(self, name: str) -> bool:
        return name in self.offloaded

    def resident_layers(self, name: str) -> int | None:
        """Layers of stack `name` kept on the device, or None when it is not offloaded (all of them are)."""
        return self.resident[name] if name in self.offloaded else None


def placement_for(workload: Workload, tier: str) -> Placement:
    """The tier's placement with nothing kept back yet: every offloaded stack streams all of its layers."""
    if tier not in TIERS:
        raise ValueError(f"offload tier must be one of {', '.join(TIERS)}, got {tier!r}")
    offloaded = set()
    for stack in workload.stacks:
        if stack.count == 0 and not (stack.per_request and stack.fixed_offloads):
            continue  # nothing of it can leave the device
        if (tier == "model" and stack.per_request) or tier == "block":
            offloaded.add(stack.name)
    resident = {s.name: 0 if s.name in offloaded else s.count for s in workload.stacks}
    return Placement(tier, resident, frozenset(offloaded))


@dataclass(frozen=True)
class MemoryPlan:
    workload: Workload
    placement: Placement
    budget_bytes: int | None  # None: nothing to check against (the plan is shown only)
    budget_source: str

    # -- the arithmetic ---------------------------------------------------------------------------------------------
    def lent_whole(self, stack: Stack) -> bool:
        """Whether `stack` lives in host memory and visits the device whole while its stage runs."""
        return stack.whole_until_block and self.placement.tier != "block" and self.placement.streams(stack.name)

    def _fixed_offloads(self, stack: Stack) -> bool:
        return stack.fixed_offloads and not (stack.whole_until_block and self.placement.tier == "block")

    def resident_bytes(self) -> dict[str, int]:
        """Each stack's bytes on the device for the whole request."""
        out = {}
        for stack in self.workload.stacks:
            if self.lent_whole(stack):
                out[stack.name] = 0
                continue
            keep = self.placement.resident[stack.name]
            fixed = 0 if self.placement.streams(stack.name) and self._fixed_offloads(stack) else stack.fixed
            out[stack.name] = fixed + keep * stack.layer
        return out

    def window_bytes(self, stack: Stack) -> int:
        """What a stack takes on the device only while its stage runs: the stream's slots, and a fixed part that
        lives on the host and is lent whole (or the whole stack, lent)."""
        if not self.placement.streams(stack.name):
            return 0
        if self.lent_whole(stack):
            return stack.total
        streamed = stack.count - self.placement.resident[stack.name]
        window = min(STREAM_SLOTS, streamed) * stack.layer
        return window + (stack.fixed if self._fixed_offloads(stack) and stack.fixed_lent else 0)

    def stage_bytes(self) -> dict[str, int]:
        return {
            stage.name: sum(stage.transient.values())
            + sum(self.window_bytes(self.workload.stack(name)) for name in stage.uses)
            for stage in self.workload.stages
        }

    @property
    def peak_stage(self) -> str:
        stages = self.stage_bytes()
        return max(stages, key=stages.get) if stages else "-"

    @property
    def peak_bytes(self) -> int:
        stages = self.stage_bytes()
        return sum(self.resident_bytes().values()) + sum(self.workload.held.values()) + max(stages.values(), default=0)

    @property
    def host_bytes(self) -> int:
        """Pinned host memory the placement needs (the offloaded layers and fixed parts)."""
        total = 0
        for stack in self.workload.stacks:
            if self.lent_whole(stack):
                total += stack.total
            elif self.placement.streams(stack.name):
                total += (stack.count - self.placement.resident[stack.name]) * stack.layer
                total += stack.fixed if self._fixed_offloads(stack) else 0
        return total

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.peak_bytes <= self.budget_bytes

    # -- display ----------------------------------------------------------------------------------------------------
    def as_dict(self) -> dict:
        """For metrics files: the tier, what stays resident, the estimated peak and its budget."""
        return {
            "workload": self.workload.title,
            "tier": self.placement.tier,
            "resident_layers": {n: self.placement.resident[n] for n in sorted(self.placement.offloaded)},
            "estimated_peak_bytes": self.peak_bytes,
            "estimated_peak_stage": self.peak_stage,
            "estimated_stage_bytes": self.stage_bytes(),
            "pinned_host_bytes": self.host_bytes,
            "budget_bytes": self.budget_bytes,
            "budget": self.budget_source,
        }

    def summary(self) -> str:
        kept = ", ".join(
            f"{name} lent whole"
            if self.lent_whole(self.workload.stack(name))
            else f"{name} {self.placement.resident[name]}/{self.workload.stack(name).count} layers resident"
            for name in sorted(self.placement.offloaded)
        )
        budget = f" of {gib(self.budget_bytes)} ({self.budget_source})" if self.budget_bytes is not None else ""
        streamed = f"; {kept}; {gib(self.host_bytes)} pinned host memory" if kept else ""
        return f"--offload {self.placement.tier}: peak {gib(self.peak_bytes)}{budget} in {self.peak_stage}{streamed}"

    def rows(self) -> list[tuple[str, str, str]]:
        """(term, where, bytes) rows for a table: the resident stacks, what is held, each stage."""
        rows = [(f"weights: {name}", "device", gib(n)) for name, n in self.resident_bytes().items() if n]
        if self.host_bytes:
            rows.append(("weights streamed from", "host (pinned)", gib(self.host_bytes)))
        rows += [(f"held: {name}", "device", gib(n)) for name, n in self.workload.held.items() if n]
        for stage, n in self.stage_bytes().items():
            rows.append((f"stage: {stage}", "device", gib(n)))
        rows.append((f"peak ({self.peak_stage})", "device", gib(self.peak_bytes)))
        return rows

    def table(self) -> str:
        rows = [("term", "where", "size"), *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"{self.workload.title}: {self.summary()}"]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        return "\n".join(lines)


def fill_budget(plan: MemoryPlan) -> MemoryPlan:
    """Keep leading layers of the offloaded stacks resident while the budget allows: the every-step stacks first
    (their streaming repeats each step), then the once-per-request ones. A plan without a budget keeps none."""
    if plan.budget_bytes is None or not plan.fits:
        return plan
    order = sorted(
        (
            plan.workload.stack(name)
            for name in plan.placement.offloaded
            if not plan.lent_whole(plan.workload.stack(name))
        ),
        key=lambda s: (s.per_request, s.name),
    )
    for stack in order:
        low, high = plan.placement.resident[stack.name], stack.count
        while low < high:  # the most layers of this stack that still fit
            middle = (low + high + 1) // 2
            trial = _with_resident(plan, stack.name, middle)
            low, high = (middle, high) if trial.fits else (low, middle - 1)
        plan = _with_resident(plan, stack.name, low)
    return plan


def _with_resident(plan: MemoryPlan, name: str, layers: int) -> MemoryPlan:
    return replace(plan, placement=replace(plan.placement, resident={**plan.placement.resident, name: layers}))


def plan_tier(workload: Workload, tier: str, budget_bytes: int | None, budget_source: str = "") -> MemoryPlan:
    """The plan of `tier`, its spare budget spent on resident layers."""
    return fill_budget(MemoryPlan(workload, placement_for(workload, tier), budget_bytes, budget_source))


def choose(
    workload: Workload,
    budget_bytes: int | None,
    *,
    tier: str = AUTO,
    budget_source: str = "",
    host_bytes: int | None = None,
    alternatives: Sequence[tuple[str, Workload]] = (),
    tiers: Sequence[str] = TIERS,
) -> MemoryPlan:
    """The plan to run: `tier`'s, or with ``auto`` the cheapest of `tiers` that fits `budget_bytes` (None: the tier
    asked for, ``none`` for auto, unchecked). A plan that does not fit, or needs more pinned host memory than
    `host_bytes`, raises `MemoryPlanError` listing which tiers and `alternatives` ((flags, workload) pairs: FP8, more
    ranks, a smaller request) would fit. A CPU launch has one tier, ``none``: its weights are in host memory."""
    if tier != AUTO and tier not in TIERS:
        raise ValueError(f"--offload must be {AUTO} or one of {', '.join(TIERS)}, got {tier!r}")
    if tier != AUTO and tier not in tiers:
        raise MemoryPlanError(
            f"--offload {tier} moves weights between host and GPU memory; this launch runs on the CPU"
        )
    if tier in workload.refused_tiers:
        raise MemoryPlanError(f"--offload {tier} cannot run {workload.title}: {workload.refused_tiers[tier]}")
    candidates = [t for t in tiers if t not in workload.refused_tiers] if tier == AUTO else [tier]
    if budget_bytes is None:
        return plan_tier(workload, candidates[0], None, budget_source)
    plans = [plan_tier(workload, t, budget_bytes, budget_source) for t in candidates]
    for plan in plans:
        if plan.fits and (host_bytes is None or plan.host_bytes <= host_bytes):
            return plan
    raise MemoryPlanError(_refusal(workload, plans, budget_bytes, budget_source, host_bytes, alternatives, tiers))


def _refusal(workload, plans, budget_bytes, budget_source, host_bytes, alternatives, tiers) -> str:
    tried = "; ".join(
        f"--offload {p.placement.tier} needs {gib(p.peak_bytes)}"
        + (
            f" and {gib(p.host_bytes)} of pinned host memory"
            if host_bytes is not None and p.host_bytes > host_bytes
            else ""
        )
        for p in plans
    )
    lines = [f"{workload.title} does not fit {gib(budget_bytes)} ({budget_source}): {tried}"]
    if host_bytes is not None:
        lines[0] += f" (host memory available: {gib(host_bytes)})"
    fits = []
    for flags, other in alternatives:
        for t in tiers:
            if t in other.refused_tiers:
                continue
            plan = plan_tier(other, t, budget_bytes, budget_source)
            if plan.fits and (host_bytes is None or plan.host_bytes <= host_bytes):
                fits.append(f"{flags}" + (f" --offload {t}" if len(tiers) > 1 else "") + f" ({gib(plan.peak_bytes)})")
                break
    if fits:
        lines.append("what would fit: " + "; ".join(fits))
    elif len(tiers) > 1:
        lines.append("nothing tried fits this device: use a larger GPU or more GPUs (Ulysses/TP)")
    else:
        lines.append("nothing tried fits this machine's memory: run it on a GPU")
    return "\n".join(lines)


def plan_or_exit(spec, args, runtime, request) -> MemoryPlan:
    """An entry point's plan: `spec.memory_plan`, with a refusal ended as a start-up mistake (its message on rank 0's
    stderr, exit status 2 on every rank) instead of a traceback; rank 0 prints the plan's summary."""
    import sys

    try:
        plan = spec.memory_plan(args, runtime, request)
    except MemoryPlanError as exc:
        if runtime.rank == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        runtime.close()
        raise SystemExit(2) from None
    if runtime.rank == 0:
        print(f"memory: {plan.summary()}", flush=True)
    return plan
