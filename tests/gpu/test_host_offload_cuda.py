"""The offloaded MiniMax H3 prompt encoder on a GPU: weights pinned in host memory, the same conditioning as a
resident encoder, and the device copies freed after each prompt (the DiT gets that memory back)."""

from __future__ import annotations

import torch

from telefuser.pipelines.minimax_h3.text_encoder import MiniMaxH3TextEncoder, PromptEncoder, tiny_text_config
from telefuser.pipelines.minimax_h3.tokenizer import load_tokenizer


def test_offloaded_encoder_lends_the_gpu_its_weights_only_while_it_encodes():
    device = torch.device("cuda")
    config = tiny_text_config(hidden_size=256, num_layers=4)
    resident = PromptEncoder(load_tokenizer(None), MiniMaxH3TextEncoder.random(
        config, num_layers=4, seed=1, device=device, dtype=torch.bfloat16))
    offloaded = PromptEncoder(load_tokenizer(None), MiniMaxH3TextEncoder.random(
        config, num_layers=4, seed=1, device=device, dtype=torch.bfloat16), offload=True)
    params = list(offloaded.encoder.parameters())
    assert all(p.device.type == "cpu" and p.is_pinned() for p in params)
    weight_bytes = sum(p.numel() * p.element_size() for p in params)

    prompt = "a lighthouse in a storm, waves breaking"
    expected = resident(prompt, device)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    got = offloaded(prompt, device)
    torch.cuda.synchronize()
    assert got.device.type == "cuda" and got.abs().max() > 0
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert torch.cuda.max_memory_allocated() - before >= weight_bytes  # the weights did visit the GPU
    output_bytes = got.numel() * got.element_size()
    assert torch.cuda.memory_allocated() - before <= output_bytes + 4096  # and left it: only the output stays
    assert all(p.device.type == "cpu" and p.is_pinned() for p in offloaded.encoder.parameters())
