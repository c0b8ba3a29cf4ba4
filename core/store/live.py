"""Live reads of a store while its writer runs: the writer answers read-only SQL over loopback HTTP."""

from __future__ import annotations

import datetime as dt
import hmac
import logging
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from core.errors import StoreError
from core.store.query import DEFAULT_MAX_ROWS, execute_read_only, sidecar_path

if TYPE_CHECKING:
    from core.store.writer import Store

log = logging.getLogger(__name__)

TOKEN_HEADER = "X-Forgetui-Token"
MAX_BODY = 1 << 20  # a query is text; a bigger body is refused unread
USAGE = 'send a JSON body {"sql": "<one read-only query>", "max_rows": <positive integer, optional>}'


def token_ok(given: str | None, token: str) -> bool:
    """Constant-time check of a header value; any text (non-ASCII too) compares as bytes, never raises."""
    return hmac.compare_digest((given or "").encode("utf-8", "surrogateescape"), token.encode())


def parse_request(body: bytes, max_rows_cap: int) -> tuple[str, int]:
    """The (sql, max_rows) of a query body; StoreError (HTTP 400) with USAGE for anything else."""
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"body is not JSON ({exc}); {USAGE}") from exc
    if not isinstance(req, dict) or not isinstance(req.get("sql"), str):
        raise StoreError(f'"sql" must be a string; {USAGE}')
    max_rows = req.get("max_rows")
    if max_rows is None:
        return req["sql"], max_rows_cap
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise StoreError(f'"max_rows" must be a positive integer, not {max_rows!r}; {USAGE}')
    return req["sql"], min(max_rows, max_rows_cap)


def handle_query(
    store: Store, sql: str, max_rows: int | None = None, timeout_s: float | None = 60.0
) -> dict[str, Any]:
    """Run read-only `sql` on a fresh cursor of the writer's connection; StoreError (HTTP 400) if refused."""
    cur = store.cursor()
    timer = None
    if timeout_s:
        timer = threading.Timer(timeout_s, cur.interrupt)
        timer.daemon = True
        timer.start()
    try:
        return execute_read_only(cur, sql, max_rows or DEFAULT_MAX_ROWS).to_dict()
    finally:
        if timer is not None:
            timer.cancel()
        cur.close()


def _dumps(data: Any) -> bytes:
    return orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)


def _answer(store: Store, body: bytes, max_rows_cap: int, timeout_s: float | None) -> tuple[int, bytes]:
    try:
        sql, max_rows = parse_request(body, max_rows_cap)
        return 200, _dumps(handle_query(store, sql, max_rows, timeout_s))
    except StoreError as exc:
        return 400, _dumps({"error": str(exc)})
    except Exception as exc:  # never let a reader take the writer down
        log.exception("live query failed")
        return 500, _dumps({"error": f"query failed: {exc}"})


class LiveServer:
    """A ThreadingHTTPServer on a free loopback port that answers POST / {"sql"} and advertises itself in a sidecar."""

    def __init__(
        self,
        store: Store,
        host: str = "127.0.0.1",
        port: int = 0,
        max_rows: int = DEFAULT_MAX_ROWS,
        timeout_s: float | None = 60.0,
    ) -> None:
        self.store = store
        self.token = store.query_token
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall per answer

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                log.debug("live query %s", format % args)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if token_ok(self.headers.get(TOKEN_HEADER), server_self.token):
                    return True
                self.close_connection = True  # the body, if any, stays unread
                self._send(401, _dumps({"error": f"missing or wrong {TOKEN_HEADER} (see the .live.json sidecar)"}))
                return False

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                # where the store is and who serves it is for the token's holder only
                if self._authorized():
                    self._send(200, _dumps({"store": str(server_self.store.path), "pid": os.getpid()}))

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                if not self._authorized():
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY:
                    self.close_connection = True
                    self._send(400 if length < 0 else 413,
                               _dumps({"error": f"Content-Length must be 0..{MAX_BODY} bytes; {USAGE}"}))
                    return
                body = self.rfile.read(length)
                self._send(*_answer(server_self.store, body, server_self.max_rows, server_self.timeout_s))

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        bound_host, bound_port = self._httpd.server_address[:2]
        self.url = f"http://{bound_host}:{bound_port}/"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="store-live", daemon=True
        )
        self.sidecar: Path = sidecar_path(store.path)

    def start(self) -> None:
        self._thread.start()
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),  # a reader elsewhere (a shared FORGETUI_HOME) cannot reach this loopback URL
            "url": self.url,
            "token": self.token,
            "started_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        tmp = self.sidecar.with_name(f".{self.sidecar.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(info))
        os.replace(tmp, self.sidecar)
        log.info("store %s serves live queries at %s", self.store.path, self.url)

    def stop(self) -> None:
        try:
            info = orjson.loads(self.sidecar.read_bytes())
            if info.get("pid") == os.getpid():
                self.sidecar.unlink(missing_ok=True)
        except (OSError, orjson.JSONDecodeError):
            pass
        self._httpd.shutdown()
        self._httpd.server_close()


def query_app(store: Store, max_rows: int = DEFAULT_MAX_ROWS) -> Any:
    """A Starlette app for POST / {"sql", "max_rows"}; mount it in the proxy at `/_forgetui/sql`.

    Requests must carry `X-Forgetui-Token: <store.query_token>` (also in the `.live.json` sidecar), so the
    harnesses talking to the same proxy cannot read the store.
    """
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def endpoint(request: Request) -> Response:
        if not token_ok(request.headers.get(TOKEN_HEADER), store.query_token):
            return Response(_dumps({"error": f"missing or wrong {TOKEN_HEADER}"}), 401, media_type="application/json")
        status, body = await run_in_threadpool(_answer, store, await request.body(), max_rows, 60.0)
        return Response(body, status, media_type="application/json")

    return Starlette(routes=[Route("/", endpoint, methods=["POST"])])
