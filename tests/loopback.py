"""Servers on a free port for tests that talk HTTP to them: an ASGI app under uvicorn, or a stdlib handler on a thread."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 while the block runs; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
        if task.done():
            task.result()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def text_handler(answer: Callable[[http.server.BaseHTTPRequestHandler], bytes]) -> type[http.server.BaseHTTPRequestHandler]:
    """A stdlib handler whose GET answers 200 with `answer(handler)` (quietly: no access log)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            body = answer(self)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def threaded_http(handler: type[http.server.BaseHTTPRequestHandler], host: str = "127.0.0.1") -> Iterator[int]:
    """A threading stdlib HTTP server on `host` while the block runs; yields its port."""
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
