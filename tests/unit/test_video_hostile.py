"""`telefuser serve` under hostile input: bounded requests, no 5xx from bad input, no record a bad request can poison,
the listing and the restart path robust to unreadable records; properties (hypothesis) and a soak against the tiny
MiniMax H3 model.

The fake runner serves where the model does not matter; the soak runs the real tiny pipeline, whose plan and memory
estimate set the limits it is checked against.
"""

from __future__ import annotations

import json
import logging
import random
import time
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.contract import JobRequest
from telefuser.serving.video.fake import FakeVideoRunner
from telefuser.serving.video.jobs import RecordFiles, VideoJob, new_job_id
from telefuser.serving.video.limits import VideoLimitFlags
from telefuser.serving.video.store import QueuePolicy, open_embedded
from telefuser.serving.video.store.base import Unstorable
from tests import hostile_values as hv
from tests.video_runner_args import tiny_runner_args
from tests.video_stores import STORE_KINDS, store_site

PROPERTY = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow], database=None)
SMALL = VideoLimitFlags(max_pixels=128 * 128, max_pixel_seconds=128 * 128 * 1.0, max_job_memory_gib=0.05)


def post_json_text(client, text):
    return client.post("/v1/videos", content=text, headers={"content-type": "application/json"})


def wait_idle(client, timeout=20.0) -> None:
    deadline = time.monotonic() + timeout
    while (health := client.get("/v1/service/health").json())["running"] is not None or health["queue_depth"]:
        assert time.monotonic() < deadline, "the worker did not go idle"
        time.sleep(0.01)


