"""The opaque custom ops of the compiled block regions, on the CPU.

* `torch.library.opcheck`: each op's schema, fake (meta) kernel and dispatch agree with its implementation.
* Data movement, exact: the KV-window write puts each chunk row at its slot (bf16, and e4m3 bytes); attention over a
  window prefix (`kv_rows`) or per document (`documents`) is literally the computation on the sliced tensors.
* Outputs never alias inputs (attention ``identity`` returns a copy), as a custom op must.
* The exchange key names a communicator weakly: a dropped communicator is reported by the ops, not resurrected.
"""

from __future__ import annotations

import gc

import pytest
import torch

from telefuser.distributed.ulysses import compiled_ops
from telefuser.models.lingbot_world_v2 import WindowSlots
from telefuser.ops.attention import attention
from telefuser.ops.attention_fp8 import FP8


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_opcheck_attention_and_window_write():
    q, k, v = _randn(1, 6, 2, 16, seed=1), _randn(1, 10, 2, 16, seed=2), _randn(1, 10, 2, 16, seed=3)
    torch.library.opcheck(torch.ops.telefuser.attention.default, (q, k, v, "sdpa", False, torch.tensor([7]), None))
    docs = torch.tensor([[0, 4], [4, 10]])
    torch.library.opcheck(torch.ops.telefuser.attention.default, (k, k, v, "sdpa", False, None, docs))
    cache_k, cache_v = torch.zeros(1, 12, 2, 16), torch.zeros(1, 12, 2, 16)
    slots = torch.tensor([5, 6, 7, 0, 1, 2])
    torch.library.opcheck(torch.ops.telefuser.kv_window_write.default, (q, q * 2, cache_k, cache_v, slots))


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8], ids=["bf16", "e4m3"])
def test_window_write_puts_each_row_at_its_slot(dtype):
    plan = WindowSlots(capacity=10, sink_rows=2, committed=10, new_rows=4, ring_head=6)  # wraps: rows 8, 9, 2, 3
    slots = plan.slot_rows("cpu")
    assert slots.tolist() == [8, 9, 2, 3]
    new_k, new_v = (_randn(2, 4, 3, 8, seed=s).to(dtype) for s in (1, 2))
    cache_k, cache_v = (_randn(2, 10, 3, 8, seed=s).to(dtype) for s in (3, 4))
    before_k = cache_k.clone()
    torch.ops.telefuser.kv_window_write(new_k, new_v, cache_k, cache_v, slots)
    as_bytes = lambda t: t.view(torch.uint8)  # noqa: E731 - compares e4m3 too
    for row, first, rows in plan.slots:
        assert torch.equal(as_bytes(cache_k[:, row : row + rows]), as_bytes(new_k[:, first : first + rows]))
        assert torch.equal(as_bytes(cache_v[:, row : row + rows]), as_bytes(new_v[:, first : first + rows]))
    untouched = [r for r in range(10) if r not in slots.tolist()]
    assert torch.equal(as_bytes(cache_k[:, untouched]), as_bytes(before_k[:, untouched]))


def test_prefix_and_document_attention_are_the_sliced_computation():
    q, k, v = _randn(1, 6, 2, 16, seed=1), _randn(1, 10, 2, 16, seed=2), _randn(1, 10, 2, 16, seed=3)
    got = torch.ops.telefuser.attention(q, k, v, "sdpa", False, torch.tensor([7]), None)
    assert torch.equal(got, attention(q, k[:, :7], v[:, :7]))
    docs = torch.tensor([[0, 4], [4, 10]])
    got = torch.ops.telefuser.attention(k, k, v, "sdpa", False, None, docs)
    want = torch.cat([attention(k[:, a:b], k[:, a:b], v[:, a:b]) for a, b in ((0, 4), (4, 10))], dim=1)
    assert torch.equal(got, want)


def test_identity_attention_returns_a_copy():
    q = _randn(1, 6, 2, 16)
    out = torch.ops.telefuser.attention(q, q, q, "identity", False, None, None)
    assert torch.equal(out, q) and out.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()


class _Comm:
    world_size, rank = 2, 0


def test_the_exchange_key_holds_its_communicator_weakly():
    comm = _Comm()
    key = compiled_ops.exchange_key(comm)
    assert key.world == 2 and compiled_ops.exchange_key(comm) == key  # one key per communicator
    assert compiled_ops.communicator_for(key.key) is comm
    assert compiled_ops.exchange_key(None) is None
    del comm
    gc.collect()
    with pytest.raises(RuntimeError, match=f"key {key.key} names no live communicator"):
        compiled_ops.communicator_for(key.key)
