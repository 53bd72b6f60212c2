"""Steady LingBot chunks as CUDA graphs, on the CPU with each graph emulated (tests/emulated_graphs.py): the pool of
session buffers, the static inputs and the capture/replay bookkeeping, exactly as on a GPU
(tests/gpu/test_lingbot_graphs_cuda.py runs real graphs).

* A whole scripted session (every window length, the ring wrapping, commits) with graphs equals the same session
  without, bit for bit, both while capturing and when a new session on the pooled buffers only replays: the
  regions run through dynamo's eager backend in both, so it is literally the same computation. Negative control:
  ring slots frozen at capture (as Python ints would be) replay stale and differ.
* The pool: a session that closes hands its buffers to the next one of the same shape; two open at once get two
  sets; a Ulysses reset forgets the captured graphs, not the buffers.
* The pipeline's warm-up captures every graph a session of the same request shape replays.
"""

from __future__ import annotations

import numpy as np
import torch

from telefuser.models.lingbot_world_v2 import build_random_lingbot_dit
from telefuser.models.lingbot_world_v2.graphs import ChunkGraphs
from telefuser.ops.regions import compile_regions_on
from tests.emulated_graphs import EmulatedGraphs
from tests.lingbot_session_script import CHUNKS, STEPS, covers_the_window, exactly_equal, run_session, session_config

WINDOW_LENGTHS = 4


def test_emulated_replays_equal_the_eager_session_bit_for_bit(monkeypatch):
    model = build_random_lingbot_dit(session_config(), seed=0)
    with compile_regions_on("cpu", backend="eager"):  # the region path, with and without graphs
        eager = run_session(model)
        graphs = model.graphs = EmulatedGraphs()
        capturing = run_session(model)
        captures, replays = graphs.captures, graphs.replays
        replaying = run_session(model)
        assert covers_the_window(eager, model.config)
        assert captures == 2 * WINDOW_LENGTHS and graphs.captures == captures
        assert graphs.replays - replays == CHUNKS * (len(STEPS) + 1) and graphs.entries == 1
        assert exactly_equal(capturing, eager) and exactly_equal(replaying, eager)

        copy_in = ChunkGraphs._copy_in

        def stale_slots(static, data, camera_source):
            copy_in(static, data._replace(slots=static.data.slots), camera_source)

        monkeypatch.setattr(ChunkGraphs, "_copy_in", staticmethod(stale_slots))
        assert not exactly_equal(run_session(model), eager), "replays with stale ring slots went unnoticed"


def test_pooled_buffers_outlive_sessions_and_a_reset_forgets_the_graphs():
    model = build_random_lingbot_dit(session_config(), seed=0)
    graphs = model.graphs = EmulatedGraphs()
    text = torch.randn(1, 5, model.config.text_dim, generator=torch.Generator().manual_seed(2))
    first = model.new_window(1, text, tokens_per_frame=6)
    buffers = [kv.k.data_ptr() for kv in first.layers]
    second = model.new_window(1, text, tokens_per_frame=6)  # both open: a second set
    assert graphs.entries == 2 and [kv.k.data_ptr() for kv in second.layers] != buffers
    first.close()
    third = model.new_window(1, text * 2, tokens_per_frame=6)  # the first one's buffers, its prompt copied in
    assert [kv.k.data_ptr() for kv in third.layers] == buffers and graphs.entries == 2
    expected = model.blocks[0].cross_attn.text_kv(
        model.text_embedding(torch.nn.functional.pad(text * 2, (0, 0, 0, model.config.text_len - 5)))
    )
    assert torch.equal(third.layers[0].cross_k, expected[0]) and torch.equal(third.layers[0].cross_v, expected[1])
    assert all(not kv.k.any() and not kv.v.any() for kv in third.layers)  # a fresh window
    other_shape = model.new_window(1, text, tokens_per_frame=12)
    assert graphs.entries == 3
    for session in (second, third, other_shape):
        session.close()
    entry = graphs._entries[0]
    entry.graphs["a captured key"] = object()
    model.communicator = _ResetCommunicator()
    assert model.reset_parallel() and entry.graphs == {} and graphs.entries == 3


class _ResetCommunicator:
    """A communicator whose `reset` found something to reset (a transport failed earlier)."""

    def reset(self) -> bool:
        return True

    def close(self) -> None:
        pass


def test_warm_up_captures_every_graph_a_session_replays():
    from telefuser.pipelines.lingbot_world_v2 import build_lingbot_pipeline
    from telefuser.runtime import Runtime

    pipe = build_lingbot_pipeline(config="tiny", runtime=Runtime.one_rank("cpu", torch.float32))
    graphs = pipe.dit.graphs = EmulatedGraphs()
    pipe.warm_up(resolution="64x48")
    captured, replays = graphs.captures, graphs.replays
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    with pipe.start(image, "a red barn", seed=3, resolution="64x48", num_frames=45) as session:
        for index in range(session.total_chunks):
            session.next_chunk(("w",) if index else ())
        forwards = session.total_chunks * (pipe.schedule.num_steps + 1)
    assert captured == 2 * 3  # window lengths 4, 8 and 10 frames (tiny window 10, 4-frame chunks)
    assert graphs.captures == captured and graphs.replays - replays == forwards
    pipe.close()


def _chunk_data(camera_shapes):
    from telefuser.models.lingbot_world_v2.graphs import ChunkData

    g = torch.Generator().manual_seed(5)
    camera = tuple((torch.randn(s, generator=g), torch.randn(s, generator=g)) for s in camera_shapes)
    return ChunkData(
        torch.randn(1, 4, 2, 3, 3, generator=g),
        torch.tensor([500.0]),
        torch.randn(6, 8, generator=g),
        torch.randn(6, 8, generator=g),
        torch.arange(6),
        camera,
    )


def test_replay_inputs_are_copied_in_and_a_camera_of_another_shape_is_refused():
    """The per-replay signature reads the first camera pair only; every pair is checked when a new modulation is
    copied in, so a block whose modulation has another shape is refused instead of broadcast into the static copy."""
    graphs = EmulatedGraphs()
    entry = graphs.acquire("k", lambda: None)
    source = type("Modulation", (), {})  # what a session passes: the object its camera pairs came from
    program = lambda d: d.latents * 2 + d.camera[-1][0].sum()
    first = _chunk_data([(1, 6, 8)] * 3)
    eager = graphs.run(entry, "fwd", first, program, camera_source=source())
    second = _chunk_data([(1, 6, 8)] * 3)._replace(latents=torch.randn(1, 4, 2, 3, 3) + 1)
    replayed = graphs.run(entry, "fwd", second, program, camera_source=source())
    assert graphs.replays == 1
    assert torch.equal(replayed, program(second)) and not torch.equal(replayed, eager)
    odd = _chunk_data([(1, 6, 8), (1, 6, 8), (1, 1, 8)])
    try:
        graphs.run(entry, "fwd", odd, program, camera_source=source())
    except ValueError as e:
        assert "camera modulation of shape (1, 1, 8), captured (1, 6, 8)" in str(e)
    else:
        raise AssertionError("a camera modulation of another shape was copied in")
