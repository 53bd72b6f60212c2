"""`telefuser serve --model wan2.2-t2v-a14b | wan2.2-ti2v-5b`: Wan 2.2 (text to video, no audio, with classifier-free
guidance; TI2V-5B also from a first frame, `input_reference`) through the real /v1/videos app on the CPU, tiny random
weights.

The MP4 has a video stream and no audio stream, the job object has no `audio`, `guidance_scale` and
`negative_prompt` reach the pipeline (a recording wrapper around it, and the DiT's batch: 2 rows when guided), a
TI2V-5B first frame reaches it and is the clip's first latent frame, bad values are 422s with a reason (naming the
field), and the OpenAI SDK's `create_and_poll` works against it (with an `input_reference` upload for TI2V-5B).
"""

from __future__ import annotations

import io
import json
import signal
import warnings

import av
import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from telefuser import cli
from telefuser.media import probe_media
from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.canvas import fit_frames
from tools.harness.server_process import ServerProcess
from tests.unit.test_video_service import poll, post_form
from tests.video_media import data_url
from tests.video_runner_args import tiny_runner_args

A14B, TI2V = "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"
# H.264 (crf 18, 4:2:0) on the tiny model's noise-like frames: the decoded MP4's luma is within this mean absolute
# error of the pipeline's frames' (measured 2.8 to 3.0 on both variants; the frames shifted by one or mirrored: 19 to
# 24). Chroma is compared not at all: 4:2:0 halves it, which on noise costs 14 to 20 per RGB channel.
LUMA_MEAN_ABS_ERROR = 6.0
BT601 = np.array([0.299, 0.587, 0.114], np.float32)


class RecordingPipeline:
    """The real `Wan22Pipeline`, with every call's keywords, frames, the prompts its text encoder read and the batch
    of each DiT call recorded."""

    def __init__(self, pipe):
        self._pipe = pipe
        self.calls: list[dict] = []
        self.frames: list[np.ndarray] = []
        self.latents: list = []
        self.texts: list[str] = []
        self.dit_batches: list[int] = []
        encode = pipe.prompt_encoder

        def recording_encode(text, *args, **kwargs):
            self.texts.append(text)
            return encode(text, *args, **kwargs)

        pipe.prompt_encoder = recording_encode
        for expert in pipe.experts:
            expert.register_forward_hook(lambda module, inputs, output: self.dit_batches.append(inputs[0].shape[0]))

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def __call__(self, prompt, **kwargs):
        self.calls.append({"prompt": prompt, **kwargs})
        video = self._pipe(prompt, **kwargs)
        self.frames.append(video.frames)
        self.latents.append(video.latents)
        return video

    def clear(self) -> None:
        self.calls.clear(), self.frames.clear(), self.latents.clear(), self.texts.clear(), self.dit_batches.clear()


def wan_args(model: str, **overrides):
    return tiny_runner_args(model=model, served_model_name=model, attn_impl="sdpa", steps_default=None, **overrides)


@pytest.fixture(scope="module")
def a14b():
    """The T2V-A14B runner `telefuser serve --model wan2.2-t2v-a14b --config tiny` builds, its pipeline recorded."""
    from telefuser.serving.video.wan2_2 import build_wan22_runner

    runner = build_wan22_runner(wan_args(A14B))
    runner._pipe = RecordingPipeline(runner._pipe)
    yield runner
    runner.close()


@pytest.fixture
def client(a14b, tmp_path):
    a14b._pipe.clear()
    with TestClient(create_video_app(a14b, output_dir=tmp_path)) as c:
        yield c


