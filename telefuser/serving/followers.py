"""Serving from a multi-rank model: rank 0 runs HTTP, the other ranks replay its model calls.

A sharded model needs every rank to run the same call (create, next_chunk(keys), close) in the same order, or its
collectives deadlock. Rank 0 wraps its factory in `FollowingFactory`: each call is first broadcast over a gloo group
(`broadcast_object_list`, so prompts, images and keys travel as Python objects) and then executed locally, all under
one lock so concurrent sessions cannot interleave a broadcast with another call. The other ranks run `follow()`,
which executes the broadcast calls on their own factory until rank 0 broadcasts stop. Requests are validated on
rank 0 before anything is broadcast, so bad input never reaches the followers. While idle, rank 0 broadcasts a ping
every `heartbeat_s` so that the followers' blocking broadcast never hits the process group's timeout.

Messages: ("create", handle, image, prompt, config) | ("next_chunk", handle, keys) | ("close", handle) | ("ping",)
| ("stop",). `handle` numbers sessions in creation order and is the same on every rank.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from .protocol import Chunk, SessionFactory, StreamSession

log = logging.getLogger("telefuser.serving")


def _broadcast(message: tuple | None, group) -> tuple:
    import torch.distributed as dist

    box = [message]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]


class FollowingFactory:
    """Rank 0's factory: broadcasts every model call to the followers, then runs it locally."""

    def __init__(self, factory: SessionFactory, group, *, heartbeat_s: float = 60.0):
        self._factory, self._group = factory, group
        self._lock = threading.Lock()
        self._next_handle = 0
        self._stopped = False
        self.pings = 0
        self._last_broadcast = time.monotonic()
        self._halt = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, args=(heartbeat_s,), name="tf-follow-heartbeat", daemon=True)
        self._heartbeat.start()
        if callable(getattr(factory, "memory_estimate", None)):  # local arithmetic on rank 0: nothing is broadcast
            self.memory_estimate = factory.memory_estimate

    @property
    def metadata(self) -> dict[str, Any]:
        return self._factory.metadata

    def validate(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> None:
        self._factory.validate(image, prompt, config)

    def create(self, image: np.ndarray, prompt: str, config: dict[str, Any]) -> StreamSession:
        self._factory.validate(image, prompt, config)  # raises here, before any follower hears of it
        with self._lock:
            handle = self._next_handle
            self._next_handle += 1
            self._send(("create", handle, image, prompt, config))
            session = self._factory.create(image, prompt, config)
        return FollowedSession(self, handle, session)

    def call(self, message: tuple, fn, *args) -> Any:
        with self._lock:
            self._send(message)
            return fn(*args)

    def _send(self, message: tuple) -> None:
        if self._stopped:
            raise RuntimeError("the followers were stopped; no more model calls")
        _broadcast(message, self._group)
        self._last_broadcast = time.monotonic()

    def _beat(self, period: float) -> None:
        while not self._halt.wait(min(period, 1.0)):
            if time.monotonic() - self._last_broadcast < period or not self._lock.acquire(blocking=False):
                continue
            try:
                if not self._stopped:
                    self._send(("ping",))
                    self.pings += 1
            except Exception:
                log.exception("follower heartbeat failed")
            finally:
                self._lock.release()

    def shutdown(self) -> None:
        """Tell the followers to exit; idempotent. Call after the last session is closed."""
        self._halt.set()
        self._heartbeat.join(timeout=5)
        with self._lock:
            if not self._stopped:
                _broadcast(("stop",), self._group)
                self._stopped = True


class FollowedSession:
    def __init__(self, owner: FollowingFactory, handle: int, session: StreamSession):
        self._owner, self.handle, self._session = owner, handle, session

    @property
    def total_chunks(self) -> int | None:
        return self._session.total_chunks

    def __getattr__(self, name: str) -> Any:  # optional attributes (total_frames, fps...) of the wrapped session
        return getattr(self._session, name)

    def next_chunk(self, keys: list[str]) -> Chunk:
        return self._owner.call(("next_chunk", self.handle, list(keys)), self._session.next_chunk, list(keys))

    def close(self) -> None:
        self._owner.call(("close", self.handle), self._session.close)


def follow(factory: SessionFactory, group) -> int:
    """A follower rank's loop: run rank 0's calls on `factory` until stop; returns the number of calls run.

    A call that fails here is logged and the loop goes on (rank 0 decides what the client sees); a session whose
    create failed is skipped for its later calls.
    """
    sessions: dict[int, StreamSession | None] = {}
    calls = 0
    while True:
        message = _broadcast(None, group)
        op = message[0]
        if op == "stop":
            for handle, session in sessions.items():  # rank 0 closes before stopping; this is a safety net
                if session is not None:
                    log.warning("follower: session %d still open at stop, closing", handle)
                    _quietly(session.close)
            return calls
        if op == "ping":
            continue
        calls += 1
        handle = message[1]
        if op == "create":
            sessions[handle] = _quietly(factory.create, *message[2:])
        elif op == "next_chunk":
            if sessions.get(handle) is not None:
                _quietly(sessions[handle].next_chunk, message[2])
        elif op == "close":
            session = sessions.pop(handle, None)
            if session is not None:
                _quietly(session.close)
        else:
            log.error("follower: unknown message %r", op)


def _quietly(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception:
        log.exception("follower: %s failed", getattr(fn, "__qualname__", fn))
        return None
