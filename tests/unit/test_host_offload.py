"""HostResident and the offloaded MiniMax H3 prompt encoder: the same conditioning as a resident encoder, weights back
in host memory after every prompt, also after a failure. (The GPU half, pinned memory and freed device copies, is
tests/gpu/test_host_offload_cuda.py.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from telefuser.pipelines.host_offload import HostResident
from telefuser.pipelines.minimax_h3.text_encoder import MiniMaxH3TextEncoder, PromptEncoder, tiny_text_config
from telefuser.pipelines.minimax_h3.tokenizer import load_tokenizer


def _encoders():
    config = tiny_text_config(hidden_size=64)
    resident = MiniMaxH3TextEncoder.random(config, num_layers=2, seed=3)
    offloaded = MiniMaxH3TextEncoder.random(config, num_layers=2, seed=3)
    return PromptEncoder(load_tokenizer(None), resident), PromptEncoder(load_tokenizer(None), offloaded, offload=True)


def test_offloaded_prompt_encoder_gives_the_resident_encoders_conditioning():
    resident, offloaded = _encoders()
    assert offloaded.offload and not resident.offload
    for prompt in ("a red fox in snow", "waves on a pebble beach at night"):
        expected = resident(prompt, torch.device("cpu"))
        got = offloaded(prompt, torch.device("cpu"))
        assert got.abs().max() > 0
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert all(p.device.type == "cpu" for p in offloaded.encoder.parameters())


def test_host_copies_come_back_after_an_error_inside_the_block():
    module = nn.Linear(8, 4)
    weight = module.weight.detach().clone()
    resident = HostResident(module)
    host_storage = module.weight.data.data_ptr()
    with pytest.raises(RuntimeError, match="boom"), resident.on("cpu"):
        raise RuntimeError("boom")
    assert module.weight.data.data_ptr() == host_storage  # the host tensor itself, not a copy
    torch.testing.assert_close(module.weight.detach(), weight, rtol=0, atol=0)


def test_buffers_travel_with_the_parameters():
    module = nn.BatchNorm1d(4).eval()
    module.running_mean.copy_(torch.arange(4.0))
    resident = HostResident(module)
    x = torch.randn(3, 4)
    with resident.on("cpu") as lent:
        out = lent(x)
    torch.testing.assert_close(out, (x - torch.arange(4.0)) / torch.sqrt(torch.ones(4) + module.eps)
                               * module.weight.detach() + module.bias.detach())
