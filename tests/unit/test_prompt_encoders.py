"""Every pipeline's text side is a `PromptEncoder` (models/protocols.py): the Wan family's umT5 and MiniMax H3's
Qwen3-VL, built by each registered model's tiny pipeline, take a prompt and give ``[1, L, hidden_size]`` rows that
depend on the prompt."""

from __future__ import annotations

import pytest
import torch

from telefuser.models.protocols import PromptEncoder
from telefuser.runtime import Runtime


def _tiny_pipeline(name: str):
    runtime = Runtime.one_rank("cpu", torch.float32)
    if name == "minimax_h3":
        from telefuser.pipelines.minimax_h3.loading import build_minimax_h3_pipeline

        return build_minimax_h3_pipeline(config="tiny", runtime=runtime, show_progress=False)
    if name == "lingbot_world_v2":
        from telefuser.pipelines.lingbot_world_v2.loading import build_lingbot_pipeline

        return build_lingbot_pipeline(config="tiny", runtime=runtime)
    from telefuser.pipelines.wan2_2.loading import build_wan22_pipeline

    return build_wan22_pipeline(variant=name.removeprefix("wan2.2-"), config="tiny", runtime=runtime)


@pytest.mark.parametrize("name", ["minimax_h3", "lingbot_world_v2", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"])
def test_each_pipeline_encodes_prompts_through_the_protocol(name):
    encoder = _tiny_pipeline(name).prompt_encoder
    assert isinstance(encoder, PromptEncoder), type(encoder).__name__
    fox, crow = encoder("a red fox", "cpu"), encoder("a black crow", "cpu")
    assert fox.shape[0] == 1 and fox.shape[-1] == encoder.hidden_size and fox.std() > 0
    assert not torch.equal(fox, crow)


def test_the_protocol_refuses_what_is_not_an_encoder():
    class NoWidth:
        def __call__(self, prompt, device):
            return torch.ones(1, 1, 1)

    assert not isinstance(NoWidth(), PromptEncoder)
