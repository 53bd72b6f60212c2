"""The WebRTC offer route and its peer connection, from a Python aiortc client (no browser): the answer, frames on the
video track, status on the data channel, the delivery ack, one consumer per session, cleanup when the peer closes,
and the route's refusals (off, bad offers, keys, another replica's session)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from telefuser.serving.common.auth import ApiKeys
from telefuser.serving.common.local_server import serve_in_thread
from telefuser.serving.stream.app import create_stream_app
from telefuser.serving.stream.fake import FakeSessionFactory
from telefuser.serving.stream.replica import ReplicaIdentity
from tests.unit.test_stream_service import body

aiortc = pytest.importorskip("aiortc", reason="aiortc is not installed (the --webrtc dependency)")
from telefuser.serving.stream.webrtc.settings import WebRtcSettings, load_ice_servers  # noqa: E402

FRAMES = 13 + 16 * 2


def _app(fake=None, **kw):
    fake = fake or FakeSessionFactory(delay_s=0.02, defaults={"resolution": "64x48", "num_frames": FRAMES, "fps": 32})
    kw.setdefault("webrtc", WebRtcSettings())
    return create_stream_app(fake, max_sessions=1, ack_timeout_s=3.0, **kw), fake


async def _offer():
    pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    channel = pc.createDataChannel("tf")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, channel


class Viewer:
    """A Python peer: counts decoded frames, collects the data channel's events, acks delivery after done."""

    def __init__(self, pc, channel):
        self.pc, self.channel = pc, channel
        self.events: list[dict] = []
        self.frames = 0
        self.acked = asyncio.Event()
        self.done = asyncio.Event()
        channel.on("message", self._message)
        pc.on("track", lambda track: asyncio.ensure_future(self._read(track)))

    async def _read(self, track) -> None:
        try:
            while True:
                await track.recv()
                self.frames += 1
        except aiortc.mediastreams.MediaStreamError:
            pass

    def _message(self, text) -> None:
        event = json.loads(text)
        self.events.append(event)
        if event["stage"] == "done":
            self.done.set()
        if event["stage"] == "delivery_ack":
            self.acked.set()

    async def ack_after_done(self, expected: int, timeout_s: float = 2) -> None:
        deadline = time.monotonic() + timeout_s
        while self.frames < expected and time.monotonic() < deadline:  # the last frames may still be on their way
            await asyncio.sleep(0.02)
        self.channel.send(json.dumps({"type": "delivery_ack", "published_frames": self.frames}))
        await asyncio.wait_for(self.acked.wait(), timeout_s)


def test_a_python_peer_gets_the_frames_the_events_and_an_answer_to_its_ack():
    app, fake = _app()

    async def main(base: str):
        async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
            session = (await http.post("/v1/stream/sessions", json=body(config={"num_frames": FRAMES}))).json()
            pc, channel = await _offer()
            viewer = Viewer(pc, channel)
            offer = {"type": "offer", "sdp": pc.localDescription.sdp}
            r = await http.post(session["webrtc_path"], json=offer)
            assert r.status_code == 200, r.text
            await pc.setRemoteDescription(aiortc.RTCSessionDescription(**r.json()))
            again = await http.post(session["webrtc_path"], json=offer)
            await asyncio.wait_for(viewer.done.wait(), 20)
            done = next(e for e in viewer.events if e["stage"] == "done")
            # aiortc's receiver hands a frame over when the next one starts: its peer never decodes the last frame
            await viewer.ack_after_done(done["published_frames"] - 1)
            await asyncio.sleep(0.3)  # the session closes once the ack is answered
            status = (await http.get(f"/v1/stream/sessions/{session['session_id']}")).json()
            await pc.close()
            return viewer, again, status

    with serve_in_thread(app) as base:
        viewer, again, status = asyncio.run(asyncio.wait_for(main(base), 60))
    stages = [e["stage"] for e in viewer.events]
    assert stages[0] == "runtime_ready" and viewer.events[0]["transport"] == "webrtc"
    assert stages.count("chunk_sent") == stages.count("chunk_playout") == 3
    starts = [e for e in viewer.events if e["stage"] == "chunk_playout"]
    assert [(s["chunk"], s["first_frame"], s["frames"]) for s in starts] == [(0, 0, 13), (1, 13, 16), (2, 29, 16)]
    assert starts[0]["rtp_offset"] == 0 and starts[1]["rtp_offset"] >= 13 * 90_000 / 32 - 1  # paced at the fps
    # the transport overhead's ends on the server: when each chunk was computed, how long the track paced its first frame
    sent = [e for e in viewer.events if e["stage"] == "chunk_sent"]
    assert all(s["computed_at"] == c["computed_at"] > 1e12 and s["paced_ms"] >= 0 for s, c in zip(starts, sent))
    assert starts[0]["paced_ms"] == 0  # the first frame goes at once
    ack = next(e for e in viewer.events if e["stage"] == "delivery_ack")
    assert status["frames_played"] == FRAMES  # the track sent every frame (the browser test acks them all decoded)
    assert viewer.frames == FRAMES - 1 and ack == {
        **ack,
        "match": False,
        "published_frames": FRAMES,
        "acked_frames": FRAMES - 1,
    }
    assert again.status_code == 409 and "one stream per session" in again.json()["detail"]
    assert status["consumer"] == "webrtc" and status["close_reason"] == "completed" and fake.open_sessions == 0


