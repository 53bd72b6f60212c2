"""`telefuser serve` driven by the official `openai` package: every size in the SDK's typed list is made, by the
model's grid and a resize where needed (video_canvas.py), and the MP4 has exactly the size asked for."""

from __future__ import annotations

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
