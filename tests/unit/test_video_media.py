"""`telefuser serve` as MiniMax H3 is run: keyframes (`input_reference`, `last_frame`), references, LoRAs from
--lora-dir and sampling presets through POST /v1/videos, and every hostile variant of them a 4xx with its reason.

The tiny random model runs the jobs that must complete (FL2VA and Ref2VA partitions, CPU); the fake runner serves
the refusals that need no model. Media are staged in the artifact store at submission and removed once the job ends.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import zlib
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.fake import FakeVideoRunner
from telefuser.serving.video.form import _collect
from telefuser.serving.video.lora_field import LoraPolicy
from telefuser.serving.video.media import MediaLimits
from tests.unit.test_video_service import poll, wait_for
from tests.video_media import data_url, mp4_with_sound, png, wav, write_tiny_lora
from tests.video_runner_args import tiny_runner_args

JOB = {"prompt": "a red fox in snow", "size": "64x32", "seconds": "0.2", "num_inference_steps": "3", "seed": "7"}


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("loras")
    write_tiny_lora(directory / "style.safetensors", seed=1)
    write_tiny_lora(directory / "detail.safetensors", seed=2, layers=("blocks.0.mlp.fc1",))
    write_tiny_lora(directory / "ref2va_only.safetensors", seed=3, prefix="transformer_ref.")
    write_tiny_lora(directory / "too_deep.safetensors", seed=4, block=99)
    (directory / "broken.safetensors").write_bytes(b"not a safetensors file")
    return directory


@pytest.fixture(scope="module")
def fl2va(lora_dir):
    """The tiny model as `telefuser serve --config tiny --lora-dir DIR` builds it (the FL2VA partition)."""
    from telefuser.serving.video.minimax import build_minimax_runner

    runner = build_minimax_runner(tiny_runner_args(lora_dir=lora_dir))
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def ref2va():
    from telefuser.serving.video.minimax import build_minimax_runner

    runner = build_minimax_runner(tiny_runner_args(task_partition="Ref2VA"))
    yield runner
    runner.close()


def record(directory: Path, video_id: str) -> dict:
    return json.loads((directory / f"{video_id}.json").read_text())


# -- jobs that complete -------------------------------------------------------------------------------------------
def test_a_json_job_with_last_frame_as_a_data_url_runs_fl2va(fl2va, tmp_path):
    image = png(48, 32)
    with TestClient(create_video_app(fl2va, output_dir=tmp_path)) as client:
        r = client.post("/v1/videos", json={**JOB, "last_frame": data_url(image)})
        assert r.status_code == 200, r.text
        created = r.json()
        assert created["task"] == "fl2va" and created["inputs"][0]["role"] == "last_frame"
        assert (tmp_path / f"{created['id']}.input-0").read_bytes() == image  # staged for the worker
        done = poll(client, created["id"], timeout=60)
        assert done["status"] == "completed", done["error"]
    saved = record(tmp_path, created["id"])
    assert saved["job_request"]["task"] == "fl2va" and saved["result"]["metrics"]["request"]["task"] == "fl2va"
    assert saved["result"]["metrics"]["request"]["conditions"] == {"last": [48, 32]}
    summary = saved["request"]["last_frame"]
    assert summary["sha256"] == hashlib.sha256(image).hexdigest() and summary["data_url"] == "image/png"
    assert base64.b64encode(image).decode()[:40] not in json.dumps(saved)  # a summary, never the bytes
    assert not list(tmp_path.glob("*.input-*"))  # removed once the job ended


def test_a_keyframe_without_a_size_takes_its_aspect_ratio(fl2va, tmp_path):
    """As the pipeline's "auto": the keyframe's aspect at the default size's short edge (tiny: 32)."""
    with TestClient(create_video_app(fl2va, output_dir=tmp_path)) as client:
        r = client.post("/v1/videos", json={"prompt": "p", "input_reference": data_url(png(32, 64)), "seconds": 0.2})
        assert r.status_code == 200, r.text
        assert r.json()["size"] == "32x64"
        r = client.post("/v1/videos", json={"prompt": "p", "input_reference": data_url(png(32, 64)), "resolution": 64})
        assert r.status_code == 200 and r.json()["size"] == "64x128", r.text
        for job in client.get("/v1/videos").json()["data"]:
            client.delete(f"/v1/videos/{job['id']}")


