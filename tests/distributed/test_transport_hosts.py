"""A Ulysses group whose ranks report different hosts (a torchrun job over several nodes) never takes a same-host
transport: every rank agrees on the portable all-to-all and says why, and the results equal the same-host run's.

The ranks here share one machine; each reports the host name a multi-node launch would give it (`node0`, `node1`,
...) through `socket.gethostname`, which is what transport selection compares."""

from __future__ import annotations

import socket

import torch

from telefuser.distributed.ulysses import UlyssesCommunicator
from telefuser.distributed.ulysses import selection
from tools.harness.ulysses_reference import expected_scatter, rank_input


def _exchange(ctx, hosts: list[str]):
    """Scatter and gather on host-shm with this rank's reported host `hosts[rank]`; (transport, reasons, exact)."""
    w, r = ctx.world_size, ctx.rank
    selection.socket.gethostname = lambda: hosts[r]
    try:
        comm = UlyssesCommunicator(ctx.group, transport="host-shm")
        xs = [rank_input(71, p, (1, 6, 2 * w, 8), torch.float32) for p in range(w)]
        out = comm.scatter_heads(xs[r]).wait()
        back = comm.gather_heads(out).wait()
        exact = torch.equal(out, expected_scatter(xs, r)) and torch.equal(back, xs[r])  # back: the round trip
        transport, reasons = comm.transport, dict(comm.fallback_reasons)
        comm.close()
    finally:
        selection.socket.gethostname = socket.gethostname
    return transport, reasons, exact


def test_ranks_on_several_hosts_agree_on_the_portable_exchange_and_say_why(ranks):
    w = ranks.world_size
    nodes = [f"node{r * 2 // w}" for r in range(w)]  # the group split over two nodes: W2 1+1, W4 2+2
    results = ranks.run(_exchange, nodes)
    for transport, reasons, exact in results:
        assert transport == "portable"
        assert "ranks span several hosts" in reasons["host-shm"] and "'node1'" in reasons["host-shm"], reasons
        assert exact
    assert len({str(reasons) for _, reasons, _ in results}) == 1  # one decision, identical on every rank


def test_the_same_ranks_on_one_host_take_host_shm(ranks):
    """The control: the same call with one host name takes the same-host transport, so the refusal above is the
    host check's doing, not host-shm being unavailable here."""
    results = ranks.run(_exchange, ["node0"] * ranks.world_size)
    assert [t for t, _, _ in results] == ["host-shm"] * ranks.world_size
    assert all(exact and not reasons for _, reasons, exact in results)