def decoded_frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        assert len(container.streams.video) == 1 and len(container.streams.audio) == 0, container.streams
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def luma_error(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of the two clips' BT.601 luma."""
    return float(np.abs(a.astype(np.float32) @ BT601 - b.astype(np.float32) @ BT601).mean())


# -- the job, end to end --------------------------------------------------------------------------------------------


def test_a_wan_job_makes_an_mp4_with_video_and_no_audio(client, a14b, tmp_path):
    fields = {"prompt": "a red fox trots across snow", "model": A14B, "size": "64x32", "seconds": "0.5",
              "num_inference_steps": "3", "seed": "7"}  # fmt: skip
    r = post_form(client, fields)  # multipart, as AIPerf sends it
    assert r.status_code == 200, r.text
    created = r.json()
    # 0.5 s at 16 fps is 8 frames, snapped up to the 4n+1 grid: 9
    assert (created["fps"], created["frames"], created["dit_calls"], created["size"]) == (16, 9, 3, "64x32")
    done = poll(client, created["id"], timeout=60)
    assert done["status"] == "completed", done
    assert "audio" not in done and done["duration_s"] == pytest.approx(9 / 16) and done["dit_calls"] == 3
    assert "guidance_scale" not in done and "negative_prompt" not in done  # not sent: the release's
    content = client.get(f"/v1/videos/{created['id']}/content")
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"

    clip = tmp_path / "downloaded.mp4"
    clip.write_bytes(content.content)
    info = probe_media(clip)
    assert (info.video_codec, info.video_frames, info.width, info.height, info.fps) == ("h264", 9, 64, 32, 16.0)
    assert not info.has_audio and info.audio_samples == 0
    made = a14b._pipe.frames[-1]
    assert made.shape == (9, 32, 64, 3) and made.std() > 5  # not a flat picture
    assert luma_error(decoded_frames(clip), made) < LUMA_MEAN_ABS_ERROR  # the pipeline's frames, through H.264

    call = a14b._pipe.calls[-1]
    assert (call["width"], call["height"], call["num_frames"], call["steps"], call["seed"]) == (64, 32, 9, 3, 7)
    assert call["guidance_scale"] is None and call["guidance_scale_2"] is None and call["negative_prompt"] == ""
    record = json.loads((tmp_path / f"{created['id']}.json").read_text())
    result = record["result"]
    assert (result["audio_channels"], result["audio_samples"], result["sample_rate"]) == (None, None, None)
    assert result["metrics"]["guidance_scale"] == [4.0, 3.0]  # T2V-A14B's (high-noise, low-noise) experts
    assert "guidance_scale" not in record["job_request"] and "negative_prompt" not in record["job_request"]


def test_metadata_says_the_model_makes_no_audio_and_takes_guidance(client):
    meta = client.get("/v1/service/metadata").json()
    model = meta["model"]
    assert model["audio"] is False and "sample_rate" not in model and "audio_channels" not in model
    assert model["guidance"] is True and model["guidance_scale"]["default"] == [4.0, 3.0]
    assert (model["fps"], model["size_multiple"], model["native_size"], model["experts"]) == (16, 16, "1280x720", 2)
    assert "random" in model["weights"] and model["defaults"]["size"] == "64x32" and model["defaults"]["steps"] == 4
    # the runner estimates each job's memory (pipelines/wan2_2/loading.py's workload): the limit is the device's budget
    assert meta["limits"]["fps"] == 16 and meta["limits"]["max_job_memory_bytes"] > 0
    assert model["offload"] == "none" and model["memory_plan"].startswith("--offload none: peak")


def test_guidance_scale_and_negative_prompt_reach_the_pipeline(client, a14b):
    pipe = a14b._pipe
    r = client.post(
        "/v1/videos",
        json={
            "prompt": "a lighthouse at dusk",
            "size": "32x32",
            "seconds": 0.25,
            "steps": 2,
            "guidance_scale": 5.5,
            "negative_prompt": "blurry, low quality",
        },  # fmt: skip
    )
    assert r.status_code == 200, r.text
    assert r.json()["guidance_scale"] == 5.5 and r.json()["negative_prompt"] == "blurry, low quality"
    done = poll(client, r.json()["id"], timeout=60)
    assert done["status"] == "completed" and "audio" not in done, done
    call = pipe.calls[-1]
    assert (call["guidance_scale"], call["guidance_scale_2"]) == (5.5, 5.5)  # both experts, as diffusers defaults
    assert call["negative_prompt"] == "blurry, low quality" and call["prompt"] == "a lighthouse at dusk"
    assert pipe.texts == ["a lighthouse at dusk", "blurry, low quality"]  # the negative prompt was encoded
    assert pipe.dit_batches == [2, 2]  # guided: conditional and unconditional rows in each of the 2 DiT calls

    pipe.clear()  # guidance 1.0: no unconditional pass, one row per DiT call
    r = client.post("/v1/videos", json={"prompt": "a lighthouse", "size": "32x32", "seconds": 0.25, "steps": 2,
                                        "guidance_scale": "1"})  # fmt: skip
    done = poll(client, r.json()["id"], timeout=60)
    assert done["status"] == "completed" and done["guidance_scale"] == 1.0, done
    assert (pipe.calls[-1]["guidance_scale"], pipe.dit_batches) == (1.0, [1, 1])


def test_guidance_scale_2_sets_the_low_noise_experts_scale(client, a14b, tmp_path):
    pipe = a14b._pipe
    base = {"prompt": "a lighthouse at dusk", "size": "32x32", "seconds": 0.25, "steps": 2}
    for given, want in (
        ({"guidance_scale": 5.5, "guidance_scale_2": 2.0}, (5.5, 2.0)),
        ({"guidance_scale_2": 2.5}, (None, 2.5)),  # the high-noise expert keeps the release's 4.0
    ):
        r = client.post("/v1/videos", json={**base, **given})
        assert r.status_code == 200, r.text
        assert {k: r.json()[k] for k in given} == given and ("guidance_scale" in r.json()) == (
            "guidance_scale" in given
        )
        done = poll(client, r.json()["id"], timeout=60)
        assert done["status"] == "completed", done
        call = pipe.calls[-1]
        assert (call["guidance_scale"], call["guidance_scale_2"]) == want
        ran = [4.0 if want[0] is None else want[0], want[1]]
        record = json.loads((tmp_path / f"{done['id']}.json").read_text())
        assert (
            record["result"]["metrics"]["guidance_scale"] == ran
            and record["job_request"]["guidance_scale_2"] == want[1]
        )


def test_guidance_scale_2_needs_a_second_expert_and_guidance():
    from telefuser.serving.common.http_errors import RequestError
    from telefuser.serving.video.request import VideoPolicy, parse_video_request

    body = json.dumps({"prompt": "p", "guidance_scale_2": 3.0}).encode()
    for policy, message in (
        (VideoPolicy(model=TI2V, max_seconds=10, guidance=True), "'guidance_scale_2' is the second expert's scale"),
        (VideoPolicy(model="minimax_h3", max_seconds=10), "'guidance_scale_2' cannot be honoured"),
    ):
        with pytest.raises(RequestError, match=message) as refused:
            parse_video_request("application/json", body, policy)
        assert refused.value.status == 422
    two = VideoPolicy(model=A14B, max_seconds=10, guidance=True, experts=2)
    job_request = parse_video_request("application/json", body, two).job_request
    assert (job_request.guidance_scale, job_request.guidance_scale_2) == (None, 3.0)
    assert "guidance_scale" not in job_request.as_dict() and job_request.as_dict()["guidance_scale_2"] == 3.0


BAD_GUIDANCE = [
    ({"guidance_scale": 0.5}, "'guidance_scale' must be between 1 and 20 (1: no classifier-free guidance), got 0.5"),
    ({"guidance_scale": 25}, "'guidance_scale' must be between 1 and 20"),
    ({"guidance_scale": "high"}, "'guidance_scale' must be a number, got 'high'"),
    ({"guidance_scale": 1.0, "negative_prompt": "fog"}, "'negative_prompt' has no effect at guidance_scale 1"),
    ({"guidance_scale": 1.0, "guidance_scale_2": 3}, "'guidance_scale_2' has no effect at guidance_scale 1"),
    ({"guidance_scale_2": 30}, "'guidance_scale_2' must be between 1 and 20"),
    ({"fps": 24}, "'fps' must be 16 (the model's fixed frame rate)"),
    ({"size": "72x40"}, None),  # off the 16 grid: accepted, generated at 80x48 and resized (below)
    ({"resolution": 40}, "'resolution' 40 must be a positive multiple of 16"),
    ({"num_frames": 8}, "'num_frames' 8 is not a frame count this model makes"),
    ({"steps": 1}, "'steps' must be at least 2 (num_inference_steps = N UniPC steps -> N DiT calls"),
    ({"input_reference": "data:image/png;base64,iVBORw0KGgo="}, "this server's model takes text only"),
    ({"lora": "style"}, "this server takes no LoRAs"),
    ({"preset": "turbo-4"}, "unknown preset 'turbo-4'; presets: none (this model has no presets)"),
]


@pytest.mark.parametrize("fields,message", BAD_GUIDANCE, ids=[str(i) for i in range(len(BAD_GUIDANCE))])
def test_bad_values_are_refused_with_a_reason(client, fields, message):
    body = {"prompt": "p", "seconds": 0.25, "steps": 2, **fields}
    for r in (client.post("/v1/videos", json=body), post_form(client, body)):
        if message is None:
            assert r.status_code == 200 and r.json()["generated_size"] == "80x48" and r.json()["size"] == "72x40"
            continue
        assert r.status_code == 422, (r.status_code, r.text)
        assert message in r.json()["detail"], r.json()
    if {"guidance_scale", "guidance_scale_2"} & set(fields) and fields.get("guidance_scale") != "high":
        param = next(p for p in ("negative_prompt", "guidance_scale_2", "guidance_scale") if p in fields)
        assert r.json()["error"]["param"] == param


def test_the_openai_sdk_creates_polls_and_downloads(a14b, tmp_path):
    openai = pytest.importorskip("openai", reason="the openai package is in the dev extra")
    a14b._pipe.clear()
    app = create_video_app(a14b, output_dir=tmp_path / "out")
    with serve_in_thread(app) as base, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK marks its video methods deprecated
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        video = client.videos.create_and_poll(
            model=A14B,
            prompt="waves on a rocky shore",
            size="64x32",  # type: ignore[arg-type]  (the SDK's list is Sora's; any size on the grid is made)
            seconds="0.5",  # type: ignore[arg-type]
            extra_body={"num_inference_steps": 2, "guidance_scale": 3.5, "negative_prompt": "static"},
            poll_interval_ms=50,
        )
        assert video.status == "completed" and video.size == "64x32", video
        job = video.model_dump()
        assert "audio" not in job and job["guidance_scale"] == 3.5 and job["frames"] == 9
        path = tmp_path / "sdk.mp4"
        client.videos.download_content(video.id).write_to_file(path)
        with pytest.raises(openai.UnprocessableEntityError, match="guidance_scale"):
            client.videos.create(prompt="p", extra_body={"guidance_scale": -2})
    info = probe_media(path)
    assert (info.video_frames, info.width, info.height) == (9, 64, 32) and not info.has_audio
    assert (a14b._pipe.calls[-1]["guidance_scale"], a14b._pipe.calls[-1]["negative_prompt"]) == (3.5, "static")


# -- TI2V-5B, its warm-up, and the command line ---------------------------------------------------------------------


def test_ti2v_5b_warms_up_then_serves_a_resized_clip_without_audio(tmp_path, monkeypatch):
    """The 5B variant: 24 fps, a 32-pixel grid (64x48 is generated at 96x64, then resized), one DiT; `--warmup on`
    runs one discarded one-step request at the default canvas first."""
    from telefuser.pipelines.wan2_2.pipeline import Wan22Pipeline
    from telefuser.serving.video.wan2_2 import build_wan22_runner

    calls, frames = [], []
    real_call = Wan22Pipeline.__call__

    def recording_call(self, prompt, **kwargs):
        calls.append({"prompt": prompt, **kwargs})
        video = real_call(self, prompt, **kwargs)
        frames.append(video.frames)
        return video

    monkeypatch.setattr(Wan22Pipeline, "__call__", recording_call)
    runner = build_wan22_runner(wan_args(TI2V, warmup="on"))
    try:
        assert [(c["prompt"], c["steps"], c["width"], c["height"], c["num_frames"]) for c in calls] == [
            ("warm-up", 1, 128, 64, 9)  # the tiny release's canvas and 9 frames (0.375 s at 24 fps)
        ]
        assert runner.metadata["warmup_s"] > 0 and runner.metadata["guidance_scale"]["default"] == [5.0, 5.0]
        with TestClient(create_video_app(runner, output_dir=tmp_path)) as client:
            r = client.post("/v1/videos", json={"prompt": "a kite", "model": "WAN2.2-TI2V-5B", "size": "64x48",
                                                "seconds": 0.2, "steps": 2, "negative_prompt": "rain"})  # fmt: skip
            assert r.status_code == 200, r.text
            assert (r.json()["generated_size"], r.json()["fps"], r.json()["frames"]) == ("96x64", 24, 5)
            done = poll(client, r.json()["id"], timeout=60)
            assert done["status"] == "completed" and "audio" not in done and done["size"] == "64x48", done
            clip = tmp_path / "5b.mp4"
            clip.write_bytes(client.get(f"/v1/videos/{done['id']}/content").content)
    finally:
        runner.close()
    assert calls[-1]["guidance_scale"] is None and calls[-1]["negative_prompt"] == "rain"
    made = frames[-1]
    assert made.shape == (5, 64, 96, 3) and made.std() > 5
    assert luma_error(decoded_frames(clip), fit_frames(made, 64, 48)) < LUMA_MEAN_ABS_ERROR


# -- TI2V-5B's first frame (input_reference) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ti2v():
    """The TI2V-5B runner `telefuser serve --model wan2.2-ti2v-5b --config tiny` builds, its pipeline recorded."""
    from telefuser.serving.video.wan2_2 import build_wan22_runner

    runner = build_wan22_runner(wan_args(TI2V))
    runner._pipe = RecordingPipeline(runner._pipe)
    yield runner
    runner.close()


@pytest.fixture
def ti2v_client(ti2v, tmp_path):
    ti2v._pipe.clear()
    with TestClient(create_video_app(ti2v, output_dir=tmp_path)) as c:
        yield c


def first_frame_png(width: int = 96, height: int = 64) -> bytes:
    """A noise picture (every pixel random, so a wrong resize or a missed condition shows)."""
    buffer = io.BytesIO()
    pixels = np.random.default_rng(4).integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def the_condition(pipe, image, width: int, height: int):
    """The latent frame `image` makes on a `width` x `height` canvas, as the pipeline encodes it."""
    from telefuser.pipelines.wan2_2.pipeline import image_pixels

    return pipe.encode_image(image_pixels(image, width, height))


def test_a_ti2v_job_starts_from_the_uploaded_first_frame(ti2v_client, ti2v, tmp_path):
    """A file part (as the OpenAI SDK uploads `input_reference`) with an explicit size: the image is stretched onto
    the canvas and its latent frame is the clip's first."""
    pipe, picture = ti2v._pipe, first_frame_png(80, 48)
    r = ti2v_client.post(
        "/v1/videos",
        data={"prompt": "the kite climbs", "size": "64x64", "seconds": "0.2", "steps": "2"},
        files={"input_reference": ("first.png", picture, "image/png")},
    )
    assert r.status_code == 200, r.text
    assert r.json()["task"] == "fl2va" and r.json()["inputs"][0]["role"] == "first_frame"
    done = poll(ti2v_client, r.json()["id"], timeout=60)
    assert done["status"] == "completed" and "audio" not in done and done["size"] == "64x64", done
    image = pipe.calls[-1]["image"]
    assert image.mode == "RGB" and image.size == (80, 48)
    assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(picture)).convert("RGB")))
    assert torch.equal(pipe.latents[-1][:, :, :1], the_condition(pipe, image, 64, 64))
    record = json.loads((tmp_path / f"{done['id']}.json").read_text())
    assert record["request"]["input_reference"]["file"] == "first.png" and record["result"]["metrics"]["image"]


