"""Live reads of a store while its writer runs: one token-guarded loopback endpoint, in the writer's process.

The one live query server (`LiveServer`): `GET /` says which store it serves, `POST /` with
``{"sql", "max_rows"}`` answers one read-only query as ``{"columns", "types", "rows", "truncated"}``.
A reader shares the writer's process and DuckDB database, so everything a query may cost is bounded
before it costs it (the writer, and the proxy feeding it, must outlive any query):

- HTTP: uvicorn on its own thread and event loop (core.serving), not a thread per
  connection; each request in whole within 10 s; wrong paths, methods, framing and tokens answered
  in JSON. A connection counts against `MAX_CONNECTIONS` only once its headers carried the token
  (`LiveProtocol`): until then it is one of at most `MAX_PENDING` (the oldest is cut for a new one)
  and must finish its headers within `HEADER_TIMEOUT_S`, so clients without the token can never
  keep the token holder out (issue 44 item 3).
- size: a body of at most 128 KiB and SQL of at most 64 KiB; repeated JSON keys refused.
- planning: first in a sacrificial child process on an empty copy of the schema, within 2 s and
  512 MiB (core.store.planner); DuckDB's own planner can be neither interrupted nor bounded.
- running: `WORKERS` queries at a time and `MAX_WAITING` queued (then 503), each interrupted after
  `timeout_s`, and interrupted when its client leaves; DuckDB's `memory_limit` and `threads` for the
  database are set before its configuration is locked; rows are cut at `max_rows` and at about
  `MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import hmac
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any, Protocol

import duckdb
import orjson

from core.errors import BodyTooLargeError, ForgetuiError, ProtocolError, StoreError, status_of
from core.protocols.body import load_json
from core.serving import (
    BackgroundServer,
    ClientGone,
    HardenedProtocol,
    Hardening,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_bytes,
)
from core.store.planner import Planner
from core.store.readonly import (
    DEFAULT_MAX_ROWS,
    READER_SETTINGS,
    QueryCancel,
    check_read_only,
    execute_read_only,
    lock_down,
)
from core.store.schema import BEHAVIOUR_VIEWS, SCHEMA_SQL, VIEWS_SQL
from core.store.sidecar import sidecar_path


class LiveStore(Protocol):
    """What the live endpoint needs of the store it serves (`core.store.writer.Store` is one): the endpoint does
    not import the writer that starts it."""

    path: Path
    query_token: str

    def cursor(self) -> duckdb.DuckDBPyConnection: ...

log = logging.getLogger(__name__)

TOKEN_HEADER = "X-Forgetui-Token"
MAX_BODY = 128 << 10  # a query is text; a bigger body is refused unread
MAX_SQL_BYTES = 64 << 10
MAX_ANSWER_BYTES = 64 << 20
MAX_CONNECTIONS = 64  # connections that sent the token
MAX_PENDING = 32  # connections whose headers are still coming (no token seen yet)
HEADER_TIMEOUT_S = 2.0  # a loopback client sends its headers in microseconds
REQUEST_TIMEOUT_S = 10.0
WORKERS = 2
MAX_WAITING = 16
# DuckDB's global limits for the writer's database, reader and writer together: a query past them fails
# ("Out of Memory Error"), the process lives (its default is 80% of the machine's memory, every core)
DATABASE_LIMITS: dict[str, Any] = {"memory_limit": "2GB", "threads": 2, "max_temp_directory_size": "8GB"}
USAGE = 'send a JSON body {"sql": "<one read-only query>", "max_rows": <positive integer, optional>}'


class LiveError(ForgetuiError):
    """A live query the endpoint will not run now (`kind` gives its HTTP status)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def token_ok(given: str | None, token: str) -> bool:
    """Constant-time check of a header value; any text (non-ASCII too) compares as bytes, never raises."""
    return hmac.compare_digest((given or "").encode("utf-8", "surrogateescape"), token.encode())


def parse_request(body: bytes, max_rows_cap: int) -> tuple[str, int]:
    """The (sql, max_rows) of a query body; StoreError (HTTP 400) with USAGE for anything else."""
    try:
        req = load_json(body, "body")
    except ProtocolError as exc:
        raise StoreError(f"{exc}; {USAGE}") from None
    if not isinstance(req, dict) or not isinstance(req.get("sql"), str):
        raise StoreError(f'"sql" must be a string; {USAGE}')
    if len(req["sql"].encode("utf-8", "surrogatepass")) > MAX_SQL_BYTES:
        raise LiveError("too_large", f"the SQL is over {MAX_SQL_BYTES >> 10} KiB; send a shorter query")
    max_rows = req.get("max_rows")
    if max_rows is None:
        return req["sql"], max_rows_cap
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise StoreError(f'"max_rows" must be a positive integer, not {max_rows!r}; {USAGE}')
    return req["sql"], min(max_rows, max_rows_cap)


def handle_query(store: LiveStore, sql: str, max_rows: int | None = None, timeout_s: float | None = 60.0) -> dict[str, Any]:
    """Run read-only `sql` in this process on a fresh cursor of the writer's connection (code's own reads, not a client's)."""
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


