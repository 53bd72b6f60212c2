"""Issue 36: every error body has OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`, with `detail`
kept), so the official `openai` SDK shows the reason in its exception; the paths people try first answer."""

from __future__ import annotations

import warnings

import pytest
from fastapi.testclient import TestClient

from telefuser.serving.common.auth import ApiKeys
from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.fake import FakeVideoRunner

openai = pytest.importorskip("openai", reason="the openai package is in the dev extra")
KEY = "first-hour-key"


def fake_app(tmp_path, **kw):
    runner = FakeVideoRunner(model="fake-MiniMax-H3", step_delay_s=0.0, defaults={"seconds": 0.2, "steps": 3})
    return create_video_app(runner, output_dir=tmp_path / "out", **kw)


def test_the_openai_sdk_shows_the_reason_for_a_refusal(tmp_path):
    with serve_in_thread(fake_app(tmp_path, api_keys=ApiKeys([KEY]))) as base, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the SDK marks its video methods deprecated
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)

        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.videos.create(prompt="a lighthouse", seconds="12")  # one of the SDK's own typed values
        reason = "'seconds' is 12; this server allows at most 10 s (its operator can raise that with --max-seconds)"
        assert str(refused.value) == f"Error code: 422 - {reason}"
        assert refused.value.message == f"Error code: 422 - {reason}"
        assert (refused.value.type, refused.value.param, refused.value.code) == (
            "invalid_request_error",
            "seconds",
            "invalid_value",
        )

        with pytest.raises(openai.UnprocessableEntityError, match="model 'sora-2' is not served here"):
            client.videos.create(prompt="a lighthouse", model="sora-2")
        with pytest.raises(openai.NotFoundError, match=f"unknown video 'video_{'0' * 32}'"):
            client.videos.retrieve(f"video_{'0' * 32}")
        with pytest.raises(openai.AuthenticationError, match="invalid API key") as denied:
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        assert denied.value.code == "invalid_api_key" and denied.value.type == "authentication_error"

        # the fake stands in for MiniMax-H3: a client written for the real server works against it
        video = client.videos.create(prompt="a lighthouse", model="MiniMax-H3", seconds="4")
        assert video.model == "fake-MiniMax-H3" and video.seconds == "4"


def test_the_default_limit_says_how_to_allow_the_sdks_twelve_seconds(tmp_path):
    with TestClient(fake_app(tmp_path, max_seconds=12.0)) as client:
        created = client.post("/v1/videos", json={"prompt": "a lighthouse", "seconds": "12"})
        assert created.status_code == 200 and created.json()["seconds"] == "12"
        client.delete(f"/v1/videos/{created.json()['id']}")


def test_every_error_body_has_the_openai_shape_and_keeps_detail(tmp_path):
    with TestClient(fake_app(tmp_path)) as client:
        bad = client.post("/v1/videos", json={"prompt": "x", "size": "banana"}).json()
        assert bad["error"]["type"] == "invalid_request_error" and bad["error"]["param"] == "size"
        assert bad["detail"] == bad["error"]["message"] and "size" in bad["detail"]

        missing = client.get("/v1/nothing-here")
        assert missing.status_code == 404
        assert missing.json()["error"] == {
            "message": "GET /v1/nothing-here is not a route of this service; GET /docs lists the routes",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
        wrong_method = client.put("/v1/videos")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"

        invalid = client.get("/v1/videos", params={"limit": "lots"})
        body = invalid.json()
        assert invalid.status_code == 422 and body["error"]["param"] == "limit"
        assert body["error"]["message"].startswith("'limit': Input should be a valid integer")
        assert body["detail"][0]["loc"] == ["query", "limit"]  # FastAPI's list, as before

        too_many = client.post("/v1/videos", content=b"{" * 100, headers={"Content-Type": "application/json"})
        assert 400 <= too_many.status_code < 500 and too_many.json()["error"]["message"] == too_many.json()["detail"]


def test_health_metrics_docs_and_root_answer_and_the_fake_says_it_is_fake(tmp_path):
    with TestClient(fake_app(tmp_path, api_keys=ApiKeys([KEY]))) as client:
        health = client.get("/health")  # as public as /v1/service/health
        assert health.status_code == 200
        assert health.json()["model"] == "fake-MiniMax-H3" and health.json()["fake"] is True
        assert client.get("/metrics").status_code == 401  # as private as /v1/service/metrics
        metrics = client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
        assert metrics.status_code == 200 and "telefuser_video_jobs_submitted_total" in metrics.text
        docs = client.get("/docs")
        assert docs.status_code == 200 and docs.headers["content-type"].startswith("text/html")
        assert "/v1/videos" in docs.text and "https://" not in docs.text  # no CDN: it works offline
        root = client.get("/", follow_redirects=False)
        assert root.status_code == 307 and root.headers["location"] == "/docs"


def test_the_stream_service_shares_the_error_shape_and_the_well_known_paths():
    from telefuser.serving.stream.app import create_stream_app
    from telefuser.serving.stream.fake import FakeSessionFactory

    with TestClient(create_stream_app(FakeSessionFactory(), max_sessions=1)) as client:
        refused = client.post("/v1/stream/sessions", json={"prompt": "no image"})
        assert refused.status_code == 422
        assert refused.json()["error"]["param"] == "image" and refused.json()["detail"].startswith("'image'")
        assert client.get("/health").json()["status"] == "ok"
        assert "telefuser_stream_" in client.get("/metrics").text
        docs = client.get("/docs")
        assert docs.status_code == 200 and "/v1/stream/sessions" in docs.text
        assert client.get("/v1/stream/nowhere").json()["error"]["code"] == "not_found"