def test_without_a_size_a_ti2v_job_takes_the_first_frames_aspect_ratio(ti2v_client, ti2v):
    """A data URL in JSON, no size: the keyframe's aspect ratio at the default size's short edge (64: 96x64 for a
    3:2 picture), as for MiniMax H3's keyframes."""
    r = ti2v_client.post("/v1/videos", json={"prompt": "a kite", "seconds": 0.2, "steps": 2,
                                             "input_reference": data_url(first_frame_png(96, 64))})  # fmt: skip
    assert r.status_code == 200, r.text
    assert (r.json()["size"], r.json()["generated_size"]) == ("96x64", "96x64")
    done = poll(ti2v_client, r.json()["id"], timeout=60)
    assert done["status"] == "completed", done
    call = ti2v._pipe.calls[-1]
    assert (call["width"], call["height"]) == (96, 64) and call["image"].size == (96, 64)
    assert torch.equal(ti2v._pipe.latents[-1][:, :, :1], the_condition(ti2v._pipe, call["image"], 96, 64))


def test_a_text_only_ti2v_job_passes_no_image(ti2v_client, ti2v):
    r = ti2v_client.post("/v1/videos", json={"prompt": "a kite", "size": "64x64", "seconds": 0.2, "steps": 2})
    assert poll(ti2v_client, r.json()["id"], timeout=60)["status"] == "completed"
    assert ti2v._pipe.calls[-1]["image"] is None and r.json()["task"] == "t2va"


