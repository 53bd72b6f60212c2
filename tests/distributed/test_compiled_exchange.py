"""The Ulysses exchange as custom ops inside compiled block regions, on gloo ranks (CPU, compiled on purpose).

Every rank runs the first five chunks of the scripted LingBot session (tests/lingbot_session_script.py: every window
length, the window filling mid-chunk, read-only steps and commits) dense on the reference path, then under Ulysses with its blocks compiled
through dynamo and AOTAutograd (``aot_eager``: the graph Inductor would get, run without code generation, which
tests/unit/test_compiled_regions.py checks), through a recording communicator, and checks:

* the outputs against dense, within the Ulysses parity bound (fp32; tests/distributed/test_lingbot_parity.py says why
  1e-5; compiled regions add reduction reordering of the same size, tests/unit/test_compiled_regions.py);
* the communicator saw, per block and forward, V then Q deferred, K completing the group, then the gather (none
  after the commit's last block, which stops at its K/V): the V-first schedule, run eagerly inside compiled code;
* no recompilation in a second session, and a model with a new communicator recompiles at most once (its key then
  becomes a dynamic int), a third one not at all.

MiniMax H3, U2 and TP2 x U2 (its TP hooks' collectives traced into the regions): one call with its joint blocks
compiled against dense, within its parity bound (tests/distributed/test_minimax_h3_parity.py: 2e-6), V leaving as a
strided view of the fused projection, one V-first group and gather per block.
"""

from __future__ import annotations

import copy

import pytest

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from telefuser.models.lingbot_world_v2 import build_random_lingbot_dit
from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from telefuser.models.minimax_h3 import MiniMaxH3Config, build_random_minimax_h3_dit
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.ops.compile_stats import count_compiled
from telefuser.ops.regions import compile_regions_on
from tests.conftest import get_pool
from tests.lingbot_session_script import STEPS, run_session, session_config
from tests.numerics import relative_error
from tools.harness.ulysses_reference import recording_communicator

pytestmark = pytest.mark.numerics

MAX_RELATIVE_ERROR = 1e-5
MINIMAX_MAX_RELATIVE_ERROR = 2e-6
CHUNKS = 5
GROUP = [("scatter", "v", False), ("scatter", "q", False), ("scatter", "k", True)]
GATHER = [("gather", None, True)]


def _compiled_parity(ctx, ulysses):
    mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses))
    dense_model = build_random_lingbot_dit(session_config(), seed=0)
    dense = run_session(dense_model, chunks=CHUNKS)
    model = LINGBOT_WORLD_V2.parallelize(copy.deepcopy(dense_model), mesh, communicator_factory=recording_communicator)
    compiles = []
    with compile_regions_on("cpu", backend="aot_eager"):
        with count_compiled() as first:
            parallel = run_session(model, chunks=CHUNKS)
        calls = list(model.communicator.calls)
        for _ in range(3):  # the same communicator, then two new ones
            with count_compiled() as stats:
                run_session(model, chunks=CHUNKS)
            compiles.append(stats.compiles)
            LINGBOT_WORLD_V2.parallelize(model, mesh, communicator_factory=recording_communicator)
    model.close()
    error = max(relative_error(p, d) for p, d in zip(parallel.outputs, dense.outputs, strict=True))
    return error, calls, first, compiles


def test_compiled_regions_run_the_v_first_exchange_under_ulysses(ranks):
    layers = session_config().num_layers
    step = (GROUP + GATHER) * layers
    commit = (GROUP + GATHER) * (layers - 1) + GROUP
    expected_calls = (step * len(STEPS) + commit) * CHUNKS
    for error, calls, first, compiles in ranks.run(_compiled_parity, ranks.world_size):
        assert error <= MAX_RELATIVE_ERROR, error
        assert calls == expected_calls, calls[:12]
        assert first.calls == CHUNKS * (len(STEPS) + 1) * layers
        assert compiles[0] == 0 and compiles[1] <= 2 and compiles[2] == 0, compiles


def _minimax_parity(ctx, ulysses, tp):
    import torch

    mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses, tp_degree=tp))
    config = MiniMaxH3Config.tiny()
    g = torch.Generator().manual_seed(1)
    inputs = (
        torch.randn(2, config.latents_dim, 3, 8, 8, generator=g),
        torch.randn(2, config.audio_latents_dim, 10, generator=g),
        torch.randn(2, 7, config.text_dim, generator=g),
        torch.tensor([250.0, 900.0]),
        torch.tensor([600.0, 40.0]),
    )
    dense_model = build_random_minimax_h3_dit(config, seed=0)
    model = MINIMAX_H3.parallelize(copy.deepcopy(dense_model), mesh, communicator_factory=recording_communicator)
    with torch.no_grad(), compile_regions_on("cpu", backend="aot_eager"):
        dense = dense_model(*inputs)
        with count_compiled() as stats:
            parallel = model(*inputs)
    calls = list(model.communicator.calls)
    model.close()
    errors = [relative_error(p, d) for p, d in zip(parallel, dense, strict=True)]
    return errors, calls, stats.calls


@pytest.mark.parametrize("ulysses, tp", [(2, 1), (2, 2)], ids=["U2", "TP2xU2"])
def test_minimax_regions_under_ulysses_and_tp(ulysses, tp):
    config = MiniMaxH3Config.tiny()
    for errors, calls, compiled_calls in get_pool(ulysses * tp).run(_minimax_parity, ulysses, tp):
        assert max(errors) <= MINIMAX_MAX_RELATIVE_ERROR, errors
        assert calls == (GROUP + GATHER) * config.num_layers, calls[:8]
        assert compiled_calls >= config.num_layers
