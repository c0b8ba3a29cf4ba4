"""Serving ASGI apps over HTTP/1.1: small ASGI helpers and uvicorn, hardened, on a thread or in the foreground.

Both of forgetui's servers run here: the recording proxy and a store's live query endpoint. uvicorn
itself has no deadline for a request that is never finished (a client sending half its headers holds
its connection forever), answers bad framing with a plain-text 400, and takes any number of
connections; `Hardening` adds a deadline for reading each request, a JSON body for bad framing and a
cap on open connections, in a subclass of uvicorn's own httptools protocol (no framework in the hot
path: the proxy's added latency is a benchmark floor). It sits on core's bottom floors, below both the proxy and the
store that serve with it; it is no wire protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from core.errors import BodyTooLargeError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


# ----------------------------------------------------------------------------- ASGI helpers
class ClientGone(Exception):
    """The client disconnected before its request was read."""


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body; `BodyTooLargeError` as soon as it is known to exceed `limit`."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(f"request body of {int(declared)} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_bytes(send: Send, status: int, body: bytes, content_type: bytes = b"application/json", extra: list | None = None) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any, extra: list | None = None) -> None:
    await send_bytes(send, status, orjson.dumps(obj), extra=extra)


SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


# ----------------------------------------------------------------------------- uvicorn, hardened
@dataclass(frozen=True)
class Hardening:
    """What a server allows a client: seconds to send one whole request, open connections, the body of a framing 400."""

    request_timeout_s: float = 60.0
    max_connections: int | None = None
    bad_request: Callable[[str], bytes] = lambda message: orjson.dumps({"error": message})


def _http_response(status: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode()
    return head + b"\r\nconnection: close\r\n\r\n" + body


class HardenedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request's headers and body, a connection cap and JSON 400s."""

    hardening: Hardening = Hardening()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._reading_headers = False
        cap = self.hardening.max_connections
        if cap is not None and len(self.connections) > cap:
            log.warning("refusing a connection: %d are open, the cap is %d", len(self.connections) - 1, cap)
            transport.close()
            return
        self._arm()  # a connection that never sends a request is closed at the deadline too

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.hardening.request_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        self._arm()

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _too_slow(self) -> None:
        """The request was not in whole by its deadline: a 408 while its headers were still coming, then the connection closes."""
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._reading_headers:
            message = f"the request was not sent in whole within {self.hardening.request_timeout_s:g} s"
            self.transport.write(_http_response(b"408 Request Timeout", self.hardening.bad_request(message)))
        self.transport.close()  # an app still reading a body sees the client gone

    def send_400_response(self, msg: str) -> None:
        message = f"{msg} (the bytes are not an HTTP/1.1 request)"
        self.transport.write(_http_response(b"400 Bad Request", self.hardening.bad_request(message)))
        self.transport.close()


def hardened(hardening: Hardening) -> type[HardenedProtocol]:
    """The protocol class a uvicorn config takes, with these limits."""
    return type("HardenedProtocol", (HardenedProtocol,), {"hardening": hardening})


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGINT/SIGTERM after shutdown; we handle signals ourselves so the store closes cleanly."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover - the wheel is a dependency
        return False
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed: it cuts the proxy's CPU per call (benchmarks/proxy_overhead.py)."""
    if _has_uvloop():
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()  # pragma: no cover


def server_config(app: Any, host: str, port: int, hardening: Hardening) -> uvicorn.Config:
    loop = "uvloop" if _has_uvloop() else "asyncio"  # used when uvicorn runs the loop itself (Server.run)
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", http=hardened(hardening), loop=loop, access_log=False, timeout_graceful_shutdown=5
    )


def base_url(server: uvicorn.Server, host: str) -> str:
    sock = server.servers[0].sockets[0]
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}"


async def serve_forever(app: Any, host: str, port: int, on_ready: Callable[[str], None], hardening: Hardening = Hardening()) -> None:
    """Serve until SIGINT/SIGTERM; `on_ready(base_url)` runs once the socket listens."""
    server = _Server(server_config(app, host, port, hardening))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # surfaces bind errors
            raise OSError(f"could not listen on {host}:{port}")
        await asyncio.sleep(0.02)
    on_ready(base_url(server, host))
    await task


class BackgroundServer:
    """A uvicorn server on its own thread and event loop; `url` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, hardening: Hardening = Hardening(), name: str = "forgetui-http") -> None:
        self.app = app
        self.host = host
        self.port = port
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server = _Server(server_config(app, host, port, hardening))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        self.loop = new_event_loop()
        try:
            self.loop.run_until_complete(self._server.serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
        finally:
            self.loop.close()

    def start(self, timeout: float = 30.0) -> str:
        self._thread.start()
        waited = 0.0
        while not self._server.started:
            if not self._thread.is_alive():
                raise OSError(f"server failed to start on {self.host}:{self.port}: {self._error}")
            threading.Event().wait(0.01)
            waited += 0.01
            if waited > timeout:
                raise TimeoutError("server did not start in time")
        self.url = base_url(self._server, self.host)
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> BackgroundServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
