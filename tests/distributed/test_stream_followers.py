"""Multi-rank serving on 2 gloo ranks: rank 0's FollowingFactory replays every model call on the follower."""

from __future__ import annotations

import json
import time

import numpy as np
import torch.distributed as dist

IMAGE = np.full((8, 8, 3), 7, np.uint8)


def _factory():
    from telefuser.serving.stream.fake import FakeSessionFactory

    return FakeSessionFactory(defaults={"resolution": "32x32", "num_frames": 29})


def _direct_calls(ctx, heartbeat_s):
    from telefuser.serving.stream.replay import FollowingFactory, follow

    fake = _factory()
    group = dist.new_group(backend="gloo")  # as serve-stream does: a CPU control group
    followed = None
    if ctx.rank == 0:
        leader = FollowingFactory(fake, group, heartbeat_s=heartbeat_s)
        try:
            leader.create(IMAGE, "p", {**fake.defaults, "resolution": "33x32"})
            raise AssertionError("bad resolution accepted")
        except ValueError as exc:
            assert "multiples of 8" in str(exc)
        session = leader.create(IMAGE, "p", dict(fake.defaults))
        assert session.total_chunks == 2 and session.total_frames == 29
        session.next_chunk(["W", "J"])
        time.sleep(heartbeat_s * 4)  # idle: the heartbeat pings keep the followers' broadcast alive
        session.next_chunk([])
        session.close()
        assert leader.pings >= 2, leader.pings
        leader.shutdown()
        leader.shutdown()  # idempotent
    else:
        followed = follow(fake, group)
    return list(fake.calls), followed, [h["crc32"] for s in fake.sessions for h in s.history]


def test_follower_runs_the_same_calls_in_the_same_order(ranks2):
    (calls0, _, crcs0), (calls1, followed, crcs1) = ranks2.run(_direct_calls, 0.2)
    assert [c[0] for c in calls0] == ["create", "next_chunk", "next_chunk", "close"]
    assert calls0 == calls1 and crcs0 == crcs1  # same arguments, same frames on both ranks
    assert calls0[1] == ("next_chunk", 0, 0, ("W", "J"))
    assert followed == 4  # the invalid create never reached the follower; pings and stop are not calls


def _serve_and_follow(ctx):
    from fastapi.testclient import TestClient

    from telefuser.serving.stream.app import create_stream_app
    from telefuser.serving.stream.replay import FollowingFactory, follow

    fake = _factory()
    group = dist.new_group(backend="gloo")
    if ctx.rank != 0:
        followed = follow(fake, group)
        return list(fake.calls), followed
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(IMAGE).save(buf, "PNG")
    image = base64.b64encode(buf.getvalue()).decode()
    leader = FollowingFactory(fake, group, heartbeat_s=30)
    app = create_stream_app(leader, max_sessions=2, ack_timeout_s=2)
    try:
        with TestClient(app) as client:
            bad = client.post("/v1/stream/sessions", json={"prompt": "p", "image": image, "config": {"num_frames": 3}})
            assert bad.status_code == 422
            s = client.post("/v1/stream/sessions", json={"prompt": "p", "image": image}).json()
            idle = client.post("/v1/stream/sessions", json={"prompt": "q", "image": image}).json()
            with client.websocket_connect(s["ws_path"]) as ws:
                ws.send_json({"type": "control", "keys": ["D"]})
                while True:
                    msg = ws.receive()
                    if msg.get("text"):
                        event = json.loads(msg["text"])
                        if event["stage"] == "control_state":
                            applies = event["applies_from_chunk"]
                        if event["stage"] == "done":
                            ws.send_json({"type": "delivery_ack", "published_frames": event["published_frames"]})
                        if event["stage"] == "delivery_ack":
                            assert event["match"], event
                            break
            assert client.delete(f"/v1/stream/sessions/{idle['session_id']}").status_code == 204
    finally:
        leader.shutdown()
    return list(fake.calls), applies


def test_stream_app_on_rank0_drives_the_follower(ranks2):
    (calls0, applies), (calls1, followed) = ranks2.run(_serve_and_follow)
    assert calls0 == calls1
    kinds = [c[0] for c in calls0]
    assert kinds.count("create") == 2 and kinds.count("close") == 2 and kinds.count("next_chunk") == 2
    # The control, sent at once, applies from whichever chunk the service had not generated yet: 0, 1, or 2 when the
    # fake model had already made both (a race the test does not control); every chunk from there on holds "D".
    chunks = [c for c in calls0 if c[0] == "next_chunk"]
    assert applies in (0, 1, 2) and [c[2] for c in chunks] == [0, 1]
    assert [c[3] for c in chunks] == [("D",) if c[2] >= applies else () for c in chunks], (applies, chunks)
    assert followed == 6


def test_serve_stream_under_torchrun_and_ctrl_c():
    """`torchrun --nproc-per-node 2 ... serve-stream --fake`: rank 0 serves, rank 1 follows; a terminal Ctrl-C
    (SIGINT to the whole process group) shuts everything down in order."""
    from tests.serve_stream_launch import stream_one_session_then_ctrl_c

    log, _ = stream_one_session_then_ctrl_c(
        ["--fake", "--resolution", "32x32", "--fake-delay", "0.01"], frames=45, chunks=3
    )
    assert "serve-stream exited cleanly" in log, log
    assert "rank 1: follower stopped after 5 model calls" in log, log  # create, 3 x next_chunk, close


def test_serve_stream_real_tiny_model_under_torchrun_and_ctrl_c():
    """The same with the real tiny LingBot-World v2 model on CPU: the Ulysses2 exchange runs inside the model on
    both ranks (portable transport over gloo), rank 1 follows, and Ctrl-C ends both."""
    from tests.serve_stream_launch import stream_one_session_then_ctrl_c

    log, metadata = stream_one_session_then_ctrl_c(
        ["--config", "tiny", "--device", "cpu", "--resolution", "64x48"],
        frames=29,
        chunks=2,
        start_timeout_s=120,
        stream_timeout_s=120,
    )
    model = metadata["model"]  # the factory's metadata, as /v1/service/metadata nests it
    assert model["model"] == "LingBot-World v2" and model["ulysses_transport"] == "portable", model
    assert "warmup_s" not in model  # auto: only on CUDA
    assert "serve-stream exited cleanly" in log, log
    assert "rank 1: follower stopped after 4 model calls" in log, log  # create, 2 x next_chunk, close
