"""Serving a multi-rank model: rank 0 runs HTTP, the other ranks replay its model calls by name.

A sharded model needs every rank to make the same calls in the same order, or its collectives deadlock: rank 0's
`Leader` broadcasts each make, call and close over a gloo group before running it, and every other rank's
`Follower` replays them until stop. Messages, `share`/`receive` and the heartbeat: serving/README.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .out_of_memory import free_cached_memory, is_out_of_memory, what_ran_out

log = logging.getLogger("telefuser.serving")


def _broadcast(message: tuple | None, group) -> tuple:
    import torch.distributed as dist

    box = [message]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]


class Leader:
    """Rank 0's side: every call is broadcast to the followers, then run here."""

    def __init__(self, group, *, heartbeat_s: float = 60.0):
        self._group = group
        self._lock = threading.Lock()
        self._next_handle = 0
        self._stopped = False
        self.pings = 0
        self._last_broadcast = time.monotonic()
        self._halt = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat, args=(heartbeat_s,), name="tf-follow-heartbeat", daemon=True
        )
        self._heartbeat.start()

    def make(self, kind: str, *args: Any, local: Callable[[], Any]) -> Replayed:
        """Make an object on every rank: the followers run `makers[kind](*args)`, this rank `local()`."""
        with self._lock:
            handle = self._next_handle
            self._next_handle += 1
            self._send(("make", handle, kind, args))
            try:
                return Replayed(self, handle, local())
            except BaseException:  # e.g. out of memory here: the followers made theirs, which must not hold memory
                self._send(("close", handle))
                raise

    def share(self, value: Any) -> Any:
        """Hand the followers a value decided during a call (their `receive()`); only inside a replayed call."""
        self._send(("share", value))
        return value

    def _replay(self, message: tuple, fn: Callable[..., Any], *args: Any) -> Any:
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
        """Tell the followers to exit; idempotent. Call after the last object is closed."""
        self._halt.set()
        self._heartbeat.join(timeout=5)
        with self._lock:
            if not self._stopped:
                _broadcast(("stop",), self._group)
                self._stopped = True


class Replayed:
    """Rank 0's handle on an object made on every rank: `call` and `close` run on the followers' copies too."""

    def __init__(self, leader: Leader, handle: int, local: Any):
        self._leader, self.handle, self.local = leader, handle, local

    def call(self, method: str, *args: Any) -> Any:
        return self._leader._replay(("call", self.handle, method, args), getattr(self.local, method), *args)

    def close(self) -> None:
        self._leader._replay(("close", self.handle), self.local.close)


class LeaderLeftCall(RuntimeError):
    """Rank 0 sent its next message where this rank waited for a shared value: the call failed there (out of memory,
    say). The follower ends its own call and runs that message next."""


class Follower:
    """A follower rank's side: replays rank 0's calls until it broadcasts stop."""

    def __init__(self, group):
        self._group = group
        self._pending: tuple | None = None  # a message `receive()` got instead of a shared value

    def receive(self) -> Any:
        """The value rank 0 shares next (`Leader.share`), from inside the call being replayed."""
        message = _broadcast(None, self._group)
        if message[0] != "share":
            self._pending = message
            raise LeaderLeftCall(f"rank 0 left the call ({message[0]!r} came where a shared value was expected)")
        return message[1]

    def _next(self) -> tuple:
        message, self._pending = self._pending, None
        return message if message is not None else _broadcast(None, self._group)

    def follow(self, makers: Mapping[str, Callable[..., Any]]) -> int:
        """Replay until stop; returns the number of calls run (pings, shared values and stop are not calls).

        A call that fails here is logged and the loop goes on (rank 0 decides what the client sees); an object whose
        making failed is skipped for its later calls, and values rank 0 shares inside a call that failed here are
        skipped too. What that means when one rank runs out of memory: serving/README.md."""
        objects: dict[int, Any] = {}
        calls = 0
        while True:
            message = self._next()
            op = message[0]
            if op == "stop":
                for handle, obj in objects.items():  # rank 0 closes before stopping; this is a safety net
                    if obj is not None:
                        log.warning("follower: object %d still open at stop, closing", handle)
                        _quietly(obj.close)
                return calls
            if op == "ping":
                continue
            if op == "share":  # for a call that failed on this rank and goes on on rank 0
                log.debug("follower: skipped a value shared inside a call that failed here")
                continue
            calls += 1
            handle = message[1]
            if op == "make":
                kind, args = message[2], message[3]
                objects[handle] = _quietly(makers[kind], *args) if kind in makers else _unknown(kind)
            elif op == "call":
                if objects.get(handle) is not None:
                    _quietly(getattr(objects[handle], message[2]), *message[3])
            elif op == "close":
                obj = objects.pop(handle, None)
                if obj is not None:
                    _quietly(obj.close)
            else:
                log.error("follower: unknown message %r", op)


def _unknown(kind: str) -> None:
    log.error("follower: no maker for %r", kind)


def _quietly(fn, *args) -> Any:
    name = getattr(fn, "__qualname__", fn)
    try:
        return fn(*args)
    except LeaderLeftCall as exc:
        log.info("follower: %s ended: %s", name, exc)
        return None
    except Exception as exc:
        if not is_out_of_memory(exc):
            log.exception("follower: %s failed", name)
            return None
        log.error("follower: %s ran out of memory: %s", name, what_ran_out(exc))
    free_cached_memory()  # after the except block, which held the call's tensors through the traceback
    return None
