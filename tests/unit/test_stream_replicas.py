"""serve-stream replicas (issue 26, test 7): sessions named by their replica, reply URLs from --public-url, 421 to a
request for another replica's session, /v1/service/capacity, and two `serve-stream --fake` replicas behind the
shipped HAProxy configuration (Debian's haproxy, started here)."""

from __future__ import annotations

import csv
import io
import json

import httpx
import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from telefuser.serving.common.auth import ApiKeys
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.stream.replica import ReplicaIdentity
from tools.harness.replica_processes import start_replicas, stop_all, wait_for
from tools.harness.server_process import REPO
from tools.harness.service_servers import HAProxy, free_port

ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
CREATE = {"prompt": "a quiet harbour", "image": ONE_PIXEL_PNG, "config": {"resolution": "64x48", "num_frames": 45}}
OTHER = "b." + "0" * 32


def replica_app(**kw):
    identity = ReplicaIdentity("a", "https://proxy.example/r/{replica}")
    return create_stream_app(FakeSessionFactory(), max_sessions=1, replica=identity, **kw)


def test_session_ids_name_the_replica_and_reply_urls_come_from_the_public_url():
    with TestClient(replica_app()) as client:
        assert client.get("/v1/service/capacity").json() == {"free": 1, "max_sessions": 1, "replica": "a"}
        reply = client.post("/v1/stream/sessions", json=CREATE).json()
        sid = reply["session_id"]
        assert sid.startswith("a.") and len(sid) == 34
        assert reply["ws_url"] == f"wss://proxy.example/r/a/v1/stream/sessions/{sid}/ws"
        assert reply["sse_url"] == f"https://proxy.example/r/a/v1/stream/sessions/{sid}/events"
        assert reply["ws_path"] == f"/r/a/v1/stream/sessions/{sid}/ws"
        # the replica serves its own prefix, so the same paths work through the proxy and straight to it
        assert (
            client.get(f"/r/a/v1/stream/sessions/{sid}").json()["state"]
            == client.get(f"/v1/stream/sessions/{sid}").json()["state"]
        )
        full = client.get("/v1/service/capacity")
        assert full.status_code == 503 and full.json()["free"] == 0 and full.headers["Retry-After"] == "1"
        assert client.delete(f"/r/a/v1/stream/sessions/{sid}").status_code == 204
        assert client.get("/r/a/v1/service/capacity").status_code == 200


@pytest.mark.parametrize(
    "path",
    [f"/v1/stream/sessions/{OTHER}", f"/v1/stream/sessions/{OTHER}/events", f"/r/b/v1/stream/sessions/{OTHER}",
     "/r/b/v1/service/health"],
)  # fmt: skip
def test_another_replicas_session_or_prefix_gets_421_naming_its_owner_even_with_keys_on(path):
    with TestClient(replica_app(api_keys=ApiKeys(["k"]))) as client:
        for method in ("GET", "POST", "DELETE"):
            r = client.request(method, path)
            assert r.status_code == 421, (method, path, r.text)
            assert r.json()["owner"] == "b" and r.json()["owner_url"] == "https://proxy.example/r/b"
            assert "belongs to replica 'b', at https://proxy.example/r/b" in r.json()["detail"]
        assert client.get("/v1/stream/sessions/a." + "0" * 32).status_code == 401  # its own: the key decides
        assert client.get("/v1/service/capacity").status_code == 200  # public, like health


def test_a_websocket_to_another_replicas_session_is_refused_with_421():
    with TestClient(replica_app()) as client:
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect(f"/v1/stream/sessions/{OTHER}/ws"),
        ):
            pass
        assert refused.value.status_code == 421 and refused.value.json()["owner"] == "b"


def test_without_a_replica_id_nothing_changes():
    with TestClient(create_stream_app(FakeSessionFactory())) as client:
        reply = client.post("/v1/stream/sessions", json=CREATE).json()
        assert "." not in reply["session_id"] and reply["ws_url"].startswith("ws://testserver/v1/stream/sessions/")
        assert client.get(f"/v1/stream/sessions/{OTHER}").status_code == 404


