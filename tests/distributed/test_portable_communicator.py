"""The portable (all_to_all_single over gloo) Ulysses path, exact against rank-wise constructed results."""

from __future__ import annotations

import time

import pytest
import torch

from telefuser.distributed.ulysses import (
    UlyssesCommunicator,
    UlyssesConfigError,
    UlyssesInputError,
    UlyssesProtocolError,
    UlyssesTimeoutError,
)
from telefuser.distributed.ulysses.copy_engine import CopyEngineOptions
from tools.harness import transport_cases as cases
from tools.harness.ulysses_reference import expected_gather, expected_scatter, rank_input

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]


# ---- functions that run on every rank ----------------------------------------------------------------------------
def _scatter_and_gather_exact(ctx, dtype, b, s, hl, d):
    w, r = ctx.world_size, ctx.rank
    shape = (b, s, hl * w, d)
    comm = UlyssesCommunicator(ctx.group)
    xs = [rank_input(1, p, shape, dtype) for p in range(w)]
    out = comm.scatter_heads(xs[r]).wait()
    assert out.shape == (b, s * w, hl, d) and out.is_contiguous()
    assert torch.equal(out, expected_scatter(xs, r))
    ys = [rank_input(2, p, (b, s * w, hl, d), dtype) for p in range(w)]
    back = comm.gather_heads(ys[r]).wait()
    assert back.shape == (b, s, hl * w, d)
    assert torch.equal(back, expected_gather(ys, r))
    assert torch.equal(comm.gather_heads(out).wait(), xs[r])  # round trip
    comm.close()
    return comm.transport


def _fused_qkv_views(ctx, dtype):
    w, r = ctx.world_size, ctx.rank
    b, s, h, d = 2, 5, 2 * w, 8
    fused = [rank_input(3, p, (b, s, 3, h, d), dtype) for p in range(w)]
    comm = UlyssesCommunicator(ctx.group)
    for which in range(3):  # q, k and v are all strided views of the fused projection
        views = [f[:, :, which] for f in fused]
        assert not views[r].is_contiguous()
        out = comm.scatter_heads(views[r]).wait()
        assert torch.equal(out, expected_scatter(views, r)), which
    comm.close()
    return True


def _grouped_vqk(ctx, dtype, repeats):
    w, r = ctx.world_size, ctx.rank
    b, s, h, d = 1, 6, 3 * w, 4
    comm = UlyssesCommunicator(ctx.group)
    for it in range(repeats):
        fused = [rank_input(10 + it, p, (b, s, 3, h, d), dtype) for p in range(w)]
        q, k, v = fused[r].unbind(2)
        hv = comm.scatter_heads(v, tag="v", barrier=False)
        assert comm.has_pending_group and not hv.ready_to_wait
        busy = torch.randn(64, 64) @ torch.randn(64, 64)  # other work while V is in flight
        hq = comm.scatter_heads(q * 1, tag="q", barrier=False)
        hk = comm.scatter_heads(k, tag="k")
        assert not comm.has_pending_group and hv.ready_to_wait
        for handle, idx in ((hk, 1), (hv, 2), (hq, 0)):  # any wait order
            got = handle.wait()
            assert torch.equal(got, expected_scatter([f[:, :, idx] for f in fused], r)), (it, handle.tag)
            assert handle.wait() is got  # waiting twice returns the same tensor
        assert busy.shape == (64, 64)
    comm.close()
    return True


def _wait_before_barrier(ctx):
    w, r = ctx.world_size, ctx.rank
    comm = UlyssesCommunicator(ctx.group)
    xs = [rank_input(20, p, (1, 4, w, 8), torch.float32) for p in range(w)]
    hv = comm.scatter_heads(xs[r], tag="v", barrier=False)
    try:
        hv.wait()
    except UlyssesProtocolError as exc:
        message = str(exc)
    else:
        raise AssertionError("wait before the barrier did not raise")
    hk = comm.scatter_heads(xs[r] + 1, tag="k")
    assert torch.equal(hv.wait(), expected_scatter(xs, r))  # after the completing call it works
    assert torch.equal(hk.wait(), expected_scatter([x + 1 for x in xs], r))
    comm.close()
    try:
        comm.scatter_heads(xs[r])
    except RuntimeError as exc:
        closed = str(exc)
    return message, closed