def test_closing_the_peer_frees_the_session():
    fake = FakeSessionFactory(delay_s=0.05, defaults={"resolution": "64x48", "num_frames": None, "fps": 16})
    app, _ = _app(fake)

    async def main(base: str):
        async with httpx.AsyncClient(base_url=base, trust_env=False) as http:
            session = (await http.post("/v1/stream/sessions", json=body(config={"num_frames": None}))).json()
            pc, channel = await _offer()
            viewer = Viewer(pc, channel)
            r = await http.post(session["webrtc_path"], json={"type": "offer", "sdp": pc.localDescription.sdp})
            await pc.setRemoteDescription(aiortc.RTCSessionDescription(**r.json()))
            while viewer.frames < 5:
                await asyncio.sleep(0.02)
            await pc.close()
            deadline = time.monotonic() + 10
            while (await http.get("/v1/service/health")).json()["sessions_in_use"] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return (await http.get(f"/v1/stream/sessions/{session['session_id']}")).json()

    with serve_in_thread(app) as base:
        status = asyncio.run(asyncio.wait_for(main(base), 60))
    assert status["state"] == "closed" and status["close_reason"] == "disconnect" and fake.open_sessions == 0


def test_the_offer_route_refuses_what_it_cannot_answer():
    from fastapi.testclient import TestClient

    off, _ = _app(webrtc=None)
    with TestClient(off) as client:
        session = client.post("/v1/stream/sessions", json=body()).json()
        assert "webrtc_path" not in session
        assert client.get("/v1/service/metadata").json()["webrtc"] == {"enabled": False}
        r = client.post(f"/v1/stream/sessions/{session['session_id']}/webrtc", json={"type": "offer", "sdp": "v=0"})
        assert r.status_code == 404 and "serve-stream --webrtc" in r.json()["detail"]

    async def offer_without_a_channel() -> str:
        pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    app, fake = _app()
    with TestClient(app) as client:
        assert client.get("/v1/service/metadata").json()["webrtc"]["max_bitrate"] == 8_000_000
        path = client.post("/v1/stream/sessions", json=body()).json()["webrtc_path"]
        for bad, expected in (
            ({"type": "answer", "sdp": "v=0"}, 'must be {"type": "offer"'),
            ({"type": "offer", "sdp": "not sdp"}, "needs one video transceiver"),
            ({"type": "offer", "sdp": asyncio.run(offer_without_a_channel())}, "needs one video transceiver"),
        ):
            r = client.post(path, json=bad)
            assert r.status_code == 422 and expected in r.json()["detail"], (bad, r.text)
        assert fake.sessions[0].history == []  # a refused offer starts nothing; the session can still be consumed


def test_an_offer_without_the_servers_codec_is_refused_with_the_reason():
    async def vp8_only_offer() -> str:
        pc = aiortc.RTCPeerConnection(aiortc.RTCConfiguration(iceServers=[]))
        transceiver = pc.addTransceiver("video", direction="recvonly")
        codecs = aiortc.RTCRtpReceiver.getCapabilities("video").codecs
        transceiver.setCodecPreferences([c for c in codecs if c.mimeType in ("video/VP8", "video/rtx")])
        pc.createDataChannel("tf")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    from fastapi.testclient import TestClient

    app, fake = _app(webrtc=WebRtcSettings(codec="h264"))
    with TestClient(app) as client:
        session = client.post("/v1/stream/sessions", json=body()).json()
        r = client.post(session["webrtc_path"], json={"type": "offer", "sdp": asyncio.run(vp8_only_offer())})
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("the browser offers no H264 decoder (the video would be vp8)")
        assert client.get(f"/v1/stream/sessions/{session['session_id']}").json()["consumer"] is None  # still free


def test_the_offer_route_takes_keys_tokens_and_replica_affinity():
    from fastapi.testclient import TestClient

    app, _ = _app(api_keys=ApiKeys(["k"]), replica=ReplicaIdentity("r1"))
    with TestClient(app) as client:
        session = client.post("/v1/stream/sessions", json=body(), headers={"Authorization": "Bearer k"}).json()
        bare = session["webrtc_path"].split("?")[0]
        assert client.post(bare, json={}).status_code == 401
        r = client.post(session["webrtc_path"], json={"type": "offer", "sdp": "not sdp"})  # the session's token
        assert r.status_code == 422, r.text
        other = "/v1/stream/sessions/r2." + "0" * 32 + "/webrtc"
        r = client.post(other, json={})
        assert r.status_code == 421 and r.json()["owner"] == "r2"


def test_ice_servers_come_from_a_json_file(tmp_path):
    good = tmp_path / "ice.json"
    good.write_text(json.dumps([{"urls": "turn:turn.example:3478", "username": "u", "credential": "c"}]))
    assert load_ice_servers(good)[0]["urls"] == "turn:turn.example:3478"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"url": "stun:x"}]))
    with pytest.raises(ValueError, match="needs 'urls'"):
        load_ice_servers(bad)