def all_listed(client) -> list[str]:
    """Every id, paging through GET /v1/videos (which must answer 200 every time)."""
    ids, after = [], None
    while True:
        r = client.get("/v1/videos", params={"limit": 100, "order": "asc", **({"after": after} if after else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        ids += [v["id"] for v in page["data"]]
        if not page["has_more"]:
            return ids
        after = page["last_id"]


def assert_healthy(client) -> None:
    assert client.get("/v1/service/health").json()["status"] == "ok"
    assert client.get("/v1/service/metrics").status_code == 200
    all_listed(client)


# ---- the findings ---------------------------------------------------------------------------------------
def test_a_lone_surrogate_prompt_is_422_and_the_listing_survives_a_restart(tmp_path):
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        r = post_json_text(client, '{"prompt": "\\ud800 fox"}')
        assert r.status_code == 422 and "'prompt' is not valid Unicode text" in r.json()["detail"]
        r = post_json_text(client, '{"prompt": "fox", "negative_prompt": "\\udc00"}')
        assert r.status_code == 422
        ok = client.post("/v1/videos", json={"prompt": "a fox"}).json()["id"]
        wait_idle(client)
        assert all_listed(client) == [ok]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{ok}.json", f"{ok}.mp4"])
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        assert all_listed(client) == [ok]


def _record(prompt="p", **changes) -> dict:
    job = VideoJob(
        id=new_job_id(),
        model="MiniMax-H3",
        prompt=prompt,
        request={"prompt": prompt},
        job_request=JobRequest(prompt, "64x64", "16:9", 0.2, 4, 0).as_dict(),
        plan={"width": 64, "height": 64, "frames": 5, "fps": 24, "duration_s": 5 / 24, "dit_calls": 3},
        status="cancelled",
        finished_at=time.time(),
    )
    job.touch()
    return {**job.record(), **changes}


def test_records_that_cannot_be_read_are_skipped_and_logged_at_restart(tmp_path, caplog):
    good = _record()
    RecordFiles(tmp_path).save(good)
    poisoned = _record()  # what the old server wrote for a lone-surrogate prompt: a \ud800 escape on disk
    (tmp_path / f"{poisoned['id']}.json").write_text(json.dumps({**poisoned, "prompt": "\ud800 fox"}))
    truncated, wrong, listy = new_job_id(), _record(plan={"width": "?"}), new_job_id()
    (tmp_path / f"{truncated}.json").write_text('{"id": "')
    (tmp_path / f"{wrong['id']}.json").write_text(json.dumps(wrong))
    (tmp_path / f"{listy}.json").write_text("[1, 2]")
    app = create_video_app(FakeVideoRunner(), output_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="telefuser.serving"), TestClient(app) as client:
        assert all_listed(client) == [good["id"]]
        assert client.get(f"/v1/videos/{poisoned['id']}").status_code == 404
        assert client.get("/v1/service/health").json()["jobs"]["cancelled"] == 1
    for skipped in (poisoned["id"], truncated, wrong["id"], listy):
        assert f"skipping unreadable record {tmp_path / skipped}.json" in caplog.text, skipped


def test_nothing_unencodable_is_queued_or_written(tmp_path):
    files = RecordFiles(tmp_path)
    with pytest.raises(ValueError):
        files.save(_record(prompt="\ud800"))
    with pytest.raises(ValueError):
        files.save(_record(error={"code": "x", "message": float("nan")}))
    assert not list(tmp_path.iterdir())
    store, _ = open_embedded(tmp_path, QueuePolicy(max_queue=2))
    bad = VideoJob.from_record(_record(prompt="\udfff"))
    bad.status = "queued"
    with pytest.raises(Unstorable, match="cannot be stored as UTF-8 JSON"):
        store.submit(bad)
    assert store.page(limit=10, after=None, ascending=True) == ([], False) and not list(tmp_path.iterdir())


class _SurrogateError(FakeVideoRunner):
    def run(self, job_request, output, hooks):
        raise RuntimeError("tokenizer choked on \udcff")


def test_a_model_error_whose_text_is_not_unicode_is_still_stored_and_listed(tmp_path):
    with TestClient(create_video_app(_SurrogateError(), output_dir=tmp_path)) as client:
        vid = client.post("/v1/videos", json={"prompt": "p"}).json()["id"]
        wait_idle(client)
        job = client.get(f"/v1/videos/{vid}").json()
        assert job["status"] == "failed" and job["error"]["message"] == "RuntimeError: tokenizer choked on \\udcff"
        assert all_listed(client) == [vid]
    assert json.loads((tmp_path / f"{vid}.json").read_text())["status"] == "failed"


@pytest.mark.parametrize(
    "body, message",
    [
        (hv.nested(100_000), "nested deeper than 32 levels"),
        (b'{"prompt": "p", "seconds": NaN}', "NaN is not a JSON number"),
        (b'{"prompt": "p", "guidance_scale": 1e999}', "too large for a JSON number"),
        (b'{"prompt": "p", "seed": 1' + b"0" * 5000 + b"}", "Exceeds the limit"),
    ],
    ids=["deep", "nan", "1e999", "5000-digits"],
)
def test_unreadable_json_is_400(tmp_path, body, message):
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path)) as client:
        r = post_json_text(client, body)
        assert r.status_code == 400 and message in r.json()["detail"], r.text
        assert all_listed(client) == []


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_frames": 10**400}, "the limit is max_frames=56 (--max-frames)"),
        ({"seconds": 10**400}, "'seconds' must be a finite number"),
        ({"seconds": "1" * 100}, "'seconds' must be a number"),
        ({"seed": "9" * 5000}, "'seed' has 5000 digits"),
        ({"num_inference_steps": 10**100}, "allows at most 1000"),
        ({"size": "32000x32000"}, "'size' 32000x32000 is 32000 pixels wide; the limit is max_width=2,688 (--max-width"),
        ({"size": "2688x2560"}, "the limit is max_pixels=4,128,768 (--max-pixels; model: 4 x its 1344x768 canvas)"),
        ({"size": "1792x1024", "seconds": 2}, "pixel-seconds; the limit is max_pixel_seconds=2,064,384"),
        ({"resolution": 99999}, "must be a positive multiple of 32"),
        ({"size": {"w": 1}}, "'size' must be WIDTHxHEIGHT"),
        ({"model": "m" * 100_000}, "is not served here"),
    ],
    ids=lambda v: str(v)[:30],
)
def test_numbers_and_sizes_past_every_bound_are_422_naming_the_limit(tmp_path, fields, message):
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path, max_seconds=2)) as client:
        r = client.post("/v1/videos", json={"prompt": "p", **fields})
        assert r.status_code == 422 and message in r.json()["detail"], r.text
        assert len(r.json()["detail"]) < 400  # a refusal does not echo a client's megabyte back


