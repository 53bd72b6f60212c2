"""`--attn-impl auto` on a GPU: MiniMax H3 resolves it to SageAttention2's SM90 kernel where the build imports and the
GPU is SM90, for the official sizes' 128-channel heads, and to SDPA for the tiny sizes' 16-channel ones (which the
kernel does not take). Skips, with the reason, without a CUDA GPU or without a usable SM90 build."""

from __future__ import annotations

import argparse

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")

from telefuser.models.lingbot_world_v2.spec import LINGBOT_WORLD_V2
from telefuser.models.minimax_h3.spec import MINIMAX_H3
from telefuser.ops.attention_sage import sage_sm90_available
from telefuser.runtime import Runtime


def test_auto_takes_the_sm90_kernel_where_the_heads_fit_it():
    ok, why = sage_sm90_available()
    if not ok:
        pytest.skip(why)
    cuda = Runtime(None, torch.device("cuda", torch.cuda.current_device()), torch.bfloat16)
    assert MINIMAX_H3.attention_impl(argparse.Namespace(config="official"), cuda) == "sage_sm90"
    assert MINIMAX_H3.attention_impl(argparse.Namespace(config="tiny"), cuda) == "sdpa"
    assert (
        MINIMAX_H3.attention_impl(
            argparse.Namespace(config="official"), Runtime(None, torch.device("cpu"), torch.float32)
        )
        == "sdpa"
    )
    assert LINGBOT_WORLD_V2.attention_impl(argparse.Namespace(attn_impl="auto", config="official"), cuda) == "sdpa"
