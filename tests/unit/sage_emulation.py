"""SageAttention2's SM90 kernel in plain torch, for the tests: what it computes from the inputs it takes
(telefuser/ops/attention_sage.py's module docstring), on the CPU or a GPU."""

from __future__ import annotations

import math

import torch

from telefuser.ops.attention_sage import FP8, FP8_MAX, K_BLOCK, P_OFFSET_LOG2, WARP_ROWS, value_rows


def expand_q_scales(q_scale: torch.Tensor, s_q: int, granularity: str) -> torch.Tensor:
    """``[B, H, n]`` -> each query row's scale ``[B, S_q, H]``."""
    r = torch.arange(s_q)
    index = r // WARP_ROWS if granularity == "per_warp" else (r // WARP_ROWS) * 8 + r % 8
    return q_scale[:, :, index.to(q_scale.device)].transpose(1, 2)


def expand_k_scales(k_scale: torch.Tensor, s_kv: int, granularity: str) -> torch.Tensor:
    j = torch.arange(s_kv)
    index = j // K_BLOCK if granularity == "per_warp" else (j // K_BLOCK) * 4 + (j % 8) // 2
    return k_scale[:, :, index.to(k_scale.device)].transpose(1, 2)


def round_fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8).float()


def emulate_kernel(
    q8, q_scale, k8, k_scale, v8, v_scale, *, granularity: str, out_dtype=torch.float32, causal: bool = False
) -> torch.Tensor:
    """What the kernel computes, in fp32 torch (CPU or GPU), from the same inputs: the scale layouts, the online
    softmax over 128-key steps with the offset row max, P rounded to e4m3 for P·V and the normalizer from the
    unrounded P, the V scales applied last. Returns ``[B, S_q, H_q, D]`` in `out_dtype`."""
    b, s_q, h_q, d = q8.shape
    s_kv, h_kv = k8.shape[1], k8.shape[2]
    group = h_q // h_kv
    qf = (q8.float() * expand_q_scales(q_scale, s_q, granularity)[..., None]).transpose(1, 2)  # [b, h, s_q, d]
    kf = (k8.float() * expand_k_scales(k_scale, s_kv, granularity)[..., None]).transpose(1, 2)
    vf = value_rows(v8.float())[:, :s_kv].transpose(1, 2)  # e4m3 values, unscaled
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    scale = (1.0 / math.sqrt(d)) * math.log2(math.e)
    m = torch.full((b, h_q, s_q, 1), -5e6)
    denom = torch.zeros((b, h_q, s_q, 1))
    acc = torch.zeros((b, h_q, s_q, d))
    rows = torch.arange(s_q)[:, None]
    for start in range(0, s_kv, K_BLOCK):
        s = (qf @ kf[:, :, start : start + K_BLOCK].transpose(-1, -2)) * scale
        if causal:
            cols = torch.arange(start, min(start + K_BLOCK, s_kv))[None, :]
            s = s.masked_fill(cols > rows, -5e6)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True) - P_OFFSET_LOG2)
        rescale = torch.exp2(m - m_new)
        p = torch.exp2(s - m_new)
        denom = denom * rescale + p.sum(-1, keepdim=True)
        acc = acc * rescale + round_fp8(p) @ vf[:, :, start : start + K_BLOCK]
        m = m_new
    v_scales = v_scale.repeat_interleave(group, 1)[:, :, None, :]  # [b, h_q, 1, d]
    return (acc / denom * v_scales).transpose(1, 2).to(out_dtype)
