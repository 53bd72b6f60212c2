"""Both services under memory pressure: an out-of-memory error ends only the request it hit, with a reason.

Fake models raise `torch.OutOfMemoryError` (what torch raises when a device allocation fails) where a real one would
run out: a video job fails as `out_of_memory` and the next job completes; a stream session that cannot be made is
refused with 503, one that runs out mid-stream ends with a fatal error event, and the service keeps serving. A
session the memory budget cannot hold is refused before the model is asked: 422 if it never fits, 503 while the open
sessions hold the room. On a GPU, a memory fraction makes a real allocation fail the same way.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from fastapi.testclient import TestClient

from telefuser.pipelines.hooks import StepHooks
from telefuser.serving.common import out_of_memory
from telefuser.serving.common.memory_budget import MemoryBudget
from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.stream.limits import StreamLimitFlags, delivery_bytes
from telefuser.serving.video.app import create_video_app
from telefuser.serving.video.fake import FakeVideoRunner
from tests.unit.test_stream_service import body, create, make_app, parse_metrics
from tests.unit.test_video_service import idle, poll, wait_for

OOM = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.05 GiB is free."
TOO_BIG = "too big"


@pytest.fixture
def cache_frees(monkeypatch) -> list[str]:
    """Counts the services' calls to free the allocator's cache (the CPU has none to free)."""
    calls: list[str] = []
    for module in ("video.worker", "stream.registry", "stream.session"):
        monkeypatch.setattr(f"telefuser.serving.{module}.free_cached_memory", lambda m=module: calls.append(m))
    return calls


# ---- the video service -------------------------------------------------------------------------------------------
class OomVideoRunner(FakeVideoRunner):
    """Runs out of memory at the second denoising step of a job whose prompt is TOO_BIG."""

    def run(self, job_request, output, hooks):
        if job_request.prompt != TOO_BIG:
            return super().run(job_request, output, hooks)

        def cancelled() -> bool:
            if self.steps_run[-1] >= 1:
                raise torch.OutOfMemoryError(OOM)
            return hooks.cancelled()

        return super().run(job_request, output, StepHooks(progress=hooks.progress, cancelled=cancelled))


def test_an_out_of_memory_job_fails_with_what_ran_out_and_the_next_job_completes(tmp_path, cache_frees):
    app = create_video_app(OomVideoRunner(), output_dir=tmp_path)
    with TestClient(app) as client:
        big = client.post("/v1/videos", json={"prompt": TOO_BIG, "steps": 6}).json()["id"]
        fits = client.post("/v1/videos", json={"prompt": "fits", "steps": 6}).json()["id"]
        failed, done = poll(client, big), poll(client, fits)
        wait_for(lambda: idle(client), what="idle")
        metrics = parse_metrics(client.get("/v1/service/metrics").text)
    assert failed["status"] == "failed" and failed["error"]["code"] == "out_of_memory", failed["error"]
    message = failed["error"]["message"]
    assert message.startswith(f"out of memory: {OOM} To fit, ask for a smaller size or fewer seconds"), message
    for change in ("--offload block", "--gpu-memory-gb", "--quantization fp8", "--ulysses-degree"):
        assert change in message, (change, message)
    assert json.loads((tmp_path / f"{big}.json").read_text())["error"] == failed["error"]  # the job's record says so
    assert done["status"] == "completed" and (tmp_path / f"{fits}.mp4").exists()
    assert metrics["telefuser_video_jobs_failed_total"] == 1 and metrics["telefuser_video_jobs_completed_total"] == 1
    assert cache_frees == ["video.worker"]  # once, for the job that ran out


def test_other_failures_keep_their_code_and_free_nothing(tmp_path, cache_frees):
    class Broken(FakeVideoRunner):
        def run(self, job_request, output, hooks):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with TestClient(create_video_app(Broken(), output_dir=tmp_path)) as client:
        failed = poll(client, client.post("/v1/videos", json={"prompt": "p"}).json()["id"])
    assert failed["error"]["code"] == "generation_failed" and cache_frees == []


def test_the_cache_is_freed_only_where_cuda_is(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out_of_memory.free_cached_memory()
    assert emptied == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out_of_memory.free_cached_memory()
    assert emptied == [1]


def test_the_message_keeps_torchs_first_line_only():
    long = torch.OutOfMemoryError("Tried to allocate 2.00 GiB on cuda:1\nsecond line with allocator details")
    assert out_of_memory.what_ran_out(long) == "Tried to allocate 2.00 GiB on cuda:1"
    assert out_of_memory.out_of_memory_message(long, "do less", where=" at chunk 3") == (
        "out of memory at chunk 3: Tried to allocate 2.00 GiB on cuda:1. To fit, do less."
    )
    assert out_of_memory.what_ran_out(torch.OutOfMemoryError("x" * 1000)) == "x" * 400 + "..."


# ---- the stream service ------------------------------------------------------------------------------------------
class OomSessionFactory(FakeSessionFactory):
    """`create` runs out of memory for the prompt TOO_BIG; a session whose prompt is "runs out" does so at chunk 1."""

    def create(self, image, prompt, config):
        if prompt == TOO_BIG:
            raise torch.OutOfMemoryError(OOM)
        session = super().create(image, prompt, config)
        if prompt == "runs out":
            next_chunk = session.next_chunk

            def failing(keys):
                if session.next_index == 1:
                    time.sleep(0.2)  # a while into the forward: chunk 0 has been sent meanwhile
                    raise torch.OutOfMemoryError(OOM)
                return next_chunk(keys)

            session.next_chunk = failing
        return session


def test_a_create_that_runs_out_of_memory_is_503_and_the_next_session_is_made(cache_frees):
    app, fake = make_app(OomSessionFactory(), max_sessions=1)
    with TestClient(app) as client:
        r = client.post("/v1/stream/sessions", json=body(prompt=TOO_BIG))
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1, r.text
        detail = r.json()["detail"]  # the services' error format, unchanged
        assert detail.startswith(f"out of memory: {OOM} To fit, retry when a session ends, or ask for a smaller"), (
            detail
        )
        for change in ("--max-sessions", "--quantization fp8", "--offload block", "--ulysses-degree"):
            assert change in detail, (change, detail)
        assert client.get("/v1/service/health").json()["sessions_in_use"] == 0  # the one slot was given back
        s = create(client)  # max_sessions=1: only possible because the slot was released
        with client.websocket_connect(s["ws_path"]) as ws:
            stages = []
            while not stages or stages[-1] != "done":
                msg = ws.receive()
                if msg.get("text"):
                    stages.append(json.loads(msg["text"])["stage"])
        metrics = parse_metrics(client.get("/v1/service/metrics").text)
    assert stages.count("chunk_sent") == 3
    assert metrics['telefuser_stream_sessions_rejected_total{reason="out_of_memory"}'] == 1
    assert metrics["telefuser_stream_sessions_created_total"] == 1 and fake.created == 1
    assert cache_frees == ["stream.registry"]


def test_a_session_that_runs_out_of_memory_mid_stream_ends_with_the_reason_and_others_go_on(cache_frees):
    app, fake = make_app(OomSessionFactory(), max_sessions=2)
    with TestClient(app) as client:
        doomed, other = create(client, prompt="runs out"), create(client)
        with client.websocket_connect(doomed["ws_path"]) as ws:
            events, chunks = [], 0
            while True:
                msg = ws.receive()
                if msg["type"] == "websocket.close":
                    code = msg["code"]
                    break
                if msg.get("bytes"):
                    chunks += 1
                elif msg.get("text"):
                    events.append(json.loads(msg["text"]))
        error = events[-1]
        assert error["stage"] == "error" and error["fatal"] is True and code == 1011, (events, code)
        assert error["message"].startswith(f"out of memory at chunk 1: {OOM} To fit, ask for a smaller resolution")
        assert chunks == 1  # chunk 0 was delivered before the failure
        wait_for(lambda: client.get("/v1/service/health").json()["sessions_in_use"] == 1, what="slot release")
        status = client.get(f"/v1/stream/sessions/{doomed['session_id']}").json()
        assert status["close_reason"] == "out_of_memory" and status["model_released"] is True
        with client.websocket_connect(other["ws_path"]) as ws:  # the other session is untouched
            stages = []
            while not stages or stages[-1] != "delivery_ack":
                msg = ws.receive()
                if msg.get("text"):
                    event = json.loads(msg["text"])
                    stages.append(event["stage"])
                    if event["stage"] == "done":
                        ws.send_json({"type": "delivery_ack", "published_frames": event["published_frames"]})
        assert stages.count("chunk_sent") == 3 and event["match"] is True
        create(client)  # and the service makes new ones
        metrics = parse_metrics(client.get("/v1/service/metrics").text)
    assert metrics['telefuser_stream_sessions_closed_total{reason="out_of_memory"}'] == 1
    assert metrics['telefuser_stream_sessions_closed_total{reason="completed"}'] == 1
    assert fake.sessions[0].close_calls == 1 and cache_frees == ["stream.session"]


def test_memory_admission_422_when_it_never_fits_503_while_open_sessions_hold_the_room(monkeypatch):
    """--max-session-memory-gib above a slot's share lets sessions together promise more than the budget: one that
    fits the budget but not beside the open sessions waits (503), one larger than the whole budget never fits (422)."""
    small, large = {"resolution": "64x48", "num_frames": 45}, {"resolution": "128x96", "num_frames": 45}
    fake = FakeSessionFactory()

    def estimate(config) -> int:
        return sum(fake.memory_estimate(config).values()) + delivery_bytes(config, 16, 4)

    budget = estimate(small) * 3 // 2  # room for one small session, not two; a large one needs four times as much
    monkeypatch.setattr(
        "telefuser.serving.stream.limits.available_memory", lambda device: MemoryBudget(budget, "test budget")
    )
    app, _ = make_app(fake, max_sessions=2, limits=StreamLimitFlags(max_session_memory_gib=1.0))
    with TestClient(app) as client:
        meta = client.get("/v1/service/metadata").json()
        assert meta["limits"]["session_memory_budget_bytes"] == budget
        assert meta["limit_sources"]["session_memory_budget_bytes"] == "device: test budget"
        first = create(client, config=small)
        r = client.post("/v1/stream/sessions", json=body(config=small))
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1, r.text
        assert (
            "and the sessions open now hold" in r.json()["detail"] and "retry when a session ends" in r.json()["detail"]
        )
        r = client.post("/v1/stream/sessions", json=body(config=large))
        assert r.status_code == 422, r.text
        assert "a 128x96 session needs an estimated" in r.json()["detail"]
        assert "the limit is session_memory_budget_bytes=" in r.json()["detail"]
        assert client.get("/v1/service/health").json()["sessions_in_use"] == 1  # neither refusal took a slot
        assert client.delete(f"/v1/stream/sessions/{first['session_id']}").status_code == 204
        create(client, config=small)  # the room is back
        metrics = parse_metrics(client.get("/v1/service/metrics").text)
    assert metrics['telefuser_stream_sessions_rejected_total{reason="memory"}'] == 1
    assert metrics['telefuser_stream_sessions_rejected_total{reason="invalid"}'] == 1


# ---- a real allocation on a GPU ----------------------------------------------------------------------------------
class AllocatingRunner(FakeVideoRunner):
    """Allocates `gib` GiB on the GPU per job (the prompt says how many), as a model's activations would."""

    def run(self, job_request, output, hooks):
        held = torch.empty(int(float(job_request.prompt) * 2**30), dtype=torch.uint8, device="cuda")
        try:
            return super().run(job_request, output, hooks)
        finally:
            del held


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_job_past_the_memory_fraction_fails_and_the_next_one_runs(tmp_path):
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(4 * 2**30 / total)  # this process may hold 4 GiB
    try:
        with TestClient(create_video_app(AllocatingRunner(), output_dir=tmp_path)) as client:
            fits = poll(client, client.post("/v1/videos", json={"prompt": "2"}).json()["id"])
            big = poll(client, client.post("/v1/videos", json={"prompt": "6"}).json()["id"])
            reserved = torch.cuda.memory_reserved()  # the job's end is recorded after the cache was given back
            again = poll(client, client.post("/v1/videos", json={"prompt": "3"}).json()["id"])
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert [r["status"] for r in (fits, big, again)] == ["completed", "failed", "completed"], big["error"]
    assert big["error"]["code"] == "out_of_memory"
    assert "Tried to allocate 6.00 GiB" in big["error"]["message"], big["error"]
    assert reserved == 0, reserved  # the first job's 2 GiB are not kept cached after the failure


def test_the_cuda_budget_counts_what_torch_caches_unused_as_available(monkeypatch):
    """After a warm-up, the caching allocator keeps the freed activations reserved; the device reports them used. The
    budget a service promises is what this process can still allocate: free + reserved-but-unallocated (H100 call of
    2026-12-06: 11.4 GiB free after the warm-up, so every official LingBot session was refused at 10.3 GiB)."""
    from telefuser.serving.common.memory_budget import GIB, HEADROOM, available_memory

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (11 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 62 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 25 * GIB)
    budget = available_memory("cuda:0")
    assert budget.bytes == int((11 + 37) * GIB * HEADROOM)
    assert "11.0 GiB free + 37.0 GiB cached by torch, of 80.0 GiB" in budget.source
    # the negative control: nothing cached (a fresh process) leaves the free memory alone
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 25 * GIB)
    assert available_memory("cuda:0").bytes == int(11 * GIB * HEADROOM)