def test_what_wan_cannot_use_is_refused_naming_the_field(ti2v_client, client):
    corrupt = first_frame_png()[:80]  # a PNG header and a cut-off image
    text_only = "this server's model takes text only; a fl2va request (keyframes) cannot run"
    for http, fields, param, message in (
        (client, {"input_reference": data_url(first_frame_png())}, "input_reference", f"'input_reference': {text_only}"),
        (ti2v_client, {"input_reference": data_url(corrupt)}, "input_reference",
         "'input_reference' could not be decoded as a PNG image"),
        (ti2v_client, {"input_reference": data_url(b"GIF89a" + bytes(40), "image/gif")}, "input_reference",
         "'input_reference' must be a PNG, JPEG or WebP image"),
        (ti2v_client, {"last_frame": data_url(first_frame_png())}, "last_frame",
         "'last_frame': Wan 2.2 TI2V-5B takes one image, the first frame ('input_reference')"),
        (ti2v_client, {"references": [data_url(first_frame_png())]}, "references",
         "'references': this server's model takes t2va (text only), fl2va (keyframes); a ref2va request"),
        (ti2v_client, {"input_reference": data_url(first_frame_png(300, 64))}, None,
         "the keyframe's aspect ratio 300:64 is outside 1:4 .. 4:1, where a canvas is derived from it; give 'size'"),
    ):  # fmt: skip
        r = http.post("/v1/videos", json={"prompt": "p", "seconds": 0.25, "steps": 2, **fields})
        assert r.status_code == 422, (r.status_code, r.text)
        assert message in r.json()["detail"] and r.json()["error"]["param"] == param, r.json()


