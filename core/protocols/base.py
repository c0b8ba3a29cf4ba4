"""The contract every wire protocol implements."""

from __future__ import annotations

from typing import Any, Protocol

from core.chat import Api, ChatRequest, Completion
from core.errors import ProtocolError


class StreamRenderer(Protocol):
    """Turns canonical stream events into SSE bytes, framed exactly as the real API frames them."""

    def start(self) -> bytes: ...

    def text(self, delta: str) -> bytes: ...

    def reasoning(self, delta: str) -> bytes:
        """A piece of the answer's reasoning, in the protocol's own form (it comes before any text)."""
        ...

    def finish(self, completion: Completion) -> bytes:
        """What of the reasoning and text was not streamed yet, tool calls, finish reason, usage and the closing frames."""
        ...

    def error(self, kind: str, message: str) -> bytes:
        """The protocol's own mid-stream error event (and its terminator)."""
        ...


class WireProtocol(Protocol):
    api: Api

    def parse_request(self, body: Any, *, model: str | None = None, stream: bool | None = None) -> ChatRequest:
        """Validate and translate a request body; raise `ProtocolError` with a clear message when it is malformed.

        `model`/`stream` come from the URL where the protocol puts them there (Gemini).
        """
        ...

    def render_response(self, request: ChatRequest, completion: Completion, response_id: str) -> dict[str, Any]: ...

    def stream_renderer(self, request: ChatRequest, response_id: str) -> StreamRenderer: ...

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        """The protocol's own JSON error shape for an error kind (`core.errors.KIND_STATUS` gives its HTTP status)."""
        ...

    def answer_message(self, response: dict[str, Any]) -> dict[str, Any]:
        """The assistant message (content, tool_calls) a recorded response body carried, in canonical form."""
        ...


def answer_from(protocol: WireProtocol, history: dict[str, Any]) -> dict[str, Any]:
    """One assistant message from `history`: a request of `protocol` whose only turn is a recorded answer,
    as a harness would send it back in its history, parsed like one (texts joined, tool calls kept)."""
    try:
        messages = protocol.parse_request(history, model="recorded").messages
    except ProtocolError:  # no output items at all: an empty answer
        messages = []
    texts = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    calls = [c for m in messages for c in m.get("tool_calls") or ()]
    answer: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        answer["tool_calls"] = calls
    return answer