def test_a_job_past_the_memory_limit_is_422_and_flags_override_the_limits(tmp_path):
    flags = VideoLimitFlags(max_width=256, max_pixels=256 * 128, max_frames=22, max_job_memory_gib=0.001)
    with TestClient(create_video_app(FakeVideoRunner(), output_dir=tmp_path, limits=flags)) as client:
        meta = client.get("/v1/service/metadata").json()
        assert meta["limits"]["max_width"] == 256 and meta["limits"]["max_frames"] == 22
        assert meta["limits"]["max_job_memory_bytes"] == int(0.001 * 2**30)
        assert meta["limit_sources"]["max_width"] == "set by --max-width"
        assert "device:" not in meta["limit_sources"]["max_job_memory_bytes"]
        assert meta["limit_sources"]["max_height"] == "model: 2 x the long edge of its 1344x768 canvas"
        r = client.post("/v1/videos", json={"prompt": "p", "size": "256x128", "seconds": 0.9})
        assert r.status_code == 422 and "the limit is max_job_memory_bytes=1.0 MiB" in r.json()["detail"]
        assert "frames" in r.json()["detail"] and "audio" in r.json()["detail"]  # the estimate's terms
        r = client.post("/v1/videos", json={"prompt": "p", "size": "64x32", "seconds": 2})
        assert r.status_code == 422 and "the clip has 56 frames; the limit is max_frames=22" in r.json()["detail"]
        assert client.post("/v1/videos", json={"prompt": "p", "size": "64x32", "seconds": 0.2}).status_code == 200


def test_an_oversized_chunked_body_is_413(tmp_path):
    def chunks():
        for _ in range(300):
            yield b" " * 4096

    app = create_video_app(FakeVideoRunner(), output_dir=tmp_path, max_body_bytes=1 << 20)
    with TestClient(app) as client:
        r = client.post("/v1/videos", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]


class _PlanFault(FakeVideoRunner):
    def plan(self, job_request):
        if job_request.prompt == "fault":
            raise KeyError("internal table")
        return super().plan(job_request)


def test_a_server_fault_is_a_generic_500_logged_with_the_request_id(tmp_path, caplog):
    app = create_video_app(_PlanFault(), output_dir=tmp_path)
    with caplog.at_level(logging.ERROR, logger="telefuser.serving"), TestClient(app) as client:
        r = client.post("/v1/videos", json={"prompt": "fault"})
        rid = r.headers["x-request-id"]
        assert r.status_code == 500 and r.json()["detail"].startswith(f"internal server error (request id {rid})")
        assert "internal table" not in r.text
        assert client.post("/v1/videos", json={"prompt": "fine"}).status_code == 200
        assert_healthy(client)
    assert (
        f"request {rid} (POST /v1/videos) failed with a server error" in caplog.text and "internal table" in caplog.text
    )