def test_two_image_references_as_multipart_files_on_a_ref2va_server(ref2va, tmp_path):
    files = [("references", ("a.png", png(64, 32), "image/png")), ("references", ("b.png", png(32, 64), "image/png"))]
    with TestClient(create_video_app(ref2va, output_dir=tmp_path)) as client:
        r = client.post("/v1/videos", data=JOB, files=files)
        assert r.status_code == 200, r.text
        assert [m["role"] for m in r.json()["inputs"]] == ["reference", "reference"]
        done = poll(client, r.json()["id"], timeout=60)
        assert done["status"] == "completed", done["error"]
        assert done["task"] == "ref2va"
        # this server runs the Ref2VA DiT only: text and keyframe jobs are the FL2VA server's
        r = client.post("/v1/videos", json=JOB)
        assert r.status_code == 422 and "--task-partition FL2VA" in r.json()["detail"], r.text
    saved = record(tmp_path, done["id"])
    assert saved["result"]["metrics"]["request"]["conditions"] == {"references": [{"kind": "image"}] * 2}
    assert [m["file"] for m in saved["request"]["references"]] == ["a.png", "b.png"]


def test_video_and_audio_references_on_a_ref2va_server(ref2va, tmp_path):
    clip = mp4_with_sound(tmp_path / "motion.mp4")
    with TestClient(create_video_app(ref2va, output_dir=tmp_path / "out")) as client:
        refs = [data_url(png(), "image/png"), data_url(clip, "video/mp4"), data_url(wav(), "audio/wav")]
        r = client.post("/v1/videos", json={**JOB, "references": refs})
        assert r.status_code == 200, r.text
        assert [m["kind"] for m in r.json()["inputs"]] == ["image", "video", "audio"]
        done = poll(client, r.json()["id"], timeout=120)
        assert done["status"] == "completed", done["error"]
    kinds = record(tmp_path / "out", done["id"])["result"]["metrics"]["request"]["conditions"]["references"]
    assert [k["kind"] for k in kinds] == ["image", "video", "audio"] and kinds[1]["fps"] == 24.0
    assert kinds[2]["sample_rate"] == 32_000  # decoded at the audio VAE's rate by the service


def _weights(runner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in runner._pipe.dit.state_dict().items()}


def test_a_lora_by_name_is_merged_once_and_unmerged_exactly(fl2va, lora_dir, tmp_path):
    before = _weights(fl2va)
    switches, reads = fl2va.lora_switches, fl2va.loras.reads
    with TestClient(create_video_app(fl2va, output_dir=tmp_path)) as client:
        meta = client.get("/v1/service/metadata").json()
        assert meta["loras"] == ["broken", "detail", "ref2va_only", "style", "too_deep"]
        assert meta["limits"]["max_loras"] == 4 and meta["model"]["presets"]["turbo-4"]["dit_calls"] == 4
        ids = []
        for lora in (["style:0.5"], [{"name": "style", "scale": 0.5}], []):
            r = client.post("/v1/videos", json={**JOB, "lora": lora})
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
            assert poll(client, ids[-1], timeout=60)["status"] == "completed"
        assert client.get(f"/v1/videos/{ids[0]}").json()["loras"] == [{"name": "style", "scale": 0.5}]
    first, second, third = (record(tmp_path, i)["result"]["metrics"]["loras"] for i in ids)
    assert first["applied"] == [{"name": "style", "scale": 0.5}] and first["switched"] is True
    assert second["applied"] == first["applied"] and second["switched"] is False  # the same set: no re-merge
    assert third == {"applied": [], "switched": True, "switches": switches + 2}  # an empty set unmerges
    assert fl2va.lora_switches == switches + 2 and fl2va.loras.reads == reads + 1  # read once, cached
    after = _weights(fl2va)
    assert all(torch.equal(before[k], after[k]) for k in before)  # back exactly


def test_a_preset_sets_the_steps_and_explicit_steps_win(tmp_path):
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        r = client.post("/v1/videos", json={"prompt": "p", "preset": "turbo-4"})
        assert r.status_code == 200 and r.json()["dit_calls"] == 4 and r.json()["preset"] == "turbo-4"
        r = client.post("/v1/videos", data={"prompt": "p", "preset": "turbo-8", "steps": "3"})
        assert r.status_code == 200 and r.json()["dit_calls"] == 2 and r.json()["num_inference_steps"] == 3


# -- refusals -----------------------------------------------------------------------------------------------------
SMALL = MediaLimits(max_image_bytes=4096, max_image_pixels=128 * 128, max_clip_bytes=64 << 10)


@pytest.fixture
def fake(tmp_path):
    app = create_video_app(FakeVideoRunner(), output_dir=tmp_path, media_limits=SMALL)
    with TestClient(app) as client:
        yield client


