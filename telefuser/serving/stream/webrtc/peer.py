"""A session's WebRTC consumer: one aiortc peer connection with the paced video track and the client's data channel.

`PeerSession.answer(offer)` answers the browser's offer (which brings a receive-only video transceiver and a data
channel); `run()` then streams the session: each chunk is encoded in the session's own thread and queued on the
track, and the same JSON status events as on the WebSocket go over the data channel, with `chunk_playout` added when
a chunk's first frame is sent. Client messages on the data channel are the WebSocket's (client_messages.py), minus
`playout`: here the track is the viewer's playout clock. The session ends, and its slot is freed, when the stream
ends, the data channel closes, the peer connection fails or closes, or the channel does not open in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCRtpSender, RTCSessionDescription

from ..client_messages import MessageBudget, receive_client_message
from ..registry import SessionRegistry
from ..events import ChunkItem, DoneItem, Notice
from ..session import StreamSessionState
from .encoder import ChunkEncoder
from .settings import WebRtcSettings
from .track import PacedVideoTrack

log = logging.getLogger("telefuser.serving")
logging.getLogger("aioice").setLevel(logging.WARNING)  # its INFO lines narrate every ICE check of every session


class OfferError(ValueError):
    """An offer this service cannot answer (a client's mistake: 422)."""


class PeerSession:
    def __init__(self, state: StreamSessionState, registry: SessionRegistry, settings: WebRtcSettings):
        self.state, self.registry, self.settings = state, registry, settings
        config = RTCConfiguration(iceServers=[RTCIceServer(**server) for server in settings.ice_servers])
        self.pc = RTCPeerConnection(config)  # an empty list: host candidates only, no STUN lookup
        self.track = PacedVideoTrack(state.fps or 16, on_sent=self._track_sent, on_chunk_start=self._chunk_start)
        self.channel = None
        self.opened = asyncio.Event()
        self.ended = asyncio.Event()  # the channel or the connection went away
        self.budget = MessageBudget()
        self.encoder: ChunkEncoder | None = None
        self.encoding = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tf-webrtc-{state.id[:8]}")
        self.pc.on("datachannel", self._datachannel)
        self.pc.on("connectionstatechange", self._connection_state)

    # ---- signalling ----------------------------------------------------------------------------------------------
    async def answer(self, sdp: str) -> dict[str, str]:
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except (ValueError, KeyError, IndexError) as exc:
            raise OfferError(f"invalid SDP offer: {exc}") from None
        video = [t for t in self.pc.getTransceivers() if t.kind == "video"]
        if len(video) != 1 or self.pc.sctp is None:
            raise OfferError("the offer needs one video transceiver (receive-only) and a data channel")
        wanted = f"video/{self.settings.codec}"
        codecs = [
            c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() in (wanted, "video/rtx")
        ]
        video[0].setCodecPreferences(codecs)
        video[0].sender.replaceTrack(self.track)
        video[0].direction = "sendonly"
        answer = await self.pc.createAnswer()
        chosen = video_codec(answer.sdp)
        if chosen != self.settings.codec:
            raise OfferError(
                f"the browser offers no {self.settings.codec.upper()} decoder (the video would be {chosen}), and this "
                f"server sends {self.settings.codec.upper()} (serve-stream --webrtc-codec)"
            )
        await self.pc.setLocalDescription(answer)
        return {"sdp": self.pc.localDescription.sdp, "type": self.pc.localDescription.type}

    def _datachannel(self, channel) -> None:
        if self.channel is not None:
            channel.close()  # one channel per session
            return
        self.channel = channel
        channel.on("message", self._message)
        channel.on("close", self.ended.set)
        self.opened.set()

    def _connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.ended.set()

    # ---- the stream ----------------------------------------------------------------------------------------------
    async def run(self) -> None:
        state, reason = self.state, "disconnect"
        state.playout.expect_reports()
        self.registry.consumers += 1
        watcher = asyncio.ensure_future(self._watch())
        try:
            await asyncio.wait_for(self.opened.wait(), self.settings.connect_timeout_s)
            self._send({**state.ready_payload(), "transport": "webrtc", "video_codec": self.settings.codec})
            async with contextlib.aclosing(state.events()) as events:
                async for event in events:
                    if isinstance(event, ChunkItem):
                        await self._deliver(event)
                    elif isinstance(event, DoneItem):
                        await self.track.drained(timeout_s=10 + self.track.queued * self.track.interval)
                        self._send(state.done_payload(event))
                        reason = "completed"
                    elif isinstance(event, Notice):
                        self._send(event.payload)
                        if event.final:
                            reason = event.payload.get("reason") or "error"
            if reason == "completed":
                await state.finish_after_ack()
                self._send(state.ack_payload())
                await asyncio.sleep(0.1)  # let the ack leave before the connection closes
        except asyncio.TimeoutError:
            log.info(
                "session %s: the WebRTC data channel did not open within %gs",
                state.id,
                self.settings.connect_timeout_s,
            )
        except Exception as exc:  # noqa: BLE001 - the peer went away mid-send: a disconnect, not a server error
            log.debug("session %s: WebRTC stream ended: %r", state.id, exc)
        finally:
            self.registry.consumers -= 1
            watcher.cancel()
            await self.close()
            self.registry.spawn(state.aclose(reason))

    async def _watch(self) -> None:
        """A closed channel or a failed connection ends the session at once, even while nothing is being sent."""
        await self.ended.wait()
        if not self.state.closed:
            log.info("session %s: WebRTC peer went away (%s)", self.state.id, self.pc.connectionState)
            self.registry.spawn(self.state.aclose("disconnect"))

    async def _deliver(self, item: ChunkItem) -> None:
        """Encode the chunk frame by frame in the session's thread; each frame joins the track as it is encoded."""
        loop = asyncio.get_running_loop()
        info = {"chunk": item.index, "first_frame": item.first_frame, "frames": item.frames, **item.control_fields()}
        info.update(item.computed_fields())
        self.track.waiting = item.frames
        try:
            nbytes, first_s, seconds = await loop.run_in_executor(self.encoding, self._encode, item, info, loop)
        finally:
            self.track.waiting = 0
        item.encode_seconds += seconds
        item.pixels = None
        self.state.metrics.inc("encode_seconds_total", seconds)
        self.state.playout.on_encoded(first_s)  # what delays the chunk's first frame
        payload = self.state.mark_sent(item, nbytes)
        self._send({"type": "status", "stage": "chunk_sent", **payload})

    def _encode(
        self, item: ChunkItem, info: dict[str, Any], loop: asyncio.AbstractEventLoop
    ) -> tuple[int, float, float]:
        """(bytes, seconds until the first frame was queued, seconds in all); runs in the session's thread."""
        if self.encoder is None:
            self.encoder = ChunkEncoder(
                self.settings.codec,
                width=item.width,
                height=item.height,
                fps=self.state.fps or 16,
                max_bitrate=self.settings.max_bitrate,
                keyframe_interval_s=self.settings.keyframe_interval_s,
            )
        before, nbytes, first_s = self.encoder.seconds, 0, 0.0
        for i, frame in enumerate(item.pixels):
            packet = self.encoder.encode(frame)
            nbytes += packet.size
            loop.call_soon_threadsafe(self._queue_frame, packet, info if i == 0 else None)
            first_s = first_s or self.encoder.seconds - before
        return nbytes, first_s, self.encoder.seconds - before

    def _queue_frame(self, packet, chunk: dict[str, Any] | None) -> None:
        self.track.waiting = max(0, self.track.waiting - 1)
        self.track.push(packet, chunk)

    def _track_sent(self, sent: int, queued: int) -> None:
        self.state.playout.on_track_sent(sent, queued)  # the track is the viewer's playout clock

    def _chunk_start(self, info: dict[str, Any]) -> None:
        self._send({"type": "status", "stage": "chunk_playout", **info})

    def _message(self, message) -> None:
        received = {"text": message} if isinstance(message, str) else {"bytes": message}
        try:
            # the track is the playout clock here: a client's own report could run the generator ahead of it
            receive_client_message(self.state, received, self.budget, playout_reports=False)
        except Exception:  # noqa: BLE001 - our fault, not the client's: log it, tell the client, keep streaming
            log.exception("session %s: handling a data channel message failed", self.state.id)
            self.state.client_error("internal error handling that message")

    def _send(self, payload: dict[str, Any]) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(json.dumps(payload, separators=(",", ":")))

    async def close(self) -> None:
        self.track.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        self.encoding.shutdown(wait=False)


def video_codec(sdp: str) -> str | None:
    """The codec an SDP's video section sends: its first payload type's name, lower case (vp8, h264), or None."""
    lines = sdp.splitlines()
    media = next((line.split() for line in lines if line.startswith("m=video ")), None)
    if not media or len(media) < 4:
        return None
    prefix = f"a=rtpmap:{media[3]} "
    rtpmap = next((line[len(prefix) :] for line in lines if line.startswith(prefix)), "")
    return rtpmap.split("/")[0].lower() or None
