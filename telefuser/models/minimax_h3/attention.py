"""Joint self-attention over the packed sequence, with the V-first Ulysses exchange.

Fused QKV; V leaves while one step applies per-head RMSNorm and partial RoPE to Q and K; attention runs per document.
Under TP the projection holds this rank's heads only (tp.py). In a compiled block region the context carries the
communicator's exchange key and the documents as a CPU tensor (`AttentionContext`), so the exchange and the attention
run as opaque custom ops and a new layout changes no compiled code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ...distributed.ulysses import UlyssesCommunicator
from ...distributed.ulysses.compiled_ops import ExchangeKey
from ...distributed.ulysses.schedule import PHASE_ATTENTION, gather_heads, phase, v_first_fused
from ...ops.attention import attention
from ...ops.qk_prep import norm_rope


@dataclass
class AttentionContext:
    """What one forward's attention calls share. `documents` are (start, stop) ranges of the full sequence that
    attend only within themselves (the valid rows, then the padding), as a list or an int64 ``[n, 2]`` CPU tensor (in
    a compiled region); None means one document. `communicator`: the communicator, or its exchange key (in a compiled
    region, `distributed.ulysses.compiled_ops.exchange_key`), or None."""

    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin for this rank's rows
    documents: list[tuple[int, int]] | torch.Tensor | None = None
    communicator: UlyssesCommunicator | ExchangeKey | None = None
    attn_impl: str = "sdpa"


def attend_documents(q, k, v, documents, impl: str) -> torch.Tensor:
    """Attention within each document of [B, S, H, D]; equal to masking keys of other documents. Every impl, the
    quantizing ones (``cudnn_fp8``, ``sage_sm90``) included, runs one call per document, so each document's keys get
    their own scales and, for ``sage_sm90``, their own smoothing mean (one mean per query's key set keeps softmax
    exact)."""
    if isinstance(documents, torch.Tensor):  # a compiled region: one opaque call splits them
        return attention(q, k, v, impl=impl, documents=documents)
    if documents is None or len(documents) == 1:
        return attention(q, k, v, impl=impl)
    parts = [attention(q[:, a:b], k[:, a:b], v[:, a:b], impl=impl) for a, b in documents]
    return torch.cat(parts, dim=1)


class JointAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, *, qk_norm_eps: float):
        super().__init__()
        self.head_dim = head_dim
        self.qkv_proj = nn.Linear(hidden_size, 3 * num_heads * head_dim, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=qk_norm_eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=qk_norm_eps)
        self.out_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        # V leaves as a strided view of the fused projection while Q and K are normed and rotated
        q, k, v = v_first_fused(
            ctx.communicator, self.qkv_proj(x), self.head_dim, lambda q, k: self._norm_rope(q, k, ctx.rope)
        )
        with phase(PHASE_ATTENTION):
            o = attend_documents(q, k, v, ctx.documents, ctx.attn_impl)
        return self.out_proj(gather_heads(ctx.communicator, o).flatten(2))

    def _norm_rope(self, q, k, rope):
        return norm_rope(self.q_norm, q, rope), norm_rope(self.k_norm, k, rope)
