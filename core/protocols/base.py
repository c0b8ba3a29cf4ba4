"""The contract every wire protocol implements."""

from __future__ import annotations

from typing import Any, Protocol

from core.chat import Api, ChatRequest, Completion


class StreamRenderer(Protocol):
    """Turns canonical stream events into SSE bytes, framed exactly as the real API frames them."""

    def start(self) -> bytes: ...

    def text(self, delta: str) -> bytes: ...

    def finish(self, completion: Completion) -> bytes:
        """Tool calls, finish reason, usage and the closing frames."""
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

    def error_body(self, status: int, kind: str, message: str) -> dict[str, Any]:
        """The protocol's own JSON error shape. `kind` is a `ProtocolError.kind` or 'backend'/'server'."""
        ...
