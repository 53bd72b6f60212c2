"""The shapes each model's spec asks the tools to run its example at (`ModelSpec.example_shapes`): declared as data in
the spec, they must say what their comments say. MiniMax H3's official shape is the release's 768p 5 s call, Wan 2.2's
are the releases' canvases, LingBot-World v2's read a window that has rolled. The spec's own checks: a shape names a
size the spec has, `config_of(layers=)` cuts only the block count, and only a plan with TP says it takes TP."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from telefuser.models import registry
from telefuser.models.spec import ModelSpec, resolve
from telefuser.pipelines.minimax_h3.shapes import plan_shape


def test_minimax_h3s_official_shape_is_the_releases_768p_5_second_call():
    shape = registry.get_spec("minimax_h3").example_shape("official")
    plan = plan_shape(duration_s=5.0, resolution=768, aspect_ratio="16:9")
    _, _, frames, height, width = plan.video_latent_shape
    assert (shape["frames"], shape["height"], shape["width"]) == (frames, height, width)
    assert shape["audio_rows"] == plan.audio_latent_shape[2]


@pytest.mark.parametrize("variant", ["t2v-a14b", "ti2v-5b"])
def test_wan22s_official_shapes_are_the_releases_canvases(variant):
    from telefuser.models.wan2_2.config import release

    shipped = release(variant)
    shape = registry.get_spec(f"wan2.2-{variant}").example_shape("official")
    width, height = shipped.size
    expected = {"frames": (shipped.frames - 1) // 4 + 1, "height": height // shipped.vae_scale}
    assert shape == {**expected, "width": width // shipped.vae_scale}
    assert registry.get_spec(f"wan2.2-{variant}").example_shape("tiny") == {}  # the example's own defaults


@pytest.mark.parametrize("size", ["tiny", "official"])
def test_lingbots_shapes_read_a_window_that_has_rolled(size):
    spec = registry.get_spec("lingbot_world_v2")
    shape, config = spec.example_shape(size), spec.config_of(size)
    frames = shape.get("frames", inspect.signature(resolve(spec.example)).parameters["frames"].default)
    committed = shape["history_chunks"] * frames
    assert committed > config.local_attn_size  # the history alone rolls the window past its sink
    assert frames <= config.local_attn_size - config.sink_size  # a chunk the window takes
    if size == "official":
        assert (shape["height"], shape["width"]) == (480 // 8, 832 // 8)  # 832x480 through the Wan 2.1 VAE


def test_a_spec_checks_its_shapes_sizes_and_layers():
    spec = registry.get_spec("minimax_h3")
    with pytest.raises(ValueError, match="minimax_h3 has no DiT size 'huge'"):
        spec.example_shape("huge")
    with pytest.raises(ValueError, match="example_shapes name sizes"):
        ModelSpec(**{**_fields(spec), "example_shapes": {"huge": {"batch": 1}}})
    official, few = spec.config_of("official"), spec.config_of("official", layers=3)
    assert spec.num_layers(few) == 3 and spec.num_layers(official) > 3
    assert spec.num_heads(few) == spec.num_heads(official)
    shape = spec.example_shape("tiny")
    shape["batch"] = 99  # a copy: the spec's shapes stay as declared
    assert spec.example_shape("tiny") == {"batch": 2}
    assert [name for name in registry.names() if registry.get_spec(name).tensor_parallel] == ["minimax_h3"]


def _fields(spec: ModelSpec) -> dict:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
