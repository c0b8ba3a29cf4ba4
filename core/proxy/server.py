"""Run the proxy with uvicorn: in the foreground (CLI) or on a background thread (tests, runs)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn

log = logging.getLogger(__name__)


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


def _config(app: Any, host: str, port: int) -> uvicorn.Config:
    try:
        import httptools  # noqa: F401

        http = "httptools"
    except ImportError:  # pragma: no cover - the wheel is a dependency
        http = "h11"
    loop = "uvloop" if _has_uvloop() else "asyncio"  # used when uvicorn runs the loop itself (Server.run)
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", http=http, loop=loop, access_log=False, timeout_graceful_shutdown=5)


def base_url(server: uvicorn.Server, host: str) -> str:
    sock = server.servers[0].sockets[0]
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{shown}:{port}"


async def serve_forever(app: Any, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve until SIGINT/SIGTERM; `on_ready(base_url)` runs once the socket listens."""
    server = _Server(_config(app, host, port))
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

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server = _Server(_config(app, host, port))
        self._thread = threading.Thread(target=self._run, name="forgetui-proxy", daemon=True)
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
                raise OSError(f"proxy failed to start on {self.host}:{self.port}: {self._error}")
            threading.Event().wait(0.01)
            waited += 0.01
            if waited > timeout:
                raise TimeoutError("proxy did not start in time")
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
