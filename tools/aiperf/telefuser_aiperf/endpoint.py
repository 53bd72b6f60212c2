"""AIPerf endpoint `telefuser_stream`: the create body of one world-model stream session, and chunk events as content.

format_payload -> `{"prompt", "image", "config": {...}, "codec"?}` for `POST /v1/stream/sessions` from the dataset row
(text = prompt, first image = start frame, a data: URL or path that AIPerf already base64-encoded) and the extra
inputs (session.split_options). Harness options (lossless, controls, ...) never reach the body; the transport reads
them from the same extra inputs.

parse_response turns each `chunk` SSE event into content whose text is the word "frame" once per frame, so that with
the bundled word-level tokenizer (tools/aiperf/fixtures/tokenizer) one output "token" is one frame: output sequence
length = frames, inter-chunk latency = gaps between chunks, time to first token = first-chunk latency. Every other
response (create answer, done, status, the harness report) is not content.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiperf.common.models import (
    InferenceServerResponse,
    ParsedResponse,
    RequestInfo,
    SSEMessage,
    TextResponseData,
)
from aiperf.endpoints.base_endpoint import BaseEndpoint

from .runner import REPO_ROOT
from .session import split_options

TRANSPORT_NAME = "telefuser_stream"
FRAME_WORD = "frame "


def sse_message_event(message: SSEMessage) -> tuple[str, str]:
    """(event name, data) of an SSE message as AIPerf stores it."""
    name, data = "message", []
    for packet in message.packets:
        if packet.name == "event" and packet.value:
            name = packet.value
        elif packet.name == "data" and packet.value is not None:
            data.append(packet.value)
    return name, "\n".join(data)


class TeleFuserStreamEndpoint(BaseEndpoint):
    def format_payload(self, request_info: RequestInfo) -> dict[str, Any]:
        transport = str(request_info.model_endpoint.transport or "")
        if transport != TRANSPORT_NAME:
            raise ValueError(
                f"endpoint telefuser_stream needs --transport {TRANSPORT_NAME} (the http transport cannot follow a "
                f"session's event stream); got transport {transport or 'auto (http)'!r}"
            )
        if not request_info.model_endpoint.endpoint.streaming:
            raise ValueError("endpoint telefuser_stream needs --streaming (streaming: true): chunk timing is streamed")
        if not request_info.turns:
            raise ValueError("telefuser_stream needs a dataset row with a prompt and an image")
        turn = request_info.turns[-1]
        if not turn.texts or not turn.texts[0].contents or not turn.texts[0].contents[0]:
            raise ValueError("telefuser_stream needs a text prompt in every dataset row")
        images = [c for image in turn.images for c in image.contents if c]
        if not images:
            raise ValueError("telefuser_stream needs a start image in every dataset row ('image' in single_turn JSONL)")
        options = split_options(request_info.model_endpoint.endpoint.extra, turn.extra_body, base_dir=REPO_ROOT)
        return options.body(turn.texts[0].contents[0], images[0])

    def parse_response(self, response: InferenceServerResponse) -> ParsedResponse | None:
        if not isinstance(response, SSEMessage):
            return None
        name, data = sse_message_event(response)
        if name != "chunk":
            return None
        try:
            frames = int(orjson.loads(data)["frames"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
        return ParsedResponse(perf_ns=response.perf_ns, data=TextResponseData(text=FRAME_WORD * frames))
