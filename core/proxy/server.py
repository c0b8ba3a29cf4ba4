"""Run the proxy with uvicorn, hardened (core.serving): in the foreground (CLI) or on a background thread (tests, runs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from core import serving
from core.serving import Hardening, new_event_loop

__all__ = ["PROXY_HARDENING", "BackgroundServer", "new_event_loop", "serve_forever"]

REQUEST_TIMEOUT_S = 60.0  # a harness sends a whole request (32 MB at most) well within this, even over a cluster network


def _bad_request(message: str) -> bytes:
    """A framing error's body, read by the OpenAI and the Anthropic SDKs alike (the route is unknown: the bytes did not parse)."""
    return orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message, "param": None, "code": None}})


PROXY_HARDENING = Hardening(request_timeout_s=REQUEST_TIMEOUT_S, max_connections=None, bad_request=_bad_request)


async def serve_forever(app: Any, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve the proxy until SIGINT/SIGTERM; `on_ready(base_url)` runs once the socket listens."""
    await serving.serve_forever(app, host, port, on_ready, PROXY_HARDENING)


class BackgroundServer(serving.BackgroundServer):
    """The proxy (or any ASGI app a test serves) on its own thread and event loop; `url` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, hardening: Hardening = PROXY_HARDENING) -> None:
        super().__init__(app, host, port, hardening, name="forgetui-proxy")