# -- test 7: two replicas behind HAProxy -----------------------------------------------------------------------------
def proxy_view(stats_url: str) -> dict[str, str]:
    """{server: UP/DOWN} of the backend that places new sessions, from HAProxy's CSV stats."""
    text = httpx.get(stats_url, trust_env=False).text.lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    return {r["svname"]: r["status"] for r in rows if r["pxname"] == "stream_new" and r["svname"] != "BACKEND"}


def test_two_stream_replicas_behind_haproxy():
    from websockets.sync.client import connect

    port = free_port()
    public = f"http://127.0.0.1:{port}"
    flags = ["--fake", "--max-sessions", "1", "--fake-delay", "0.3", "--public-url"]
    replicas = start_replicas("serve-stream", [*flags, public + "/r/{replica}"], ["a", "b"])
    by_name = {r.name: r for r in replicas}
    stats = free_port()
    env = {"STREAM_PROXY_BIND": f"127.0.0.1:{port}", "STREAM_STATS_BIND": f"127.0.0.1:{stats}"}
    env |= {f"STREAM_REPLICA_{r.name.upper()}": f"127.0.0.1:{r.port}" for r in replicas}
    proxy = HAProxy(REPO / "docker" / "haproxy" / "serve-stream.cfg", env, port)
    stats_url = f"http://127.0.0.1:{stats}/stats;csv"
    try:
        http = httpx.Client(base_url=public, trust_env=False, timeout=30)
        wait_for(lambda: proxy_view(stats_url) == {"a": "UP", "b": "UP"}, 10, "both replicas up")
        first = http.post("/v1/stream/sessions", json=CREATE)
        assert first.status_code == 201, first.text
        first = first.json()
        owner = first["session_id"].split(".")[0]
        other = "b" if owner == "a" else "a"
        assert first["ws_url"] == f"ws://127.0.0.1:{port}/r/{owner}/v1/stream/sessions/{first['session_id']}/ws"
        wait_for(lambda: proxy_view(stats_url)[owner].startswith("DOWN"), 10, f"the proxy to see {owner} full")

        second = http.post("/v1/stream/sessions", json=CREATE).json()  # lands on the replica with a free slot
        assert second["session_id"].startswith(f"{other}."), (owner, second)

        misdirected = http.get(f"/r/{other}/v1/stream/sessions/{first['session_id']}")
        assert misdirected.status_code == 421 and misdirected.json()["owner_url"] == f"{public}/r/{owner}"
        assert http.get(f"/v1/stream/sessions/{second['session_id']}").status_code in (200, 421)  # any replica
        assert http.get(second["sse_url"].removeprefix(public).replace("/events", "")).json()["state"] == "created"

        with connect(second["ws_url"], open_timeout=10) as ws:
            events = [json.loads(ws.recv(timeout=10))]
            assert events[0]["stage"] == "runtime_ready"
            assert isinstance(ws.recv(timeout=10), bytes)  # the first chunk, then: the other replica dies
            by_name[owner].kill()
            while events[-1].get("stage") != "done":
                message = ws.recv(timeout=10)
                if isinstance(message, str):
                    events.append(json.loads(message))
            assert events[-1]["published_frames"] == 45 and events[-1]["reason"] == "completed"
            ws.send(json.dumps({"type": "delivery_ack", "published_frames": 45}))
            assert json.loads(ws.recv(timeout=10))["match"] is True
        assert [e["chunk"] for e in events if e.get("stage") == "chunk_sent"] == [0, 1, 2]
        gone = http.get(f"/r/{owner}/v1/stream/sessions/{first['session_id']}")
        assert gone.status_code == 503  # the proxy has no server for it: only the killed replica's session ended
        assert http.get(f"/r/{other}/v1/service/capacity").status_code == 200  # its session is done: a free slot
    finally:
        proxy.close()
        stop_all(replicas)