def _expect_input_error(ctx, case):
    """Run one bad call on every rank; return its message. Afterwards the communicator must still work."""
    w, r = ctx.world_size, ctx.rank
    comm = UlyssesCommunicator(ctx.group)
    good = rank_input(30, r, (1, 4, 2 * w, 8), torch.float32)
    call = BAD_CALLS[case]
    try:
        call(comm, good, r, w)
    except UlyssesInputError as exc:
        message = str(exc)
    else:
        raise AssertionError(f"{case}: no error")
    # No collective was left half-done: a valid exchange still gives exact results.
    xs = [rank_input(31, p, (1, 4, 2 * w, 8), torch.float32) for p in range(w)]
    if comm.has_pending_group:
        comm.scatter_heads(xs[r], tag="z").wait()
        assert torch.equal(
            _STARTED.pop().wait(), expected_scatter([rank_input(30, p, good.shape, good.dtype) for p in range(w)], r)
        )
    assert torch.equal(comm.scatter_heads(xs[r]).wait(), expected_scatter(xs, r))
    comm.close()
    return message


_STARTED: list = []  # handles of transfers that started before the bad call; waited after recovery


def _deferred(comm, good, r, w):
    _STARTED.append(comm.scatter_heads(good, tag="v", barrier=False))
    comm.scatter_heads(good, tag="v", barrier=False)


def _gather_while_pending(comm, good, r, w):
    _STARTED.append(comm.scatter_heads(good, tag="v", barrier=False))
    comm.gather_heads(good)


BAD_CALLS = {
    "dtype_int": lambda c, g, r, w: c.scatter_heads(g.to(torch.int32)),
    "dtype_fp64": lambda c, g, r, w: c.scatter_heads(g.double()),
    "three_dims": lambda c, g, r, w: c.scatter_heads(g[0]),
    "not_a_tensor": lambda c, g, r, w: c.scatter_heads(g.tolist()),
    "heads_indivisible": lambda c, g, r, w: c.scatter_heads(g[:, :, :3]),
    "empty": lambda c, g, r, w: c.scatter_heads(g[:, :0]),
    "gather_seq_indivisible": lambda c, g, r, w: c.gather_heads(g[:, :3]),
    "deferred_without_tag": lambda c, g, r, w: c.scatter_heads(g, barrier=False),
    "duplicate_tag": _deferred,
    "gather_while_pending": _gather_while_pending,
    "barrier_not_bool": lambda c, g, r, w: c.scatter_heads(g, barrier="yes"),
    "only_rank0_bad_dtype": lambda c, g, r, w: c.scatter_heads(g.half().double() if r == 0 else g),
    "ranks_disagree_on_length": lambda c, g, r, w: c.scatter_heads(g[:, : 2 + r % 2]),
}

EXPECTED = {
    "dtype_int": "dtype int32 is not supported",
    "dtype_fp64": "dtype float64 is not supported",
    "three_dims": "expected a 4-D tensor",
    "not_a_tensor": "expected a torch.Tensor",
    "heads_indivisible": "3 heads cannot be split evenly",
    "empty": "the tensor is empty",
    "gather_seq_indivisible": "is not divisible by the Ulysses degree",
    "deferred_without_tag": "needs a tag",
    "duplicate_tag": "already pending",
    "gather_while_pending": "complete the pending group",
    "barrier_not_bool": "barrier must be a bool",
    "only_rank0_bad_dtype": "rank 0: scatter_heads: dtype float64",
    "ranks_disagree_on_length": "ranks disagree on the scatter_heads call",
}


def _verify_always_catches_late_divergence(ctx):
    """With verify='always', a rank that diverges after a repeated signature still fails on every rank."""
    w, r = ctx.world_size, ctx.rank
    comm = UlyssesCommunicator(ctx.group, verify="always")
    x = rank_input(40, r, (1, 4, w, 8), torch.float32)
    comm.scatter_heads(x).wait()
    try:
        comm.scatter_heads(x[:, :2] if r == w - 1 else x)
    except UlyssesInputError as exc:
        return str(exc)
    raise AssertionError("no error")


def _compiled_round_trip(ctx):
    w, r = ctx.world_size, ctx.rank
    comm = UlyssesCommunicator(ctx.group)

    def attention_exchange(x):
        y = comm.scatter_heads(x * 2).wait()
        return comm.gather_heads(y + 1).wait()

    compiled = torch.compile(attention_exchange, backend="aot_eager", fullgraph=True)
    xs = [rank_input(50, p, (1, 4, 2 * w, 8), torch.float32) for p in range(w)]
    out = compiled(xs[r])
    assert torch.equal(out, xs[r] * 2 + 1)
    assert torch.equal(compiled(xs[r] + 1), (xs[r] + 1) * 2 + 1)
    comm.close()
    return True


