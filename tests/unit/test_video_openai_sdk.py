"""`telefuser serve` driven by the official `openai` package: every size in the SDK's typed list is made, by the
model's grid and a resize where needed (video_canvas.py), and the MP4 has exactly the size asked for; an
`input_reference` upload is the first keyframe of an FL2VA job, and `extra_body` carries the service's own fields."""

from __future__ import annotations

import json
import typing
import warnings

import numpy as np
import pytest

from telefuser.media import probe_media
from telefuser.serving.common.auth import ApiKeys
from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.canvas import RESIZE_METHOD, fit_frames, generation_canvas
from telefuser.serving.video.fake import FakeVideoRunner

openai = pytest.importorskip("openai", reason="the openai package is in the dev extra")
KEY = "sdk-test-key"


def sdk_sizes() -> list[str]:
    from openai.types.video_size import VideoSize

    return list(typing.get_args(VideoSize))


def test_the_sdk_sizes_map_to_the_grid_canvas_of_nearest_aspect():
    assert sorted(sdk_sizes()) == ["1024x1792", "1280x720", "1792x1024", "720x1280"]
    assert generation_canvas(1280, 720, 32) == (1312, 736) and generation_canvas(720, 1280, 32) == (736, 1312)
    assert generation_canvas(1792, 1024, 32) == (1792, 1024) and generation_canvas(1024, 1792, 32) == (1024, 1792)
    assert generation_canvas(96, 54, 32) == (128, 64)  # aspect 2.0 is the nearest of 3.0, 1.5, 2.0, 4.0 to 1.78


def test_fit_frames_is_a_centre_crop_when_only_rows_are_extra():
    rng = np.random.default_rng(7)
    frames = rng.integers(0, 256, (3, 736, 1280, 3), dtype=np.uint8)
    assert np.array_equal(fit_frames(frames, 1280, 720), frames[:, 8:728])  # data movement: exact
    assert fit_frames(frames, 1280, 736) is frames
    scaled = fit_frames(rng.integers(0, 256, (2, 736, 1312, 3), dtype=np.uint8), 1280, 720)
    assert scaled.shape == (2, 720, 1280, 3) and scaled.dtype == np.uint8


def test_openai_sdk_creates_polls_and_downloads_every_typed_size(tmp_path):
    runner = FakeVideoRunner(step_delay_s=0.0, defaults={"seconds": 0.2, "steps": 3})
    app = create_video_app(runner, output_dir=tmp_path / "out", api_keys=ApiKeys([KEY]))
    with serve_in_thread(app) as base, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK marks its video methods deprecated
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        for size in sdk_sizes():
            video = client.videos.create_and_poll(prompt=f"a lighthouse at {size}", size=size, poll_interval_ms=20)
            assert video.status == "completed" and video.size == size, video
            job = video.model_dump()
            width, height = (int(v) for v in size.split("x"))
            canvas = generation_canvas(width, height, 32)
            assert job["generated_size"] == f"{canvas[0]}x{canvas[1]}"
            assert job["resize"] == (RESIZE_METHOD if canvas != (width, height) else None)
            path = tmp_path / f"{size}.mp4"
            client.videos.download_content(video.id).write_to_file(path)
            info = probe_media(path)
            assert (info.width, info.height, info.video_frames) == (width, height, job["frames"]), (size, info)
            assert info.has_audio and info.sample_rate == 32_000


def test_openai_sdk_input_reference_and_extra_body_run_an_fl2va_job_with_a_lora(tmp_path):
    """`client.videos.create(..., input_reference=open("a.png", "rb"), extra_body={...})` as a user writes it: the
    upload is the first keyframe, `extra_body` carries the service's own fields (as form fields: `last_frame` a data
    URL, `lora` a list of objects, which the SDK spells `lora[][name]` / `lora[][scale]`)."""
    from telefuser.serving.video.minimax import build_minimax_runner
    from tests.video_media import data_url, png, write_tiny_lora
    from tests.video_runner_args import tiny_runner_args

    loras = tmp_path / "loras"
    loras.mkdir()
    write_tiny_lora(loras / "style.safetensors", seed=1)
    first = tmp_path / "first.png"
    first.write_bytes(png(64, 32))
    runner = build_minimax_runner(tiny_runner_args(lora_dir=loras))
    app = create_video_app(runner, output_dir=tmp_path / "out", api_keys=ApiKeys([KEY]))
    try:
        with serve_in_thread(app) as base, warnings.catch_warnings(), first.open("rb") as upload:
            warnings.simplefilter("ignore", DeprecationWarning)
            client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
            video = client.videos.create_and_poll(
                prompt="a lighthouse at dusk",
                input_reference=upload,
                size="64x32",  # type: ignore[arg-type]  (the SDK's list is Sora's; any size on the grid is made)
                seconds="0.2",  # type: ignore[arg-type]
                extra_body={
                    "num_inference_steps": 3,
                    "last_frame": data_url(png(64, 32, (10, 200, 10))),
                    "lora": [{"name": "style", "scale": 0.5}],
                },
                poll_interval_ms=50,
            )
            assert video.status == "completed", video
            job = video.model_dump()
            assert job["task"] == "fl2va" and [m["role"] for m in job["inputs"]] == ["first_frame", "last_frame"]
            assert job["loras"] == [{"name": "style", "scale": 0.5}]
    finally:
        runner.close()
    record = json.loads((tmp_path / "out" / f"{video.id}.json").read_text())
    assert record["job_request"]["task"] == "fl2va" and record["request"]["input_reference"]["file"] == "first.png"
    assert record["result"]["metrics"]["request"]["conditions"] == {"first": [64, 32], "last": [64, 32]}
    assert record["result"]["metrics"]["loras"]["applied"] == [{"name": "style", "scale": 0.5}]
    assert (tmp_path / "out" / f"{video.id}.json").stat().st_size < 20_000  # summaries, not the images
