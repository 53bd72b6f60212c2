"""The sessions of one service: slot accounting, lookup, idle reaping and shutdown.

A slot is taken when a create starts and given back when the model session's close() returns, so `max_sessions`
bounds the model's KV slots, not the HTTP objects; a session's memory estimate is held against the device's budget
for as long as its slot. Closed sessions stay findable for a while (`finished`) so that a late delivery ack or a
status query still gets an answer. A create that runs out of device memory is refused with 503 and the service goes
on (PROTOCOL.md).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..common.http_errors import RequestError
from ..common.limits import LimitSet, size_text
from ..common.out_of_memory import (
    STREAM_ADVICE,
    free_cached_memory,
    is_out_of_memory,
    out_of_memory_message,
    what_ran_out,
)
from .contract import SessionFactory
from .limits import POOL, check_stream_config, delivery_bytes
from .metrics import StreamMetrics
from .request import CreateRequest
from .session import StreamSessionState
from .settings import StreamSettings

log = logging.getLogger("telefuser.serving")


class SessionRegistry:
    def __init__(
        self,
        factory: SessionFactory,
        settings: StreamSettings,
        metrics: StreamMetrics,
        limits: LimitSet,
        *,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,  # a replica's ids name it (replica.py)
    ):
        self.factory, self.settings, self.metrics, self.limits = factory, settings, metrics, limits
        self.new_id = new_id
        # Model calls block (GPU work, or the followers' broadcast): one thread per session slot plus create/validate.
        self.executor = ThreadPoolExecutor(max_workers=settings.max_sessions + 2, thread_name_prefix="tf-stream")
        self.live: dict[str, StreamSessionState] = {}
        self.finished: OrderedDict[str, StreamSessionState] = OrderedDict()
        self._holding: set[str] = set()  # sessions whose model slot is not yet released
        self._reserved = 0  # creates in progress
        self._estimates: dict[str, int] = {}  # the memory estimate of each session in `_holding`
        self._pending_bytes = 0  # the estimates of the creates in progress
        self._tasks: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None
        self.shutting_down = False
        self.closed_at_shutdown = 0
        self.consumers = 0  # WebSocket/SSE handlers running

    @property
    def slots_in_use(self) -> int:
        return len(self._holding) + self._reserved

    @property
    def memory_in_use(self) -> int:
        """Estimated bytes of the sessions holding a slot and of the creates in progress."""
        return sum(self._estimates.values()) + self._pending_bytes

    @property
    def chunk_frames(self) -> int:
        """The model's frames per chunk after the first: the unit of the delivery buffer."""
        return int(((getattr(self.factory, "metadata", {}) or {}).get("chunk_frames") or {}).get("later", 16))

    def run_blocking(self, fn, *args) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """A detached task we keep a reference to (teardown from places that may be cancelled themselves)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def get(self, session_id: str) -> StreamSessionState | None:
        return self.live.get(session_id) or self.finished.get(session_id)

    # ---- create --------------------------------------------------------------------------------------------------
    def effective_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return {**(getattr(self.factory, "metadata", {}) or {}).get("defaults", {}), **config}

    async def create(self, request: CreateRequest) -> StreamSessionState:
        if self.shutting_down:
            raise RequestError(503, "the service is shutting down")
        config = self.effective_config(request.config)
        try:
            check_stream_config(self.limits, config)  # cheap bounds first: nothing is planned past them
            need = await self.run_blocking(self._validate, request, config)
        except (ValueError, RequestError) as exc:
            self.metrics.inc("sessions_rejected_total", reason="invalid")
            if isinstance(exc, RequestError):
                raise
            raise RequestError(422, f"invalid request: {exc}") from None
        if self.slots_in_use >= self.settings.max_sessions:
            self.metrics.inc("sessions_rejected_total", reason="capacity")
            raise RequestError(
                429,
                f"all {self.settings.max_sessions} session slot(s) are in use "
                f"(max_sessions={self.settings.max_sessions}); retry when a session ends",
            )
        self._check_room(need, config)
        self._reserved += 1
        self._pending_bytes += need
        # Shielded: if the HTTP request goes away mid-create, the session still registers and the idle reaper frees it.
        return await asyncio.shield(self._create(request, config, need))

    def _validate(self, request: CreateRequest, config: dict[str, Any]) -> int:
        """The model's own checks, then its memory estimate against the session's share of the device and against
        the whole budget (422: past either it never fits here, however idle); returns the estimate (0: none)."""
        self.factory.validate(request.image, request.prompt, config)
        estimate = getattr(self.factory, "memory_estimate", None)
        if not callable(estimate) or self.limits.value("max_session_memory_bytes") is None:
            return 0
        terms = dict(estimate(config))
        terms["delivery"] = delivery_bytes(config, self.chunk_frames, self.settings.buffer_chunks)
        what = f"a {config.get('resolution')} session"
        self.limits.check_memory(terms, what, "max_session_memory_bytes")
        self.limits.check_memory(terms, what, POOL)
        return sum(terms.values())

    def _check_room(self, need: int, config: dict[str, Any]) -> None:
        """503 when the session fits the device's budget but not beside the sessions already open (only possible
        when --max-session-memory-gib promises more than a slot's share): it can be served once one ends."""
        budget, in_use = self.limits.value(POOL), self.memory_in_use
        if not need or budget is None or in_use + need <= budget:
            return
        self.metrics.inc("sessions_rejected_total", reason="memory")
        raise RequestError(
            503,
            f"a {config.get('resolution')} session needs an estimated {size_text(need)}, and the sessions open now "
            f"hold {size_text(in_use)} of the {size_text(budget)} memory budget ({POOL}); retry when a session ends",
        )

    async def _create(self, request: CreateRequest, config: dict[str, Any], need: int) -> StreamSessionState:
        model, out_of_memory = None, None
        try:
            model = await self.run_blocking(self.factory.create, request.image, request.prompt, config)
        except ValueError as exc:
            self.metrics.inc("sessions_rejected_total", reason="invalid")
            raise RequestError(422, f"invalid request: {exc}") from None
        except Exception as exc:
            if not is_out_of_memory(exc):
                self.metrics.inc("sessions_rejected_total", reason="error")
                raise  # a server fault: logged with the request id, answered with a generic 500
            log.error("session create ran out of memory: %s", what_ran_out(exc))
            out_of_memory = out_of_memory_message(exc, f"retry when a session ends, or {STREAM_ADVICE}")
        finally:
            self._reserved -= 1
            self._pending_bytes -= need
        if out_of_memory is not None:  # out of the except block: the create's tensors in the traceback are gone
            self.metrics.inc("sessions_rejected_total", reason="out_of_memory")
            await self.run_blocking(free_cached_memory)
            raise RequestError(503, out_of_memory)  # answered with Retry-After
        state = StreamSessionState(
            self.new_id(),
            model,
            prompt=request.prompt,
            config=config,
            codec=request.codec or self.settings.codec,
            settings=self.settings,
            metrics=self.metrics,
            run_blocking=self.run_blocking,
            on_released=self._released,
            on_closed=self._closed,
            chunk_frames=self.chunk_frames,
        )
        state.stream_token = secrets.token_urlsafe(24)  # opens this session's WebSocket / SSE when keys are on
        self.live[state.id] = state
        self._holding.add(state.id)
        self._estimates[state.id] = need
        self.metrics.inc("sessions_created_total")
        if self.shutting_down:
            await state.aclose("shutdown")
            raise RequestError(503, "the service is shutting down")
        return state

    def _released(self, state: StreamSessionState) -> None:
        self._holding.discard(state.id)
        self._estimates.pop(state.id, None)

    def _closed(self, state: StreamSessionState) -> None:
        if state.close_reason == "shutdown":
            self.closed_at_shutdown += 1
        self.live.pop(state.id, None)
        self.finished[state.id] = state
        while len(self.finished) > self.settings.finished_history:
            self.finished.popitem(last=False)

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        idle = self.settings.idle_timeout_s
        while True:
            await asyncio.sleep(min(1.0, idle / 4))
            now = time.monotonic()
            for state in list(self.live.values()):
                if state.consumer is None and now - state.created_at > idle:
                    log.info("session %s: nobody attached within %.0fs, closing", state.id, idle)
                    self.spawn(state.aclose("idle"))

    async def drain_for_shutdown(self, timeout_s: float = 5.0) -> None:
        """Before the server closes connections: refuse new sessions, end every stream with a `closed` event and wait
        (bounded) for the consumers to send it; open SSE responses would otherwise hold uvicorn's graceful exit."""
        self.shutting_down = True
        await self.close_all("shutdown")
        deadline = time.monotonic() + timeout_s
        while self.consumers and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def close_all(self, reason: str) -> int:
        sessions = list(self.live.values())
        await asyncio.gather(*(s.aclose(reason) for s in sessions), return_exceptions=True)
        return len(sessions)

    async def shutdown(self) -> int:
        """Lifespan exit: close every session, then the worker pool."""
        self.shutting_down = True
        await self.close_all("shutdown")
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown, True)
        return self.closed_at_shutdown

    def describe(self) -> dict[str, Any]:
        return {
            "sessions_in_use": self.slots_in_use,
            "sessions_live": len(self.live),
            "sessions_streaming": sum(1 for s in self.live.values() if s.state == "streaming"),
            "max_sessions": self.settings.max_sessions,
        }