def _config_mismatch(ctx, setting):
    """One rank differs in one setting; the first call raises the same UlyssesConfigError on every rank."""
    r = ctx.rank
    kwargs = {
        "transport": {"transport": "host-shm" if r == 0 else "portable"},
        "verify": {"verify": "always" if r == 0 else "new"},
        "flag_bits": {"options": CopyEngineOptions(flag_bits=32 if r == 0 else 64)},
    }[setting]
    comm = UlyssesCommunicator(ctx.group, **kwargs)
    x = rank_input(60, r, (1, 4, 2 * ctx.world_size, 8), torch.float32)
    messages = []
    for _ in range(2):  # it stays refused: the exchange runs again and raises again
        try:
            comm.scatter_heads(x).wait()
        except UlyssesConfigError as exc:
            messages.append(str(exc))
    comm.close()
    return messages


def _diverge_at_repeated_signature(ctx, transport, timeout_s):
    """The last rank passes a bad input at a signature every rank has already agreed: the others skip agreement and
    go on to the transfer, it enters an exchange alone. Neither side can be agreed: both must get a clear error
    within the timeout."""
    w, r = ctx.world_size, ctx.rank
    comm = UlyssesCommunicator(ctx.group, transport=transport, options=CopyEngineOptions(timeout_s=timeout_s))
    x = rank_input(61, r, (1, 4, 2 * w, 8), torch.float32)
    comm.scatter_heads(x).wait()
    t0 = time.monotonic()
    try:
        comm.scatter_heads(x.double() if r == w - 1 else x).wait()
    except (UlyssesTimeoutError, UlyssesInputError) as exc:
        outcome = (isinstance(exc, UlyssesTimeoutError), str(exc), time.monotonic() - t0)
    else:
        raise AssertionError("no error")
    try:
        comm.scatter_heads(x)
    except RuntimeError as exc:
        refused = str(exc)
    comm.close()
    return outcome, refused


# ---- the tests ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("b,s,hl,d", [(1, 3, 2, 8), (2, 5, 1, 16)])
def test_scatter_gather_exact(ranks, dtype, b, s, hl, d):
    assert ranks.run(_scatter_and_gather_exact, dtype, b, s, hl, d) == ["portable"] * ranks.world_size


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_fused_qkv_views(ranks, dtype):
    assert all(ranks.run(_fused_qkv_views, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_grouped_vqk_tags_repeated(ranks, dtype):
    assert all(ranks.run(_grouped_vqk, dtype, 3))


def test_wait_before_barrier_raises(ranks):
    for message, closed in ranks.run(_wait_before_barrier):
        assert "waited before its group's completing call" in message and "['v']" in message
        assert "closed" in closed


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_same_error_on_every_rank(ranks, case):
    messages = ranks.run(_expect_input_error, case)
    assert len(set(messages)) == 1, messages
    assert EXPECTED[case] in messages[0], messages[0]


def test_verify_always_catches_late_divergence(ranks):
    messages = ranks.run(_verify_always_catches_late_divergence)
    assert len(set(messages)) == 1 and "ranks disagree" in messages[0], messages


def test_works_inside_torch_compile(ranks2):
    assert all(ranks2.run(_compiled_round_trip))


def test_unreadable_layouts_are_valid_data_on_portable(ranks):
    assert ranks.run(cases.case_layouts_packed_locally, "portable", "cpu") == ["portable"] * ranks.world_size


@pytest.mark.parametrize("setting", ["transport", "verify", "flag_bits"])
def test_one_rank_configuration_difference_fails_on_every_rank(ranks2, setting):
    messages = ranks2.run(_config_mismatch, setting)
    assert messages[0] == messages[1] and len(messages[0]) == 2, messages
    assert f"ranks disagree on the Ulysses configuration: {setting}" in messages[0][0], messages[0][0]
    assert "rank 0:" in messages[0][0] and "rank 1:" in messages[0][0]


@pytest.mark.parametrize("transport", ["portable", "host-shm"])
def test_divergence_at_a_repeated_signature_ends_everywhere_within_the_timeout(ranks2, transport):
    timeout_s = 1.5
    try:
        results = ranks2.run(_diverge_at_repeated_signature, transport, timeout_s, timeout=60)
    finally:
        ranks2.close()  # a timed-out collective leaves the pool's process group out of step: start a fresh one
    (good, good_refused), (bad, bad_refused) = results
    assert bad[0] and "did not reach the agreement of a scatter_heads call" in bad[1], bad[1]
    assert good[0], good[1]
    if transport == "portable":
        assert "portable all_to_all of scatter_heads" in good[1] and "out of step" in good[1], good[1]
    else:
        assert "did not complete the open phase of handshake group 3" in good[1], good[1]  # rank 1 never opens it
    for _, _, elapsed in (good, bad):
        assert timeout_s <= elapsed < timeout_s + 8
    assert "failed earlier" in good_refused and "failed earlier" in bad_refused