def test_the_ti2v_metadata_says_it_takes_a_first_frame(ti2v_client, client):
    model = ti2v_client.get("/v1/service/metadata").json()["model"]
    assert model["tasks"] == ["t2va", "fl2va"] and model["image_condition"].startswith("'input_reference'")
    assert "(+ first frame)" in model["runner"]
    a14b = client.get("/v1/service/metadata").json()["model"]
    assert a14b["tasks"] == ["t2va"] and "image_condition" not in a14b


def test_the_openai_sdk_uploads_a_first_frame_for_ti2v(ti2v, tmp_path):
    openai = pytest.importorskip("openai", reason="the openai package is in the dev extra")
    ti2v._pipe.clear()
    first = tmp_path / "first.png"
    first.write_bytes(first_frame_png(64, 64))
    app = create_video_app(ti2v, output_dir=tmp_path / "out")
    with serve_in_thread(app) as base, warnings.catch_warnings(), first.open("rb") as upload:
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK marks its video methods deprecated
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        video = client.videos.create_and_poll(
            model=TI2V, prompt="the kite climbs", input_reference=upload, size="64x64",  # type: ignore[arg-type]
            seconds="0.2", extra_body={"num_inference_steps": 2}, poll_interval_ms=50,  # type: ignore[arg-type]
        )  # fmt: skip
        assert video.status == "completed" and video.model_dump()["task"] == "fl2va", video
    assert ti2v._pipe.calls[-1]["image"].size == (64, 64)