# ---- properties -------------------------------------------------------------------------------------------------
SIZES = st.sampled_from(["64x32", "32x32", "96x54", "128x128", "100x64", "1280x720"])
video_fields = hv.one_field_hostile(
    valid={
        "prompt": st.text(min_size=1, max_size=30).map(lambda t: "p" + t),
        "model": st.just("MiniMax-H3"),
        "size": SIZES,
        "seconds": st.sampled_from([0.2, "0.2", 0.5, 1]),
        "num_inference_steps": st.integers(2, 6),
        "seed": st.integers(0, 2**63 - 1),
        "fps": st.just(24),
        "guidance_scale": st.just(1.0),
        "negative_prompt": st.just(""),
    },
    hostile={
        "prompt": st.one_of(hv.surrogate_text, st.just(" "), st.just("p" * 10_001)),
        "model": st.sampled_from(["sora-2", "", "minimax-h3 "]),
        "size": st.sampled_from(["32000x32000", "0x0", "1281x720", "8x8", "64 x 32", "2688x2688", "x", "9" * 50]),
        "seconds": st.one_of(st.floats(), st.sampled_from(["soon", "-1", "1e400", 10**400])),
        "num_inference_steps": st.one_of(hv.huge_ints, st.sampled_from([0, 1, 1001, "2.5"])),
        "seed": st.one_of(hv.huge_ints, st.just("9" * 40)),
        "fps": st.sampled_from([30, "24", 0]),
        "guidance_scale": st.floats(),
        "negative_prompt": hv.any_text,
    },
    optional=("model", "size", "seconds", "num_inference_steps", "seed", "fps", "guidance_scale", "negative_prompt"),
)
extra_fields = st.sampled_from(
    [
        {},
        {},
        {},
        {"resolution": 32},
        {"resolution": 48, "aspect_ratio": "1:1"},
        {"num_frames": 22},
        {"num_frames": 30},
        {"input_reference": "x"},
        {"steps": 3},
        {"input_reference": "data:image/png;base64,iVBORw0KGgo="},  # a PNG signature and nothing else
        {"input_reference": {"image_url": "data:image/png;base64,/9j/4AAQ"}},
        {"last_frame": "data:;base64,AAAA", "references": ["data:video/mp4;base64,AAAAGGZ0eXA="]},
        {"references": ["data:video/mp4;base64,AAAAGGZ0eXBtcDQy" + "A" * 40]},
        {"lora": "../../etc/passwd"},
        {"lora": [{"name": "x", "scale": "1e999"}]},
        {"preset": "turbo-4"},
        {"preset": ["x"]},
    ]
)


@pytest.fixture(scope="module", params=STORE_KINDS)
def video_client(request, tmp_path_factory):
    site = store_site(request.param, tmp_path_factory.mktemp("videos"), request)
    app = site.app(FakeVideoRunner(step_delay_s=0.0), max_seconds=1, limits=SMALL, max_queue=4)
    with TestClient(app) as client:
        for _ in range(3):  # warm-up: the MP4 writer, the worker thread
            client.post("/v1/videos", json={"prompt": "warm-up", "size": "64x32", "seconds": 0.2})
        wait_idle(client)
        client.rss_at_start, client.site = hv.rss_bytes(), site
        yield client


