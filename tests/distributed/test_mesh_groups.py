"""The mesh on real gloo process groups: layout, and bad configurations failing identically on every rank."""

from __future__ import annotations

import torch.distributed as dist

from telefuser.distributed.mesh import ParallelConfig, ParallelConfigError, build_mesh


def _mesh_layout(ctx, ulysses, tp):
    mesh = build_mesh(ParallelConfig(ulysses_degree=ulysses, tp_degree=tp))
    return (
        dist.get_process_group_ranks(mesh.ulysses_group),
        dist.get_process_group_ranks(mesh.tp_group),
        mesh.ulysses_rank,
        mesh.tp_rank,
    )


def _bad_mesh(ctx, case):
    config = {
        "world_mismatch": lambda r: ParallelConfig(ulysses_degree=2, tp_degree=1),
        "ranks_disagree": lambda r: ParallelConfig(ulysses_degree=4 if r == 0 else 2, tp_degree=1 if r == 0 else 2),
    }[case](ctx.rank)
    try:
        build_mesh(config)
    except ParallelConfigError as exc:
        # The world is still usable afterwards: no rank is left inside a collective.
        dist.barrier()
        return str(exc)
    raise AssertionError("no error")


def test_tp2_ulysses2_groups(ranks4):
    layout = ranks4.run(_mesh_layout, 2, 2)
    assert [row[0] for row in layout] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [row[1] for row in layout] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [(row[2], row[3]) for row in layout] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_ulysses4_groups(ranks4):
    layout = ranks4.run(_mesh_layout, 4, 1)
    assert all(row[0] == [0, 1, 2, 3] for row in layout)
    assert [row[1] for row in layout] == [[0], [1], [2], [3]]


def test_bad_configurations_fail_on_every_rank(ranks4):
    msgs = ranks4.run(_bad_mesh, "world_mismatch")
    assert len(set(msgs)) == 1 and "world size 4 does not match" in msgs[0]
    msgs = ranks4.run(_bad_mesh, "ranks_disagree")
    assert len(set(msgs)) == 1 and "ranks disagree on the parallel configuration" in msgs[0], msgs
