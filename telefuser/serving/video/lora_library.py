"""The server's LoRAs: the files of --lora-dir (the only place a LoRA comes from), read once per file version, and
the set merged into the DiT, switched only when a job asks for another one.

`LoraLibrary.check` runs at submission (rank 0): an unknown name, a file diffusers' reader refuses for this
partition, or one whose layers the model lacks or whose shapes differ (checked without tensor parallelism; under TP
the merge checks) is a 422 there. What it read stays cached, keyed by the file's size and modification time, so a
replaced file is read again. `LoraSwitch` holds what is merged: consecutive jobs with the same set merge nothing,
an empty set unmerges (the weights come back exactly: `models.minimax_h3.lora`), and every rank under torchrun
makes the same switch because it runs the same jobs in the same order.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path

from telefuser.models.minimax_h3 import lora as lora_ops

from .lora_field import SUFFIX

log = logging.getLogger("telefuser.serving")
PARTITION_PREFIX = {"FL2VA": "transformer", "Ref2VA": "transformer_ref"}  # read_lora's partition names
CACHE_SIZE = 8  # LoRAs kept read in host memory (a job stacks at most --max-loras of them)


class LoraLibrary:
    def __init__(self, directory: str | Path, partition: str, *, cache_size: int = CACHE_SIZE):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise ValueError(f"--lora-dir {self.dir} is not a directory")
        self.partition = partition
        self._cache: OrderedDict[str, tuple[tuple[int, int], lora_ops.Lora | str]] = OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()
        self.reads = 0  # files read so far (the tests check the cache)

    def names(self) -> list[str]:
        files = (p for p in self.dir.glob(f"*{SUFFIX}") if p.is_file() and not p.name.startswith("."))
        return sorted(p.name.removesuffix(SUFFIX) for p in files)

    def get(self, name: str) -> lora_ops.Lora:
        """The LoRA `name` read for this partition; LookupError when there is no such file, LoraError when it
        cannot be read for this model."""
        return self.versioned(name)[1]

    def versioned(self, name: str) -> tuple[tuple[int, int], lora_ops.Lora]:
        """(the file's version: size and modification time, the LoRA read from it)."""
        path = self.dir / f"{name}{SUFFIX}"
        try:
            stat = path.stat()
        except OSError:
            raise LookupError(
                f"no LoRA named {name!r} in this server's --lora-dir; it has: {', '.join(self.names()) or 'none'}"
            ) from None
        stamp = (stat.st_size, stat.st_mtime_ns)
        with self._lock:  # one read per file version, also when submissions race
            cached = self._cache.get(name)
            if cached is None or cached[0] != stamp:
                try:
                    value = lora_ops.read_lora(path, partition=PARTITION_PREFIX[self.partition])
                except lora_ops.LoraError as exc:
                    value = str(exc).replace(str(self.dir) + "/", "")  # the client sees the name, not our path
                    value = value.split(" Pass allow_other_partition")[0]  # a Python keyword is no advice to a client
                self.reads += 1
                cached = self._cache[name] = (stamp, value)
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(name)
        if isinstance(cached[1], str):
            raise lora_ops.LoraError(f"LoRA {name!r} cannot be used with this model: {cached[1]}")
        return cached

    def check(self, names, dit) -> None:
        """ValueError (a 422) unless every name reads for this partition and fits `dit`'s linear layers."""
        for name in names:
            try:
                lora = self.get(name)
            except (LookupError, lora_ops.LoraError) as exc:
                raise ValueError(str(exc)) from None
            problems = _misfits(lora, dit)
            if problems:
                raise ValueError(
                    f"LoRA {name!r} does not fit this model: {len(problems)} layer(s) differ, e.g. {problems[0]}"
                )


class LoraSwitch:
    """The LoRA set merged into one DiT (`ensure` before each job)."""

    def __init__(self, dit, library: LoraLibrary):
        self._dit, self._library = dit, library
        self._merged: tuple | None = ()  # (name, scale, file version) per LoRA; None: unknown after a failure
        self.switches = 0  # merges and unmerges done (a job with the set already merged does none)

    def ensure(self, loras: tuple[tuple[str, float], ...]) -> bool:
        """Make `loras` the merged set; True when the weights changed."""
        read = [self._library.versioned(name) for name, _ in loras]
        wanted = tuple((name, float(scale), version) for (name, scale), (version, _) in zip(loras, read))
        if wanted == self._merged:  # a replaced file is another version: merged again
            return False
        self._merged = None  # until the switch is done: a failed one leaves the next job to switch again
        terms = [(lora, float(scale)) for (_, scale), (_, lora) in zip(loras, read)]
        lora_ops.apply(self._dit, terms)  # checks the new set before it changes a weight
        self._merged = wanted
        self.switches += 1
        described = ", ".join(f"{name} x {scale:g}" for name, scale in loras) or "none"
        log.info("LoRA set switched to: %s", described)
        return True

    @property
    def applied(self) -> list[dict]:
        """What is merged now, as a job's result records it."""
        return [{"name": a.name, "scale": a.scale} for a in lora_ops.applied_loras(self._dit)]


def _misfits(lora: lora_ops.Lora, dit) -> list[str]:
    """Layers of `lora` the model lacks, or (without tensor parallelism, where a module holds the whole weight)
    whose shape differs."""
    problems = []
    for name, update in lora.modules.items():
        try:
            module = dit.get_submodule(name)
        except AttributeError:
            problems.append(f"{name} (no such layer)")
            continue
        shape = (getattr(module, "out_features", None), getattr(module, "in_features", None))
        if getattr(dit, "tensor_parallel", None) is None and shape != tuple(update.shape):
            problems.append(f"{name} (LoRA {tuple(update.shape)}, weight {shape})")
    return problems