@settings(PROPERTY, max_examples=250)
@given(
    fields=video_fields,
    extra=extra_fields,
    encoding=st.sampled_from(["json", "json", "form", "urlencoded", "raw"]),
    raw=hv.raw_bodies,
)
def test_property_no_video_request_gets_a_5xx(video_client, fields, extra, encoding, raw):
    fields = {**fields, **extra}
    text = {k: v if isinstance(v, str) else hv.json_text(v) for k, v in fields.items()}
    if encoding == "json":
        r = post_json_text(video_client, hv.json_text(fields))
    elif encoding == "form":
        body, content_type = hv.multipart(text)
        r = video_client.post("/v1/videos", content=body, headers={"content-type": content_type})
    elif encoding == "urlencoded":
        from urllib.parse import urlencode

        body = urlencode(
            [(k.encode("utf-8", "backslashreplace"), v.encode("utf-8", "backslashreplace")) for k, v in text.items()]
        )
        r = video_client.post("/v1/videos", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    else:
        r = video_client.post("/v1/videos", content=raw[0], headers={"content-type": raw[1]})
    assert r.status_code in (200, 400, 413, 415, 422, 429), r.text
    if r.status_code == 200:
        job = r.json()
        assert set(job) >= {"id", "status", "size", "generated_size"} and job["status"] == "queued"
        assert video_client.delete(f"/v1/videos/{job['id']}").status_code == 200  # cancel, or delete if done
    else:
        assert isinstance(r.json()["detail"], (str, list))


query_values = st.one_of(
    st.integers(-5, 200).map(str),
    st.text(max_size=12),
    hv.huge_ints.map(str),
    hv.any_text.map(lambda t: t.encode("utf-8", "backslashreplace").decode()),
)


@settings(PROPERTY, max_examples=50)
@given(
    params=st.dictionaries(st.sampled_from(["limit", "after", "order", "x"]), query_values, max_size=3),
    variant=query_values,
    video_id=st.one_of(
        st.just("video_" + "0" * 32),
        hv.any_text.filter(lambda t: t.strip(" .")).map(
            lambda t: quote(t.encode("utf-8", "backslashreplace"), safe="")
        ),
    ),
)
def test_property_listing_and_lookups_never_5xx(video_client, params, variant, video_id):
    """GET /v1/videos with any query, and every per-video route with any id or variant: a 4xx at worst."""
    assert video_client.get("/v1/videos", params=params).status_code in (200, 404, 422)
    for method, suffix in (("GET", ""), ("GET", "/content"), ("DELETE", "")):
        r = video_client.request(method, f"/v1/videos/{video_id}{suffix}", params={"variant": variant})
        assert r.status_code < 500, (method, video_id, suffix, r.text)


def test_property_runs_left_the_service_healthy_restartable_and_memory_bounded(video_client):
    wait_idle(video_client)
    assert_healthy(video_client)
    listed = all_listed(video_client)
    growth_mb = (hv.rss_bytes() - video_client.rss_at_start) / 2**20
    assert growth_mb < 100, growth_mb
    with TestClient(video_client.site.app(FakeVideoRunner())) as restarted:
        assert all_listed(restarted) == listed  # every record written during the properties reads back


# ---- the soak ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_runner():
    from telefuser.serving.video.minimax import build_minimax_runner

    runner = build_minimax_runner(tiny_runner_args(steps_default=2, seconds_default=0.2))
    yield runner
    runner.close()


def _soak_requests(rng: random.Random, n: int):
    invalid = [
        lambda c: post_json_text(c, b"{oops"),
        lambda c: post_json_text(c, hv.nested(rng.randint(33, 50_000))),
        lambda c: post_json_text(c, '{"prompt": "\\ud800 fox"}'),
        lambda c: post_json_text(c, b'{"prompt": "p", "seconds": NaN}'),
        lambda c: c.post("/v1/videos", json={"prompt": "p", "size": f"{rng.randint(1, 99999)}x{rng.randint(1, 99999)}"}),
        lambda c: c.post("/v1/videos", json={"prompt": "p", "num_frames": 10**rng.randint(3, 400)}),
        lambda c: c.post("/v1/videos", json={"prompt": "p", "seconds": rng.choice([0, -1, 11, "x", 1e308])}),
        lambda c: c.post("/v1/videos", json={"prompt": "p", "seed": rng.choice([-1, 2**64, "9" * 99, True])}),
        lambda c: c.post("/v1/videos", json={"prompt": "p", "model": "sora-2"}),
        lambda c: c.post("/v1/videos", json={"prompt": "p", "guidance_scale": 7}),
        lambda c: c.post("/v1/videos", json={"prompt": "p", "input_reference": "x"}),
        lambda c: c.post("/v1/videos", content=rng.randbytes(200), headers={"content-type": "multipart/form-data; boundary=q"}),
        lambda c: c.post("/v1/videos", content=b"prompt=%zz&&=", headers={"content-type": "application/x-www-form-urlencoded"}),
        lambda c: c.post("/v1/videos", content=b"p", headers={"content-type": "text/csv"}),
        lambda c: c.get("/v1/videos", params={"limit": rng.choice([0, 101, "x", 10**30])}),
        lambda c: c.get("/v1/videos", params={"after": "video_" + "0" * 32}),
        lambda c: c.get("/v1/videos/video_nope/content", params={"variant": "thumbnail"}),
        lambda c: c.delete("/v1/videos/" + "x" * 500),
    ]  # fmt: skip
    for _ in range(n):
        yield ("valid", None) if rng.random() < 0.4 else ("invalid", rng.choice(invalid))


@pytest.mark.parametrize("store", STORE_KINDS)
def test_soak_1000_mixed_requests_against_the_tiny_minimax_service(
    tiny_runner, tmp_path, record_property, store, request
):
    site = store_site(store, tmp_path, request)
    app = site.app(tiny_runner, max_queue=8, max_seconds=1)
    rng = random.Random(16)
    statuses: dict[int, int] = {}
    accepted: list[str] = []
    with TestClient(app) as client:
        for size in ("64x32", "96x54"):  # warm-up: the first decode and resize at each size allocate their pools
            warm = client.post("/v1/videos", json={"prompt": "warm-up", "size": size, "seconds": 0.2}).json()["id"]
            wait_idle(client, timeout=60)
            assert client.delete(f"/v1/videos/{warm}").status_code == 200  # finished: deleted with its files
        before, started = None, time.monotonic()
        for i, (kind, send) in enumerate(_soak_requests(rng, 1000)):
            if i == 100:
                before = hv.rss_bytes()
            if kind == "valid":
                keep = len(accepted) % 25 == 0  # a few run to the end; the rest are cancelled while queued
                size = ("96x54" if len(accepted) % 50 == 0 else "64x32") if keep else rng.choice(["64x32", "96x54"])
                r = client.post(
                    "/v1/videos",
                    json={"prompt": f"waves {i}", "size": size, "seconds": 0.2, "num_inference_steps": 2, "seed": i},
                )
                if r.status_code == 200:
                    accepted.append(r.json()["id"])
                    if not keep:
                        gone = client.delete(f"/v1/videos/{r.json()['id']}")
                        assert gone.status_code == 200
                        if gone.json()["object"] == "video.deleted":  # it ran to the end first: deleted, not listed
                            accepted.pop()
                elif r.status_code == 429:  # a polite client waits for a slot (quicker than Retry-After says)
                    while client.get("/v1/service/health").json()["queue_depth"] >= 8:
                        time.sleep(0.005)
            else:
                r = send(client)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (i, r.status_code, r.text)
        wait_idle(client, timeout=60)
        elapsed = time.monotonic() - started
        growth_mb = (hv.rss_bytes() - before) / 2**20
        assert_healthy(client)
        listed = all_listed(client)
        completed = [v for v in listed if client.get(f"/v1/videos/{v}").json()["status"] == "completed"]
        resized = [v for v in completed if client.get(f"/v1/videos/{v}").json()["size"] == "96x54"]
    with TestClient(site.app(tiny_runner)) as client:
        assert all_listed(client) == listed  # the restart path reads every record back
    record_property("soak_seconds", round(elapsed, 1))
    record_property("rss_growth_mb", round(growth_mb, 1))
    print(
        f"\nvideo soak ({store} store): 1000 requests in {elapsed:.1f} s, RSS growth {growth_mb:.1f} MB, statuses {statuses}, "
        f"{len(completed)} completed"
    )
    assert sum(statuses.values()) == 1000 and len(accepted) > 300 and len(completed) >= 10 and resized
    assert set(listed) == set(accepted)  # cancelled jobs stay listed; nothing accepted is lost
    assert growth_mb < 100, growth_mb
