"""One request to each service, made from outside as a client would: what `make images-check` and `make deploy-check`
ask of the containers. Standard library only, so any python3 beside the containers runs it.

  service_checks.py video --create URL [--poll URL] [--download URL]
      health of each URL; a job created on --create, polled to completion on --poll, its MP4 fetched from --download
      (both default to --create). With a shared job store these may be different replicas, or the proxy.
  service_checks.py stream --url URL [--replicas a,b]
      health; one session created at URL (a replica, or the proxy), its SSE stream read from the URL the reply gives
      (through the proxy: /r/<replica>/...) to `done`, lossless (chunks 0..N-1, every frame), then acknowledged. With
      --replicas, the session id names one of them and the proxy answers 421 for it under another replica's prefix.

Exit status 0 when every check passed; otherwise the first failed check is printed and the status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

ONE_PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"


class CheckFailed(Exception):
    pass


def request(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one HTTP request; HTTP errors are answers here, not exceptions."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()
    except OSError as error:
        raise CheckFailed(f"{method} {url}: {error}") from None


def expect(status: int, wanted: int, what: str, payload: bytes) -> None:
    if status != wanted:
        raise CheckFailed(f"{what}: HTTP {status}, expected {wanted}: {payload[:300]!r}")


def healthy(url: str) -> dict:
    status, _, payload = request("GET", f"{url}/v1/service/health")
    expect(status, 200, f"{url}/v1/service/health", payload)
    return json.loads(payload)


def check_video(create: str, poll: str, download: str, timeout_s: float) -> str:
    for url in dict.fromkeys([create, poll, download]):
        healthy(url)
    status, _, payload = request("POST", f"{create}/v1/videos", {"prompt": "a lighthouse at dusk", "seed": 7})
    expect(status, 200, f"POST {create}/v1/videos", payload)
    video_id = json.loads(payload)["id"]
    deadline = time.monotonic() + timeout_s
    while True:
        status, _, payload = request("GET", f"{poll}/v1/videos/{video_id}")
        if status == 200:
            job = json.loads(payload)
            if job["status"] in ("failed", "cancelled"):
                raise CheckFailed(f"job {video_id} ended {job['status']}: {job.get('error')}")
            if job["status"] == "completed":
                break
        elif status != 503:  # 503: the job database is briefly unreachable; a client retries
            expect(status, 200, f"GET {poll}/v1/videos/{video_id}", payload)
        if time.monotonic() > deadline:
            raise CheckFailed(f"job {video_id} not completed within {timeout_s:.0f} s (last: {payload[:200]!r})")
        time.sleep(0.2)
    status, headers, mp4 = request("GET", f"{download}/v1/videos/{video_id}/content")
    expect(status, 200, f"GET {download}/v1/videos/{video_id}/content", mp4)
    if headers.get("content-type") != "video/mp4" or mp4[4:8] != b"ftyp":
        raise CheckFailed(f"content of {video_id} is not an MP4: {headers.get('content-type')}, {mp4[:16]!r}")
    return (
        f"video: {video_id} created on {create}, completed by replica {job.get('worker')!r} "
        f"(polled on {poll}), {len(mp4)} bytes of MP4 from {download}"
    )


def sse_events(url: str, timeout_s: float):
    """(event, data) pairs of a server-sent event stream until it closes."""
    with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout_s) as stream:
        event, data = "message", []
        for raw in stream:
            line = raw.decode().rstrip("\r\n")
            if not line:
                if data:
                    yield event, json.loads("\n".join(data))
                event, data = "message", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())


def check_stream(url: str, replicas: list[str], timeout_s: float) -> str:
    healthy(url)
    create = {"prompt": "a quiet harbour", "image": ONE_PIXEL_PNG, "config": {"resolution": "64x48", "num_frames": 45}}
    status, _, payload = request("POST", f"{url}/v1/stream/sessions", create)
    expect(status, 201, f"POST {url}/v1/stream/sessions", payload)
    session = json.loads(payload)
    session_id, sse_url = session["session_id"], session["sse_url"]
    owner = session_id.split(".")[0] if "." in session_id else None
    if replicas:
        if owner not in replicas:
            raise CheckFailed(f"session {session_id} names no replica of {replicas}")
        if f"/r/{owner}/" not in sse_url:
            raise CheckFailed(f"the reply's sse_url {sse_url} does not route to replica {owner} (/r/{owner}/)")
        for other in replicas:
            if other != owner:
                status, _, payload = request("GET", f"{url}/r/{other}/v1/stream/sessions/{session_id}")
                expect(status, 421, f"session {session_id} asked of replica {other}", payload)
                if json.loads(payload).get("owner") != owner:
                    raise CheckFailed(f"the 421 from replica {other} names {payload!r}, not owner {owner}")
    chunks, done = [], None
    for event, data in sse_events(sse_url, timeout_s):
        if event == "chunk":
            chunks.append(data)
        elif event == "done":
            done = data
        elif event in ("error", "closed"):
            raise CheckFailed(f"session {session_id}: {event} {data}")
    if done is None:
        raise CheckFailed(f"session {session_id}: the stream closed before done ({len(chunks)} chunks)")
    frames = sum(chunk["frames"] for chunk in chunks)
    if [chunk["chunk"] for chunk in chunks] != list(range(len(chunks))) or frames != done["published_frames"]:
        raise CheckFailed(
            f"session {session_id} lost data: chunks {[c['chunk'] for c in chunks]}, {frames} frames, {done}"
        )
    ack_url = sse_url.split("?", 1)[0].removesuffix("/events") + "/ack"
    status, _, payload = request("POST", ack_url, {"published_frames": frames})
    expect(status, 200, f"POST {ack_url}", payload)
    if not json.loads(payload).get("match"):
        raise CheckFailed(f"session {session_id}: the delivery ack did not match: {payload!r}")
    return f"stream: session {session_id} via {url}: {len(chunks)} chunks, {frames} frames over SSE, ack matched"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="service", required=True)
    video = sub.add_parser("video", help="one job: create, poll, download")
    video.add_argument("--create", required=True, help="base URL to create the job at")
    video.add_argument("--poll", help="base URL to poll it at (default: --create)")
    video.add_argument("--download", help="base URL to fetch the MP4 from (default: --poll)")
    stream = sub.add_parser("stream", help="one session: create, read its SSE stream, acknowledge")
    stream.add_argument("--url", required=True, help="base URL of a replica or of the proxy")
    stream.add_argument("--replicas", default="", help="comma-separated replica ids behind the proxy at --url")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a job or a session may take")
    args = parser.parse_args(argv)
    try:
        if args.service == "video":
            poll = args.poll or args.create
            print(check_video(args.create, poll, args.download or poll, args.timeout))
        else:
            print(check_stream(args.url, [r for r in args.replicas.split(",") if r], args.timeout))
    except CheckFailed as failure:
        print(f"FAILED {args.service}: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