def help_of(capsys, *command: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare words


def test_serve_help_shows_the_wan_flags(capsys):
    assert (
        f"(+audio where the model makes it) over an OpenAI-style /v1/videos API (models: minimax_h3, {A14B}, {TI2V})"
        in (help_of(capsys))
    )
    text = help_of(capsys, "serve", "--model", A14B)
    group = text[text.index(f"{A14B} flags:") : text.index(f"{TI2V} flags:")]
    assert "also these, listed above: --config, --checkpoint (here: Wan2.2-T2V-A14B root" in group
    # --attn-impl is MiniMax H3's flag (default auto: sage_sm90 where usable, else sdpa), so it has no note of its own
    assert "--attn-" in group and "--attn-impl (here:" not in group
    assert "(default auto); auto: the first of sage_sm90, sdpa usable on this machine" in help_of(capsys, "serve")


def test_minimax_only_options_end_the_command_with_the_reason(capsys, tmp_path):
    base = ["serve", "--model", A14B, "--port", "0", "--artifacts", str(tmp_path), "--device", "cpu"]
    assert cli.main([*base, "--lora-dir", str(tmp_path)]) == 2
    assert "--lora-dir: wan2.2-t2v-a14b takes no LoRAs here (MiniMax H3 does)" in capsys.readouterr().err
    assert cli.main([*base, "--task-partition", "Ref2VA"]) == 2
    assert "--task-partition is MiniMax H3's" in capsys.readouterr().err
    assert cli.main([*base, "--enable-feature-cache"]) == 2
    assert "--enable-feature-cache is not a flag of --model wan2.2-t2v-a14b" in capsys.readouterr().err


def test_telefuser_serve_runs_a_wan_job_and_stops_on_sigterm(tmp_path):
    command = ["telefuser", "serve", "--model", A14B, "--config", "tiny", "--device", "cpu", "--port", "0",
               "--artifacts", str(tmp_path), "--steps-default", "2"]  # fmt: skip
    with ServerProcess(command) as server:
        url = server.wait_url(60)
        with httpx.Client(base_url=url, trust_env=False, timeout=10) as http:
            assert http.get("/v1/models").json()["data"][0]["id"] == A14B
            job = http.post("/v1/videos", json={"prompt": "a kite", "model": A14B, "seconds": 0.2,
                                                "guidance_scale": 2.5}).json()  # fmt: skip
            assert job["status"] == "queued" and job["size"] == "64x32", job
            done = poll(http, job["id"], timeout=60)
            assert done["status"] == "completed" and "audio" not in done and done["dit_calls"] == 2, done
            assert http.get(f"/v1/videos/{job['id']}/content").status_code == 200
        assert server.stop(signal.SIGTERM, 30) == 0, server.log
    assert "serve exited cleanly" in server.log, server.log
    assert not probe_media(tmp_path / f"{job['id']}.mp4").has_audio


def test_a_jobs_memory_estimate_is_the_workload_beyond_the_resident_weights(a14b):
    from telefuser.serving.video.contract import VideoShape

    small = a14b.memory_estimate(VideoShape(64, 32, 9, 16, 9 / 16, 4))
    large = a14b.memory_estimate(VideoShape(128, 64, 17, 16, 17 / 16, 4))
    # latents: 16 x 3 x 4 x 8 and 16 x 5 x 8 x 16 fp32 values, six copies; and the largest stage (the decode)
    assert small["latents"] == 6 * 4 * 16 * 3 * 4 * 8 and large["latents"] * 3 == small["latents"] * 20
    assert set(small) == {"latents", "stage decode"} and large["stage decode"] > small["stage decode"] > 0
