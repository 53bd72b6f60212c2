"""LingBot-World v2's KV window as a ring: sink rows, then the other rows in ring order, so a chunk copies only its
own rows and attends to a prefix of the buffer.

* Data movement, exact: every step's (K, V) row pairs (written by the window's format into the slots its plan names,
  and attended as the buffer's prefix), and the committed window after every commit, are the rows of the former
  time-ordered window (sink + newest + the chunk), compared as sets by a row id written into element 0.
* Float: a tiny DiT session over chunks that wrap the ring several times against the former layout (time-ordered
  keys assembled in a scratch pair, the code this replaced), within fp32 summation-order error, with negative
  controls (a stale row, unpaired K/V rows).
"""

from __future__ import annotations

import random

import pytest
import torch

from telefuser.models.lingbot_world_v2 import KVWindow, LingBotWorldV2Config, WindowError, build_random_lingbot_dit
from telefuser.models.lingbot_world_v2.kv_cache import WindowSlots
from telefuser.models.lingbot_world_v2.window_formats import PlainWindow
from telefuser.ops.attention import attention
from tests.numerics import relative_error

HEADS, HEAD_DIM, BATCH, LAYERS = 2, 3, 2, 2


# -- the former layout's semantics, as a reference -------------------------------------------------------------------
class TimeOrderedWindow:
    """The committed rows of one layer in time order; a chunk attends to the sink, the newest rows that fit, itself."""

    def __init__(self, capacity: int, sink_rows: int):
        self.capacity, self.sink_rows = capacity, sink_rows
        self.k: list[torch.Tensor] = []  # one [B, H, D] row each
        self.v: list[torch.Tensor] = []

    def window(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, committed = k_new.shape[1], len(self.k)
        evicted = max(0, committed + n - self.capacity)
        head = min(self.sink_rows, committed)
        k = self.k[:head] + self.k[head + evicted :] + list(k_new.unbind(1))
        v = self.v[:head] + self.v[head + evicted :] + list(v_new.unbind(1))
        return torch.stack(k, 1), torch.stack(v, 1)

    def commit(self, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        k, v = self.window(k_new, v_new)
        self.k, self.v = list(k.unbind(1)), list(v.unbind(1))


def _by_id(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows sorted by the id in K's element 0; V is permuted with K, so unpaired rows stay unpaired."""
    order = k[0, :, 0, 0].argsort()
    return k[:, order], v[:, order]


class RowSource:
    """Chunk K/V whose rows carry a unique id (K's element 0, every batch and head) and otherwise random values; V
    carries the id + 0.5 and other random values, so a K row and its V row are recognisably a pair."""

    def __init__(self, seed: int):
        self.next_id, self.g = 1, torch.Generator().manual_seed(seed)

    def chunk(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.arange(self.next_id, self.next_id + rows, dtype=torch.float32)
        self.next_id += rows
        k = torch.randn(BATCH, rows, HEADS, HEAD_DIM, generator=self.g)
        v = torch.randn(BATCH, rows, HEADS, HEAD_DIM, generator=self.g)
        k[..., 0], v[..., 0] = ids[None, :, None], ids[None, :, None] + 0.5
        return k, v


def _window(local_attn_size: int, sink_size: int, tokens_per_frame: int) -> KVWindow:
    return KVWindow(
        batch=BATCH,
        num_layers=LAYERS,
        tokens_per_frame=tokens_per_frame,
        local_attn_size=local_attn_size,
        sink_size=sink_size,
        local_heads=HEADS,
        head_dim=HEAD_DIM,
        ulysses_degree=1,
        cross_kv=[],
        device=torch.device("cpu"),
        dtype=torch.float32,
    )


def _step(session: KVWindow, layer: int, k_new, v_new, plan: WindowSlots, *, commit: bool):
    """One layer of one forward, as the model runs it: the chunk's rows written by the window's format into the plan's
    slots, the window's bookkeeping noted; returns what the chunk attends (the buffer's prefix, views)."""
    state = session.layers[layer]
    session.format.write(state, k_new, v_new, plan.slot_rows("cpu"), plan.kept == 0)
    session.note_written(plan, commit=commit)
    return state.k[:, : plan.total], state.v[:, : plan.total]


def _chunks(local_attn_size: int, sink_size: int, count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, local_attn_size - sink_size) for _ in range(count)]


CASES = {  # local_attn_size, sink_size, tokens_per_frame, chunk frames
    "v2-shape": (18, 6, 1, [4] * 7 + [3, 5, 12, 1, 7, 4, 4, 2, 11] + _chunks(18, 6, 30, seed=1)),
    "tiny": (4, 1, 3, [1, 2, 3, 2, 1, 3, 3, 2, 2, 1, 2, 3] * 3),
    "uneven": (7, 2, 2, [3, 1, 4, 5, 2] + _chunks(7, 2, 40, seed=2)),
    "sink-0": (5, 0, 2, [2, 2, 3, 5, 4, 1, 3] + _chunks(5, 0, 40, seed=3)),
    "sink-0-first-chunk-fills": (5, 0, 1, [5, 2, 4, 5, 1, 3] * 6),
    "full-mid-chunk": (6, 1, 1, [3, 4, 5, 2, 5, 3] * 6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_step_attends_to_the_rows_of_the_time_ordered_window(case):
    local_attn_size, sink_size, tpf, chunk_frames = CASES[case]
    session = _window(local_attn_size, sink_size, tpf)
    refs = [TimeOrderedWindow(session.capacity, session.sink_rows) for _ in range(LAYERS)]
    source = RowSource(seed=len(case))
    pointers = [t.data_ptr() for kv in session.layers for t in (kv.k, kv.v)]
    ring_rows = session.capacity - session.sink_rows
    seen = {"append": 0, "mid-chunk full": 0, "wrap": 0, "evicted rows": 0}
    for frames in chunk_frames:
        plan = session.plan(frames)
        appended, evicted = plan.new_rows - plan.evicted, plan.evicted
        seen["append"] += appended > 0
        seen["mid-chunk full"] += appended > 0 and evicted > 0
        seen["wrap"] += len(plan.slots) == 2 and evicted == plan.new_rows
        seen["evicted rows"] += evicted
        for commit in (False, False, True):  # two read-only steps (their own rows), then the commit
            for layer, ref in enumerate(refs):
                k_new, v_new = source.chunk(plan.new_rows)
                keys, values = _step(session, layer, k_new, v_new, plan, commit=commit)
                expected = ref.window(k_new, v_new)
                assert keys.shape == expected[0].shape == (BATCH, plan.total, HEADS, HEAD_DIM)
                got, want = _by_id(keys, values), _by_id(*expected)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (case, frames, commit, layer)
                assert keys.data_ptr() == session.layers[layer].k.data_ptr()  # the buffer's prefix: no scratch
                if commit:
                    ref.commit(k_new, v_new)
        session.advance(plan, frames)
        assert session.committed == plan.total and session.ring_head < max(ring_rows, 1)
        for kv, ref in zip(session.layers, refs):
            # The committed window holds the reference's rows, read-only steps left none of theirs behind ...
            committed = (kv.k[:, : session.committed], kv.v[:, : session.committed])
            want = (torch.stack(ref.k, 1), torch.stack(ref.v, 1))
            got_sorted, want_sorted = _by_id(*committed), _by_id(*want)
            assert torch.equal(got_sorted[0], want_sorted[0]) and torch.equal(got_sorted[1], want_sorted[1])
            # ... and time_order() puts them back in time order exactly.
            order = session.time_order()
            assert torch.equal(kv.k[:, order], want[0]) and torch.equal(kv.v[:, order], want[1])
    assert [t.data_ptr() for kv in session.layers for t in (kv.k, kv.v)] == pointers
    assert seen["evicted rows"] >= 3 * ring_rows, seen  # the ring wrapped several times
    assert seen["wrap"] > 0, seen
    if case != "sink-0-first-chunk-fills":  # there the first chunk fills the window exactly
        assert seen["mid-chunk full"] > 0, seen


def test_slots_of_each_window_state():
    """(first buffer row, first chunk row, rows) for: a first chunk, a chunk that fills the window mid-way, a full
    window without and with a wrap, and sink 0."""
    # capacity 10, sink 2: ring of 8 slots at rows 2..9
    assert WindowSlots(10, 2, 0, 4).slots == ((0, 0, 4),)  # first chunk: appended
    assert WindowSlots(10, 2, 4, 4).slots == ((4, 0, 4),)  # still room
    assert WindowSlots(10, 2, 8, 4).slots == ((8, 0, 2), (2, 2, 2))  # full mid-chunk: 2 appended, 2 over the oldest
    assert WindowSlots(10, 2, 10, 4, ring_head=2).slots == ((4, 0, 4),)  # full: over the oldest 4
    assert WindowSlots(10, 2, 10, 4, ring_head=6).slots == ((8, 0, 2), (2, 2, 2))  # full: wraps past the end
    assert WindowSlots(10, 2, 10, 8, ring_head=3).slots == ((5, 0, 5), (2, 5, 3))  # the whole ring, wrapped
    assert WindowSlots(6, 0, 6, 4, ring_head=4).slots == ((4, 0, 2), (0, 2, 2))  # sink 0: the ring is the buffer
    for plan in (
        WindowSlots(10, 2, 8, 4),
        WindowSlots(10, 2, 10, 4, ring_head=6),
        WindowSlots(6, 0, 6, 4, ring_head=4),
    ):
        assert sum(rows for _, _, rows in plan.slots) == plan.new_rows and plan.total == plan.capacity


def test_a_chunk_after_a_bigger_read_only_chunk_must_evict_what_it_overwrote():
    """Read-only steps overwrite the rows their chunk evicts; a later call that evicts fewer would need them back
    (refused), one that evicts at least as many overwrites them again (served, and equal to the reference)."""
    session = _window(6, 1, 2)  # capacity 12, sink 2
    ref = TimeOrderedWindow(session.capacity, session.sink_rows)
    source = RowSource(seed=5)
    for frames in (3, 2):  # 10 rows committed
        plan = session.plan(frames)
        k, v = source.chunk(plan.new_rows)
        _step(session, 0, k, v, plan, commit=True)
        ref.commit(k, v)
        session.advance(plan, frames)
    plan = session.plan(4)  # evicts 3 frames: 6 of the 8 ring rows
    _step(session, 0, *source.chunk(plan.new_rows), plan, commit=False)
    assert session.overwritten == plan.evicted == 6
    with pytest.raises(WindowError, match="already replaced"):
        session.plan(3)  # would keep 2 of the rows the 4-frame steps replaced
    plan = session.plan(5)  # evicts more: serves, and is the reference's window
    k, v = source.chunk(plan.new_rows)
    got, want = _by_id(*_step(session, 0, k, v, plan, commit=True)), _by_id(*ref.window(k, v))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    session.advance(plan, 5)
    assert session.overwritten == 0 and session.plan(1).evicted == 2  # after a commit any chunk size is served
    fresh = _window(6, 1, 2)  # without evictions, read-only steps touch no committed row: any size follows
    plan = fresh.plan(4)
    _step(fresh, 0, *source.chunk(plan.new_rows), plan, commit=False)
    assert fresh.overwritten == 0 and fresh.plan(1).total == 2


def test_the_session_holds_the_layer_buffers_and_text_kv_only():
    session = _window(4, 1, 3)
    assert not hasattr(session, "_scratch")
    # its tensors live in its buffers only: no tensor, and no layer's tensors, held beside them
    assert not [name for name, value in vars(session).items() if isinstance(value, (torch.Tensor, tuple))]
    session.close()
    assert session.closed


# -- float: a tiny DiT session against the former layout ------------------------------------------------------------
# Reordering the (K, V) rows changes only the order of float32 sums in attention: the row max, the exp sum and the
# weighted V sum over N <= 24 keys, each off by at most ~N u relatively (u = 2**-24, N u = 1.4e-6), carried through
# two blocks and the head of a random, well-conditioned model. 1e-5 leaves that a margin of ~7 (the chunked-vs-dense
# test of test_lingbot_model.py, the same kind of difference, measures 7e-7 .. 9e-7 against the same bound).
BOUND = 1e-5
FAR = 100 * BOUND
TPF, GRID_HW = 6, (4, 6)


class FormerLayout(PlainWindow):
    """The layout this replaced, as a window format: every step assembles the time-ordered window (sink, the newest
    committed rows that fit, the chunk) in a window-sized scratch pair per layer and attends to it; a commit rolls the
    window down (`FormerWindow.advance`). `fault` makes it deliberately wrong, for the negative controls."""

    def __init__(self, window: FormerWindow, fault: str | None):
        self.window, self.fault = window, fault
        shape, dtype = window.layers[0].k.shape, window.dtype
        self.scratch = [(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)) for _ in window.layers]

    def write(self, layer, k_new, v_new, slots, fresh):
        plan = self.window.current
        head, kept, total = plan.head_rows, plan.kept, plan.total
        index = next(i for i, state in enumerate(self.window.layers) if state is layer)
        for buf, src, new in zip(self.scratch[index], (layer.k, layer.v), (k_new, v_new)):
            buf[:, :head].copy_(src[:, :head])
            buf[:, head:kept].copy_(src[:, head + plan.evicted : plan.committed])
            buf[:, kept:total].copy_(new)
            if self.fault == "stale" and plan.evicted and kept > head:
                buf[:, head].copy_(src[:, head + plan.evicted - 1])  # the newest evicted row for the oldest kept
        self.attended = tuple(buf[:, :total] for buf in self.scratch[index])

    def attend(self, q, layer, kv_rows, attn_impl):
        keys, values = self.attended
        if self.fault == "unpaired":
            values = values.roll(1, dims=1)  # every K row with its neighbour's V
        return attention(q, keys, values, impl=attn_impl)


class FormerWindow(KVWindow):
    """A window in the former layout: time order, no ring (`FormerLayout`)."""

    @classmethod
    def adopt(cls, session: KVWindow, fault: str | None = None) -> FormerWindow:
        session.__class__ = cls
        session.format = FormerLayout(session, fault)
        return session

    def plan(self, frames):
        self.current = super().plan(frames)
        return self.current

    def advance(self, plan, frames):
        for layer, scratch in zip(self.layers, self.format.scratch):  # the committed window, in time order
            for buf, cache in zip(scratch, (layer.k, layer.v)):
                cache[:, plan.head_rows : plan.total].copy_(buf[:, plan.head_rows : plan.total])
        super().advance(plan, frames)
        self.ring_head = 0


def _session_outputs(model, make_window, chunk_frames) -> list[torch.Tensor]:
    text = torch.randn(1, 5, model.config.text_dim, generator=torch.Generator().manual_seed(1))
    session = make_window(model.new_window(1, text, tokens_per_frame=TPF))
    outputs = []
    for index, frames in enumerate(chunk_frames):
        g = torch.Generator().manual_seed(100 + index)
        camera = torch.randn(1, frames * TPF, model.config.camera_feature_dim, generator=g)
        modulation = model.camera_modulation(camera)
        for t, commit in ((900.0, False), (500.0, False), (0.0, True)):  # each step its own latents
            latents = torch.randn(1, model.config.in_dim, frames, *GRID_HW, generator=g)
            outputs.append(model.forward_chunk(session, latents, torch.tensor([t]), modulation, update_cache=commit))
    session.close()
    return outputs


def _max_error(outputs, references) -> float:
    return max(relative_error(o, r) for o, r in zip(outputs, references, strict=True))


@pytest.mark.numerics
@pytest.mark.parametrize("sink_size", [1, 0], ids=["sink-1", "sink-0"])
def test_a_tiny_session_matches_the_time_ordered_window_to_summation_order(sink_size):
    model = build_random_lingbot_dit(LingBotWorldV2Config.tiny(sink_size=sink_size), seed=0)
    ring = model.config.local_attn_size - sink_size
    chunk_frames = [1, 2, 3, 2, 1, 3, 2, 2, 3, 1, 2] if sink_size else [2, 3, 4, 1, 3, 2, 4, 3, 1, 2]
    assert sum(chunk_frames) - model.config.local_attn_size >= 3 * ring  # the ring wraps several times
    ours = _session_outputs(model, lambda s: s, chunk_frames)
    former = _session_outputs(model, FormerWindow.adopt, chunk_frames)
    error = _max_error(ours, former)
    assert error <= BOUND, error
    for fault in ("stale", "unpaired"):  # negative controls: a wrong window lands far above the bound
        wrong = _session_outputs(model, lambda s, f=fault: FormerWindow.adopt(s, f), chunk_frames)
        assert _max_error(ours, wrong) > FAR, fault
