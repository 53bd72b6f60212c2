"""HostResident and the streamed MiniMax H3 prompt encoder: the same conditioning as a resident encoder, weights back
in host memory after every prompt, also after a failure; on a GPU, pinned host memory and at most two layers on the
device while a prompt encodes, freed after it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from telefuser.memory.host import HostResident
from telefuser.pipelines.minimax_h3.text_encoder import MiniMaxH3TextEncoder, Qwen3VLPromptEncoder, tiny_text_config
from telefuser.pipelines.minimax_h3.tokenizer import load_tokenizer
from tests.numerics import UNIT_ROUNDOFF, relative_error

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def _encoders(streamed_from: int):
    config = tiny_text_config(hidden_size=64)
    resident = MiniMaxH3TextEncoder.random(config, num_layers=2, seed=3)
    offloaded = MiniMaxH3TextEncoder.random(config, num_layers=2, seed=3, host_from=streamed_from)
    streamed = Qwen3VLPromptEncoder(load_tokenizer(None), offloaded, streamed_from=streamed_from, device="cpu")
    return Qwen3VLPromptEncoder(load_tokenizer(None), resident), streamed


# The lent encoder computes with copies of the same weights at other addresses, which may steer the kernels to
# another summation order (alignment-dependent vector paths): allow a few roundings of the dtype. An encoder with
# other weights (the negative control) misses by order 1.
def _bound(dtype: torch.dtype) -> float:
    return 4 * UNIT_ROUNDOFF[dtype] if dtype != torch.float32 else 1e-5


@pytest.mark.numerics
@pytest.mark.parametrize("streamed_from", [0, 1])
def test_streamed_prompt_encoder_gives_the_resident_encoders_conditioning(streamed_from):
    resident, offloaded = _encoders(streamed_from)
    assert offloaded.offload and not resident.offload
    other = Qwen3VLPromptEncoder(
        load_tokenizer(None), MiniMaxH3TextEncoder.random(tiny_text_config(hidden_size=64), num_layers=2, seed=4)
    )
    for prompt in ("a red fox in snow", "waves on a pebble beach at night"):
        expected = resident(prompt, torch.device("cpu"))
        got = offloaded(prompt, torch.device("cpu"))
        assert relative_error(got, expected) <= _bound(got.dtype)
        assert relative_error(other(prompt, torch.device("cpu")), expected) > 1e3 * _bound(got.dtype)
    assert all(p.device.type == "cpu" for p in offloaded.encoder.parameters())


def test_a_prompt_that_fails_half_way_leaves_every_layer_on_its_host_copy():
    _, offloaded = _encoders(0)
    layers = offloaded.encoder.model.layers
    host = [p.data_ptr() for p in layers.parameters()]
    handle = layers[1].register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        offloaded("a red fox in snow", torch.device("cpu"))
    handle.remove()
    assert [p.data_ptr() for p in layers.parameters()] == host  # the host tensors themselves, not copies
    assert offloaded("a red fox in snow", torch.device("cpu")).shape[-1] == 64  # and it encodes again


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
    torch.testing.assert_close(
        out,
        (x - torch.arange(4.0)) / torch.sqrt(torch.ones(4) + module.eps) * module.weight.detach()
        + module.bias.detach(),
    )


@needs_gpu
def test_streamed_encoder_holds_at_most_two_layers_on_the_gpu_while_it_encodes():
    device = torch.device("cuda")
    config = tiny_text_config(hidden_size=256, num_layers=4)
    resident = Qwen3VLPromptEncoder(
        load_tokenizer(None),
        MiniMaxH3TextEncoder.random(config, num_layers=4, seed=1, device=device, dtype=torch.bfloat16),
    )
    offloaded = Qwen3VLPromptEncoder(
        load_tokenizer(None),
        MiniMaxH3TextEncoder.random(config, num_layers=4, seed=1, device=device, dtype=torch.bfloat16, host_from=0),
        streamed_from=0,
        device=device,
    )
    layers = offloaded.encoder.model.layers
    params = list(layers.parameters()) + [offloaded.encoder.model.embed_tokens.weight]
    assert all(p.device.type == "cpu" and p.is_pinned() for p in params)
    layer_bytes = sum(p.numel() * p.element_size() for p in layers[0].parameters())

    prompt = "a lighthouse in a storm, waves breaking"
    expected = resident(prompt, device)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = offloaded(prompt, device)
    torch.cuda.synchronize()
    assert got.device.type == "cuda"
    assert relative_error(got, expected) <= _bound(got.dtype)
    peak = torch.cuda.max_memory_allocated() - before
    assert 2 * layer_bytes <= peak < 3 * layer_bytes + (1 << 20)  # two slots of layers visited, never three
    output_bytes = got.numel() * got.element_size()
    assert torch.cuda.memory_allocated() - before <= output_bytes + 4096  # and left it: only the output stays
    assert all(p.device.type == "cpu" and p.is_pinned() for p in params)