def limit_database(store: LiveStore, limits: dict[str, Any]) -> None:
    """Set DuckDB's global `limits` on the writer's database while its configuration can still change."""
    cur = store.cursor()
    try:
        if cur.execute("SELECT current_setting('lock_configuration')").fetchone() == (True,):
            log.warning("store %s: its configuration is locked already; live queries run without %s", store.path, ", ".join(limits))
            return
        for name, value in limits.items():
            cur.execute(f"SET {name} = {value if isinstance(value, int) else repr(str(value))}")
    finally:
        cur.close()


def _plain(value: Any) -> Any:
    """A value orjson cannot write, as text: a HUGEINT past 64 bits, a TIMETZ (time with a zone), in lists and maps too."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    if isinstance(value, dt.time) and value.tzinfo is not None:
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _dumps(data: Any) -> bytes:
    try:
        return orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # rare types: walk the answer once
        return orjson.dumps(_plain(data), default=str, option=orjson.OPT_NON_STR_KEYS)


class QueryRunner:
    """Runs live queries on the writer's connection: a few at a time, planned first in a child, each time- and size-bounded."""

    def __init__(self, store: LiveStore, planner: Planner, timeout_s: float | None, max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.store = store
        self.planner = planner
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._pool = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="store-live-query")
        self._admitted = 0  # touched on the server's event loop only

    async def run(self, sql: str, max_rows: int, receive: Receive) -> dict[str, Any]:
        """The query's answer; ClientGone (and the query interrupted) when its client leaves first."""
        if self._admitted >= WORKERS + MAX_WAITING:
            raise LiveError("overloaded", f"{self._admitted} live queries are running or waiting; try again shortly")
        self._admitted += 1
        cancel = QueryCancel()
        work = asyncio.get_running_loop().run_in_executor(self._pool, self._run, sql, max_rows, cancel)
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                _interrupt_until_done(work, cancel)
                raise ClientGone()
            return work.result()
        finally:
            gone.cancel()
            self._admitted -= 1

    def _run(self, sql: str, max_rows: int, cancel: QueryCancel) -> dict[str, Any]:
        if cancel.cancelled:
            raise ClientGone()
        cur = self.store.cursor()
        cancel.watch(cur)
        timer = threading.Timer(self.timeout_s, cur.interrupt) if self.timeout_s else None
        try:
            lock_down(cur)
            check_read_only(cur, sql)  # parsing only: linear in the (bounded) text
            self.planner.check(sql)  # planning, where it cannot take the writer down
            if timer is not None:
                timer.daemon = True
                timer.start()
            return execute_read_only(cur, sql, max_rows, self.max_answer_bytes).to_dict()
        finally:
            if timer is not None:
                timer.cancel()
            cur.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _interrupt_until_done(work: asyncio.Future, cancel: QueryCancel) -> None:
    """Interrupt the query now and every 0.1 s until its work ends: DuckDB forgets an interrupt that comes
    while its connection runs nothing yet (the query still being rehearsed, or about to start)."""
    if not work.done():
        cancel.cancel()
        asyncio.get_running_loop().call_later(0.1, _interrupt_until_done, work, cancel)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class LiveApp:
    """The ASGI app of the live endpoint (routes: GET / and POST /, with the token)."""

    def __init__(self, store: LiveStore, runner: QueryRunner, max_rows: int) -> None:
        self.store = store
        self.runner = runner
        self.max_rows = max_rows

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        extra = None
        try:
            status, answer, extra = await self._answer(scope, receive)
        except ClientGone:
            return
        except BodyTooLargeError as exc:
            status, answer = 413, {"error": f"{exc}; {USAGE}"}
        except LiveError as exc:
            status, answer = status_of(exc.kind), {"error": str(exc)}
        except StoreError as exc:  # the query's own fault: refused, failed, interrupted
            status, answer = 400, {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a reader never takes the writer down
            log.exception("live query failed")
            status, answer = 500, {"error": f"query failed: {type(exc).__name__}: {exc}"}
        await send_bytes(send, status, _dumps(answer), extra=extra)

    async def _answer(self, scope: Scope, receive: Receive) -> tuple[int, Any, list | None]:
        if scope["path"] != "/":
            return 404, {"error": f"no route {scope['path']!r}: the live endpoint answers GET / and POST / only"}, None
        if scope["method"] not in ("GET", "POST"):
            return 405, {"error": f"{scope['method']} is not served: the live endpoint answers GET / and POST / only"}, [(b"allow", b"GET, POST")]
        if not token_ok(header(scope, TOKEN_HEADER.lower().encode()), self.store.query_token):
            # where the store is and who serves it is for the token's holder only; the body stays unread
            return 401, {"error": f"missing or wrong {TOKEN_HEADER} (see the .live.json sidecar)"}, [(b"connection", b"close")]
        if scope["method"] == "GET":
            return 200, {"store": str(self.store.path), "pid": os.getpid()}, None
        sql, max_rows = parse_request(await read_body(scope, receive, MAX_BODY), self.max_rows)
        return 200, await self.runner.run(sql, max_rows, receive), None


class LiveProtocol(HardenedProtocol):
    """The live endpoint's HTTP protocol: authenticated before it counts against the cap.

    Hand-written on uvicorn's protocol because uvicorn caps connections before it has read a byte
    (`limit_concurrency`), which lets clients without the token take every slot. Here a connection is
    *pending* until its headers are complete: pending ones are at most `MAX_PENDING` (a new one cuts
    the oldest) and each has `HEADER_TIMEOUT_S` for its headers; one whose headers carry the token
    joins the authenticated ones (at most `MAX_CONNECTIONS`, which only token holders reach); one
    without it gets its 401 from the app and is closed.
    """

    token: str = ""
    pending: dict[LiveProtocol, None]  # insertion order: the oldest first (one dict per server, set by `live_protocol`)
    authenticated: set[LiveProtocol]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if transport.is_closing():
            return
        self._header_deadline: asyncio.TimerHandle | None = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_too_slow)
        self.pending[self] = None
        while len(self.pending) > MAX_PENDING:
            oldest = next(iter(self.pending))
            log.warning("live endpoint: %d connections without the token are sending headers; cutting the oldest", len(self.pending))
            message = f"{len(self.pending)} connections are sending their headers, the most allowed; send the request in whole at once"
            oldest._cut(b"503 Service Unavailable", message)

    def on_headers_complete(self) -> None:
        self._stop_header_deadline()
        self.pending.pop(self, None)
        if self not in self.authenticated and token_ok(_header_value(self.headers, TOKEN_HEADER.lower().encode()), self.token):
            if len(self.authenticated) >= MAX_CONNECTIONS:
                message = f"{len(self.authenticated)} live query connections are open, the most allowed; close some and retry"
                self.transport.write(_http_response(b"503 Service Unavailable", orjson.dumps({"error": message})))
                self.transport.close()
                return
            self.authenticated.add(self)
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_deadline()
        self.pending.pop(self, None)
        self.authenticated.discard(self)
        super().connection_lost(exc)

    def _stop_header_deadline(self) -> None:
        deadline = getattr(self, "_header_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self in self.pending and not self.transport.is_closing():
            self._cut(b"408 Request Timeout", f"the request headers were not sent within {HEADER_TIMEOUT_S:g} s")

    def _cut(self, status: bytes, message: str) -> None:
        """Answer `status` with `message` (JSON) and close: a connection that never sent its headers in whole."""
        self.pending.pop(self, None)
        self._stop_header_deadline()
        if not self.transport.is_closing():
            self.transport.write(_http_response(status, orjson.dumps({"error": message})))
            self.transport.close()


def _header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _http_response(status: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode()
    return head + b"\r\nconnection: close\r\n\r\n" + body


def live_protocol(token: str) -> type[LiveProtocol]:
    """A protocol class for one live server: its token, its own pending and authenticated connections."""
    hardening = Hardening(request_timeout_s=REQUEST_TIMEOUT_S, max_connections=None, bad_request=lambda message: orjson.dumps({"error": message}))
    return type("LiveProtocol", (LiveProtocol,), {"hardening": hardening, "token": token, "pending": {}, "authenticated": set()})


class _LiveBackgroundServer(BackgroundServer):
    """A BackgroundServer that speaks `LiveProtocol` (serving.py builds uvicorn's config with its own protocol class)."""

    def __init__(self, app: Any, host: str, port: int, protocol: type[LiveProtocol], name: str) -> None:
        super().__init__(app, host, port, protocol.hardening, name=name)
        self._server.config.http = protocol  # read when uvicorn loads its config, at serve()


class LiveServer:
    """The live endpoint on a free loopback port, advertised in the store's `.live.json` sidecar (its URL and token)."""

    def __init__(
        self,
        store: LiveStore,
        host: str = "127.0.0.1",
        port: int = 0,
        max_rows: int = DEFAULT_MAX_ROWS,
        timeout_s: float | None = 60.0,
        *,
        database_limits: dict[str, Any] | None = None,
        plan_deadline_s: float | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.store = store
        self.token = store.query_token
        self.max_rows = max_rows
        limit_database(store, DATABASE_LIMITS if database_limits is None else database_limits)
        # the rehearsal's empty store holds the behaviour views too (the writer's queries get them as TEMP views), so a
        # query naming them is planned there as it will be here
        rehearsal_ddl = "\n".join([SCHEMA_SQL, VIEWS_SQL, *(ddl for _, _, ddl in BEHAVIOUR_VIEWS)])
        self.planner = Planner(rehearsal_ddl, READER_SETTINGS, **({"deadline_s": plan_deadline_s} if plan_deadline_s else {}))
        self.runner = QueryRunner(store, self.planner, timeout_s, max_answer_bytes)
        self._server = _LiveBackgroundServer(LiveApp(store, self.runner, max_rows), host, port, live_protocol(self.token), name="store-live")
        self.url = ""
        self.sidecar: Path = sidecar_path(store.path)

    def start(self) -> None:
        self.planner.start()
        self.url = self._server.start() + "/"
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
        self._server.stop()
        self.runner.close()
        self.planner.stop()

