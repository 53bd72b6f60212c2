"""Every model's DiT on gloo ranks (tests/rank_pool.py), at the tiny size on the example inputs.

* A random build is deterministic across ranks: two ranks drawing the same seed hold the same bytes in every tensor
  (a state digest); another seed gives another digest.
* Ulysses 2 and 4 against the dense model in the same process: every rank builds the same seeded model and inputs,
  runs the example dense, then on a copy parallelized by the spec's plan, and compares the full outputs every rank
  returns. The example sequences (18 rows; MiniMax's 65, packed to 128) split unevenly or carry padding over the
  ranks. Tolerance, fp32 on CPU: Ulysses moves exact copies of rows and heads, so only the summation order of GEMMs
  over fewer rows and of attention over fewer heads differs. Measured here 0 to 2.2e-7 (MiniMax U4); the per-model
  parity tests, over longer runs, measured up to 8.6e-7 (LingBot's rolling window): the bound, 1e-5, is about 10x
  that. Each forward makes one V-first exchange group per block (V, then Q, then K completing it) and one head
  gather. The negative control: the same run with the gathered attention heads rolled by one (each head's output
  read as its neighbour's, a wrong exchange) must land 1000x above the bound (measured 0.15 to 0.52).
"""

from __future__ import annotations

import copy

import pytest

from telefuser.distributed.mesh import ParallelConfig, build_mesh
from tests.conformance.specs import each_model, spec_named, state_digest, tiny
from tests.numerics import relative_error
from tools.harness.ulysses_reference import misrouting_communicator, recording_communicator

BOUND = 1e-5
V_FIRST = [("scatter", "v", False), ("scatter", "q", False), ("scatter", "k", True), ("gather", None, True)]


def _digests(ctx, name):
    return state_digest(tiny(name, seed=0)), state_digest(tiny(name, seed=1))


@each_model()
def test_a_random_build_is_the_same_on_every_rank(ranks2, name):
    (same, other), (peer_same, peer_other) = ranks2.run(_digests, name)
    assert same == peer_same and other == peer_other
    assert same != other


def _ulysses(ctx, name: str, degree: int):
    spec = spec_named(name)
    mesh = build_mesh(ParallelConfig(ulysses_degree=degree))
    dense = tiny(name)
    expected = spec.example_forward(dense).run()
    results = []
    for factory in (recording_communicator, misrouting_communicator):
        model = spec.parallelize(copy.deepcopy(dense), mesh, communicator_factory=factory)
        outputs = spec.example_forward(model).run()
        calls = list(getattr(model.communicator, "calls", []))
        model.close()
        results.append((max(relative_error(o, e) for o, e in zip(outputs, expected, strict=True)), calls))
    (error, calls), (wrong, _) = results
    return error, wrong, calls, len(dense.blocks)


@pytest.mark.numerics
@each_model()
def test_ulysses_matches_dense_and_a_wrong_exchange_does_not(ranks, name):
    for error, wrong, calls, blocks in ranks.run(_ulysses, name, ranks.world_size):
        print(f"{name} U{ranks.world_size}: max rel {error:.2e}, wrong exchange {wrong:.2e}")
        assert error <= BOUND, error
        assert wrong > 1000 * BOUND, wrong
        assert calls == V_FIRST * blocks, calls[:8]
