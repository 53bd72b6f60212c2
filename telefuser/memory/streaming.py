"""`StreamedLayers`: a stack of layers whose weights live in host memory and visit the device one layer at a time.

`resident` layers of a stack stay on the device; every other layer keeps its tensors in pinned host memory and is
copied into one of two device slots just before it computes. A stack that runs every step streams layers spread
evenly through it (`streamed_layers`), so a copy overlaps the resident layers' compute too. The copy of the next layer is issued on a side
stream while the current one computes (CUDA events order the copy after the compute that last read the slot, and the
compute after the copy), so a layer whose compute takes longer than its copy costs no time. The numbers are the same
as a resident stack's: the same kernels read the same values from other addresses.

Two ways to run a stack through it:
    for index, block in stream.each():   # a model's own loop (its blocks run as compiled regions)
        x = block_region(block, x, ...)
    stream.attach()                       # forward hooks, for a library's loop (transformers' text encoders)

Between uses a streamed layer's parameters point at their host copies, so code that touches a layer outside `each()`
or its hooks computes on the host tensors: every loop over a streamed stack must go through the stream. CUDA graphs
cannot capture a stream (the slots change under them); the entry points refuse the combination.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .host import layer_tensors, to_host


def streamed_layers(count: int, resident: int) -> list[int]:
    """Which of `count` layers stream when `resident` of them stay on the device: spread evenly, so that each
    streamed layer's copy overlaps the compute of the resident layers before it (the last layers all streaming would
    leave their copies nothing to hide behind but each other)."""
    if not 0 <= resident <= count:
        raise ValueError(f"resident must lie in [0, {count}], got {resident}")
    streamed = count - resident
    return sorted({int((j + 0.5) * count / streamed) for j in range(streamed)}) if streamed else []


def block_finisher(quantization: str, resident: int | None):
    """A DiT loader's `after_block(model, i)`: `model.finish_block` quantizes block i where it loaded, then moves it
    to host memory when it will stream (`resident` blocks stay, the streamed ones spread through the stack as
    `streamed_layers` places them; None: none streams)."""

    def finish(model, index: int) -> None:
        streamed = () if resident is None else streamed_layers(len(model.blocks), resident)
        model.finish_block(index, quantization=quantization, to_host=index in streamed)

    return finish


class StreamedLayers:
    """Stream `streamed_layers(len(layers), resident)` of `layers` from host memory on `device`; `spread=False`
    streams the last ones instead (a stack that runs once per request: nothing to hide its copies behind).

    `keep_slots`: keep the two device slots between passes and, at the end of a pass, prefetch the first streamed
    layer for the next one (a stack that runs every step: a DiT); otherwise free the slots when a pass ends (a stack
    that runs once per request: a text encoder), so they cost nothing between requests."""

    def __init__(
        self,
        layers: nn.ModuleList,
        device: torch.device | str,
        *,
        resident: int = 0,
        keep_slots: bool,
        skip: tuple[str, ...] = (),
        spread: bool = True,
    ):
        if not 0 <= resident <= len(layers):
            raise ValueError(f"resident must lie in [0, {len(layers)}], got {resident}")
        self.skip = skip  # submodules of each layer that stay where they are (placed by their owner)
        self.layers = layers
        self.device = torch.device(device)
        self.resident = int(resident)
        self.keep_slots = keep_slots
        self.streamed = (
            streamed_layers(len(layers), self.resident) if spread else list(range(self.resident, len(layers)))
        )
        # each streamed layer's tensors, found once: their objects stay, only their `.data` moves
        self._layer_tensors = {i: self._find_tensors(i) for i in self.streamed}
        for index in self.streamed:
            for tensor in self._tensors(index):
                tensor.data = to_host(tensor.data)
        self._host = {i: [t.data for t in self._tensors(i)] for i in self.streamed}
        self._cuda = self.device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._slots: list[list[torch.Tensor] | None] = [None, None]
        self._slot_free: list[torch.cuda.Event | None] = [None, None]  # the compute that last read the slot
        self._loaded: dict[int, tuple[int, torch.cuda.Event | None]] = {}  # layer -> (slot, copy done)
        self._in_use: dict[int, int] = {}  # layer -> the slot it computes from
        self._next_slot = 0
        self.bytes_copied = 0
        self._hooks: list = []

    # -- sizes ------------------------------------------------------------------------------------------------------
    @property
    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for tensors in self._host.values() for t in tensors)

    @property
    def slot_bytes(self) -> int:
        """What one device slot holds: the largest streamed layer."""
        sizes = [sum(t.numel() * t.element_size() for t in tensors) for tensors in self._host.values()]
        return max(sizes, default=0)

    # -- a model's loop ---------------------------------------------------------------------------------------------
    def each(self) -> Iterator[tuple[int, nn.Module]]:
        """(index, layer) for every layer in order, each streamed one on the device while the caller uses it."""
        for index, layer in enumerate(self.layers):
            with self.using(index):
                yield index, layer

    @contextmanager
    def using(self, index: int) -> Iterator[nn.Module]:
        """Layer `index` with its tensors on the device inside the block (a resident layer: as it is)."""
        if index not in self._host:
            yield self.layers[index]
            return
        self.enter(index)
        try:
            yield self.layers[index]
        finally:
            self.exit(index)

    # -- a library's loop -------------------------------------------------------------------------------------------
    def attach(self) -> StreamedLayers:
        """Run the streaming from forward hooks on every streamed layer (for a loop we do not own)."""
        for index in self.streamed:
            layer = self.layers[index]
            self._hooks.append(layer.register_forward_pre_hook(lambda _m, _a, i=index: self.enter(i)))
            self._hooks.append(layer.register_forward_hook(lambda _m, _a, _o, i=index: self.exit(i)))
        return self

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    # -- the protocol -----------------------------------------------------------------------------------------------
    def enter(self, index: int) -> None:
        """Point layer `index` at a device slot holding its weights (copied now unless prefetched), then issue the
        copy of the next streamed layer into the other slot."""
        if index not in self._loaded:
            self._load(index)
        slot, ready = self._loaded.pop(index)
        self._in_use[index] = slot
        if ready is not None:
            torch.cuda.current_stream(self.device).wait_event(ready)
        for tensor, device_copy in zip(self._tensors(index), self._slots[slot]):
            tensor.data = device_copy
        following = self._following(index)
        if following is not None and following not in self._loaded:
            self._load(following)

    def exit(self, index: int) -> None:
        """Layer `index` is done on the compute stream: its slot may be overwritten once that work is; the layer
        points at its host copies again. The last layer of a pass frees the slots unless `keep_slots`."""
        slot = self._in_use.pop(index, None)
        if slot is None:
            raise RuntimeError(f"streamed layer {index} is not on the device (exit without enter)")
        if self._cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._slot_free[slot] = event
        for tensor, host in zip(self._tensors(index), self._host[index]):
            tensor.data = host
        if index == self.streamed[-1] and not self.keep_slots:
            self.free_slots()

    def reset(self) -> None:
        """Every streamed layer back on its host copies and the slots freed, whatever state a pass left them in
        (a pass that raised half-way)."""
        for index in list(self._in_use):
            for tensor, host in zip(self._tensors(index), self._host[index]):
                tensor.data = host
        self._in_use.clear()
        self.free_slots()

    def free_slots(self) -> None:
        """Give the device slots back; a copy still in flight finishes before the compute stream's later work, which
        is where the allocator hands the memory out again."""
        if self._cuda and any(slot is not None for slot in self._slots):
            torch.cuda.current_stream(self.device).wait_stream(self._copy_stream)
        self._slots = [None, None]
        self._slot_free = [None, None]
        self._loaded.clear()

    def _tensors(self, index: int) -> list[torch.Tensor]:
        return self._layer_tensors[index]

    def _find_tensors(self, index: int) -> list[torch.Tensor]:
        layer = self.layers[index]
        skipped = {id(t) for name in self.skip for t in layer_tensors(layer.get_submodule(name))}
        return [t for t in layer_tensors(layer) if id(t) not in skipped]

    def _following(self, index: int) -> int | None:
        position = self.streamed.index(index) + 1
        if position < len(self.streamed):
            return self.streamed[position]
        return self.streamed[0] if self.keep_slots and len(self.streamed) > 1 else None

    def _load(self, index: int) -> None:
        """Issue the copy of layer `index` into the next slot, after the compute that last read that slot."""
        slot = self._next_slot
        self._next_slot = 1 - slot
        host = self._host[index]
        held = self._slots[slot]
        fresh = held is None or [(t.shape, t.dtype) for t in held] != [(t.shape, t.dtype) for t in host]
        if fresh:
            # allocated on the compute stream, the stream of every reader; the copy stream's writes are ordered after
            # the compute work queued so far (the memory may be a block it just freed) and before the reads (`ready`)
            held = self._slots[slot] = [torch.empty_like(t, device=self.device) for t in host]
        if not self._cuda:
            for device_copy, source in zip(held, host):
                device_copy.copy_(source)
            self._loaded[index] = (slot, None)
        else:
            copy_stream = self._copy_stream
            if fresh or self._slot_free[slot] is None:
                copy_stream.wait_stream(torch.cuda.current_stream(self.device))
            else:
                copy_stream.wait_event(self._slot_free[slot])
            with torch.cuda.stream(copy_stream):
                for device_copy, source in zip(held, host):
                    device_copy.copy_(source, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(copy_stream)
            self._loaded[index] = (slot, ready)
        self.bytes_copied += sum(t.numel() * t.element_size() for t in host)