def _big_header_png(width: int, height: int) -> bytes:
    """A few dozen bytes whose PNG header declares width x height (a decompression bomb's shape)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _truncated() -> bytes:
    whole = png()
    return whole[: len(whole) // 2]


HOSTILE = [
    ({"input_reference": data_url(_truncated())}, 422, "'input_reference' could not be decoded as a PNG image"),
    ({"input_reference": data_url(b"GIF89a" + bytes(40), "image/gif")}, 422, "must be a PNG, JPEG or WebP image"),
    ({"input_reference": data_url(png(256, 256) + bytes(5000))}, 413, "the limit is 4,096 bytes"),
    ({"input_reference": data_url(_big_header_png(200, 200))}, 422, "the limit is max_image_pixels=16,384"),
    ({"input_reference": data_url(_big_header_png(30000, 30000))}, 422, "the limit is max_image_pixels=16,384"),
    ({"input_reference": data_url(_big_header_png(65535, 65535))}, 422, "far too large to decode; the limit is"),
    ({"input_reference": "https://example.com/a.png"}, 422, "this server does not fetch URLs"),
    ({"input_reference": "/etc/passwd"}, 422, "must be a file part or a data URL"),
    ({"input_reference": {"file_id": "file_1"}}, 422, "file ids are not supported"),
    ({"input_reference": "data:image/png,rawbytes"}, 422, "must be base64-encoded"),
    ({"input_reference": "data:image/png;base64,@@@@"}, 422, "is not valid base64"),
    ({"input_reference": data_url(png()), "references": [data_url(png())]}, 422, "keyframes (FL2VA) or references"),
    ({"references": [data_url(png())]}, 422, "send it to a server started with --task-partition Ref2VA"),
    ({"lora": "style"}, 422, "this server takes no LoRAs: it was started without --lora-dir"),
    ({"preset": "warp-9"}, 422, "unknown preset 'warp-9'; presets: release, turbo-8, turbo-4"),
    ({"image": data_url(png())}, 422, "send the first keyframe as 'input_reference'"),
]


@pytest.mark.parametrize("fields, status, message", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_media_and_extras_are_refused_with_a_reason(fake, fields, status, message):
    r = fake.post("/v1/videos", json={"prompt": "p", **fields})
    assert r.status_code == status and message in r.json()["detail"], r.text
    assert len(r.json()["detail"]) < 400


def test_an_oversized_or_corrupt_file_part_is_refused(fake, tmp_path):
    r = fake.post("/v1/videos", data={"prompt": "p"}, files={"input_reference": ("a.png", png(256, 256), "image/png")})
    assert r.status_code == 422 and "256x256 = 65,536 pixels" in r.json()["detail"], r.text
    big = png(64, 64) + bytes(8000)
    r = fake.post("/v1/videos", data={"prompt": "p"}, files={"input_reference": ("a.png", big, "image/png")})
    assert r.status_code == 413 and "the limit is max_image_bytes=4,096 (--max-image-mib)" in r.json()["detail"]
    r = fake.post("/v1/videos", data={"prompt": "p"}, files={"input_reference": ("a.png", _truncated(), "image/png")})
    assert r.status_code == 422 and "could not be decoded" in r.json()["detail"]
    assert not list(Path(tmp_path).glob("*.input-*"))  # nothing refused was staged


REF2VA_HOSTILE = [
    ([data_url(png())] * 13, "13 references; MiniMax H3 accepts at most 12"),
    ([data_url(png())] * 10, "at most 9 image references"),
    ([data_url(wav(), "audio/wav")], "an audio reference needs an image or a video reference beside it"),
    ([data_url(b"\x00" * 64)], "is not a PNG, JPEG or WebP image, an MP4/MOV"),
    ([data_url(b"\x00\x00\x00\x18ftypmp42" + bytes(64), "video/mp4")], "references[0] could not be read as mp4"),
]


@pytest.mark.parametrize("references, message", REF2VA_HOSTILE, ids=[str(i) for i in range(len(REF2VA_HOSTILE))])
def test_too_many_or_unreadable_references_are_422(tmp_path, references, message):
    app = create_video_app(FakeVideoRunner(partition="Ref2VA"), output_dir=tmp_path)
    with TestClient(app) as client:
        r = client.post("/v1/videos", json={"prompt": "p", "references": references})
        assert r.status_code == 422 and message in r.json()["detail"], r.text


LORA_HOSTILE = [
    (["nope"], "no LoRA named 'nope' in this server's --lora-dir; it has: broken, detail, ref2va_only, style"),
    (["../style"], "is not a file name"),
    (["/etc/passwd"], "is not a file name"),
    ([{"name": "..", "scale": 1}], "is not a file name"),
    (["style:5"], "scale 5 is out of range; the limit is lora_scale_range=[-4, 4] (--lora-scale-range)"),
    (["style:nan"], "the scale must be a finite number"),
    ([{"name": "style", "scale": True}], "the scale must be a number"),
    (["style", "detail", "a", "b", "c"], "5 LoRAs; the limit is max_loras=4 (--max-loras)"),
    (["style:1", "style:0.5"], "is named twice"),
    (["ref2va_only"], "is a LoRA for the Ref2VA partition"),
    (["broken"], "'broken' cannot be used with this model: broken.safetensors is not a readable safetensors file"),
    (["too_deep"], "does not fit this model: 2 layer(s) differ, e.g. blocks.99."),
    ([{"name": "style", "strength": 1}], 'a LoRA is {"name": ..., "scale": ...}'),
]


@pytest.mark.parametrize("lora, message", LORA_HOSTILE, ids=[str(i) for i in range(len(LORA_HOSTILE))])
def test_hostile_loras_are_422(fl2va, tmp_path, lora, message):
    with TestClient(create_video_app(fl2va, output_dir=tmp_path)) as client:
        for r in (
            client.post("/v1/videos", json={**JOB, "lora": lora}),
            client.post("/v1/videos", data={**JOB, "lora": json.dumps(lora)}),
        ):
            assert r.status_code == 422 and message in r.json()["detail"], r.text
            assert str(tmp_path) not in r.text and "/loras" not in r.text  # never the server's paths


def test_lora_policy_flags_bound_count_and_scale(tmp_path):
    policy = LoraPolicy(max_loras=1, min_scale=0.0, max_scale=1.0)
    app = create_video_app(FakeVideoRunner(), output_dir=tmp_path, lora_policy=policy)
    with TestClient(app) as client:  # the fake takes no LoRAs, whatever the policy allows
        assert client.post("/v1/videos", json={"prompt": "p", "lora": []}).status_code == 200
        r = client.post("/v1/videos", json={"prompt": "p", "lora": ["a"]})
        assert r.status_code == 422 and "without --lora-dir" in r.json()["detail"]


# -- the form's lists and objects ---------------------------------------------------------------------------------
def test_form_names_rebuild_the_lists_and_objects_the_sdk_encodes():
    pairs = [("prompt", "p"), ("lora[][name]", "a"), ("lora[][scale]", "0.5"), ("lora[][name]", "b"),
             ("references[]", "x"), ("references", "y"), ("input_reference[image_url]", "data:"), ("a[b][c]", "z")]  # fmt: skip
    assert _collect(pairs) == {
        "prompt": "p",
        "lora": [{"name": "a", "scale": "0.5"}, {"name": "b"}],
        "references": ["x", "y"],
        "input_reference": {"image_url": "data:"},
        "a[b][c]": "z",
    }


def test_staged_media_of_a_cancelled_queued_job_go_with_its_deletion(tmp_path):
    app = create_video_app(FakeVideoRunner(step_delay_s=0.05), output_dir=tmp_path, max_queue=2)
    with TestClient(app) as client:
        busy = client.post("/v1/videos", json={"prompt": "busy", "steps": 200}).json()["id"]
        wait_for(lambda: client.get(f"/v1/videos/{busy}").json()["status"] == "in_progress")
        queued = client.post("/v1/videos", json={"prompt": "q", "input_reference": data_url(png())}).json()["id"]
        assert (tmp_path / f"{queued}.input-0").is_file()
        assert client.delete(f"/v1/videos/{queued}").json()["status"] == "cancelled"
        assert client.delete(f"/v1/videos/{queued}").json()["deleted"] is True
        assert not (tmp_path / f"{queued}.input-0").exists()
        client.delete(f"/v1/videos/{busy}")


def test_media_staged_in_s3_are_read_back_and_deleted_with_the_job(moto_s3, monkeypatch):
    """With S3 artifacts (replicas), a job's media live beside its MP4 in the bucket until the job ends."""
    from telefuser.serving.video.store.base import MissingArtifact
    from telefuser.serving.video.store.s3 import S3Artifacts

    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    store = S3Artifacts(f"s3://{moto_s3.new_bucket()}/jobs", endpoint_url=moto_s3.url)
    store.put_inputs("video_1", [b"first", b"second"])
    store.put_inputs("video_10", [b"other job"])  # a job id that starts like the first one's
    assert store.read_inputs("video_1", 2) == [b"first", b"second"]
    store.delete("video_1")  # the MP4 (never written here) and the media
    with pytest.raises(MissingArtifact):
        store.read_inputs("video_1", 1)
    assert store.read_inputs("video_10", 1) == [b"other job"]


def test_a_job_whose_staged_media_are_gone_fails_with_that_reason(tmp_path):
    app = create_video_app(FakeVideoRunner(step_delay_s=0.05), output_dir=tmp_path, max_queue=2)
    with TestClient(app) as client:
        busy = client.post("/v1/videos", json={"prompt": "busy", "steps": 30}).json()["id"]
        wait_for(lambda: client.get(f"/v1/videos/{busy}").json()["status"] == "in_progress")
        queued = client.post("/v1/videos", json={"prompt": "q", "input_reference": data_url(png())}).json()["id"]
        (tmp_path / f"{queued}.input-0").unlink()  # what an operator's clean-up, or a lost volume, does
        done = poll(client, queued, timeout=30)
    assert done["status"] == "failed" and "the job's media are gone" in done["error"]["message"], done["error"]
