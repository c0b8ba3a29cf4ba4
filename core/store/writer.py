"""The single read-write owner of a store file: a background thread batches every write into one transaction."""

from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import queue
import secrets
import signal
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import orjson

from core.errors import StoreError
from core.paths import home
from core.secrets import redact
from core.status import RunStatus
from core.store.behaviour import VIEW_NAMES
from core.store.bodies import BodyDeltas
from core.store.deadletter import dead_letter_bytes
from core.store.filecheck import check_ours, existing_store
from core.store.live import LiveServer, handle_query
from core.store.schema import (
    COLUMNS,
    JSON_COLUMNS,
    PRIMARY_KEYS,
    SCHEMA_SQL,
    SCHEMA_VERSION,
    TIMESTAMP_COLUMNS,
    TOKEN_COLUMNS,
    VIEWS_SQL,
    column_sql,
    q,
)
from core.store.tokens import ids_text, token_text_sql

log = logging.getLogger(__name__)

BACKLOG_WARNING = 50_000
# A full disk (issue 44 item 1): rows whose commit fails for lack of space are held in memory, in order, and retried
# every HOLD_RETRY_S; once they pass `hold_bytes` the store says it is refusing (the proxy answers new calls 507).
# Held rows are never dropped: the bound stops new calls, and rows of calls already answered are still held past it.
HOLD_BYTES = 256 << 20
HOLD_BYTES_ENV = "FORGETUI_STORE_HOLD_BYTES"
HOLD_RETRY_S = 1.0
_DISK_FULL = ("no space left on device", "disk full", "disk quota exceeded", "not enough space")
# DuckDB's block size for new store files (an existing file keeps its own): its smallest, 16 KB, rather than the
# default 256 KB. DuckDB 2.0 gives every table that holds rows, and every index, a block of its own, so the block size
# is most of a short session's store otherwise (token ids are text since schema 6: the integer bit-packing that 16 KB
# blocks turn off no longer matters)
BLOCK_SIZE = 16384
FILE_MODE = 0o600  # a store holds prompts, answers and configs: its owner's only
_FLUSH = object()  # queue marker type tag for flush requests
_STOP = object()


def utcnow() -> dt.datetime:
    """Naive UTC now (the store's TIMESTAMP columns are UTC without a zone)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray, memoryview)):  # a body as sent, kept in store_errors: its text, not its repr
        try:
            return bytes(obj).decode("utf-8")
        except UnicodeDecodeError:
            return str(bytes(obj))
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def to_json_text(value: Any) -> str | None:
    """JSON column value: str/bytes are taken as JSON text, anything else is serialized with orjson."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def to_timestamp(value: Any) -> Any:
    """TIMESTAMP column value: datetimes become naive UTC, numbers are epoch seconds, strings pass through."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, dt.UTC).replace(tzinfo=None)
    return value


def disk_full(exc: BaseException) -> bool:
    """Whether a failed write failed for lack of space (ENOSPC/EDQUOT, as DuckDB words them): the row is fine, the disk is not."""
    text = str(exc).lower()
    return any(marker in text for marker in _DISK_FULL)


def _row_bytes(row: dict[str, Any]) -> int:
    """A cheap estimate of a held row's memory: its text and byte values (the bodies) dominate."""
    total = 64 * len(row)
    for value in row.values():
        if isinstance(value, str | bytes | bytearray):
            total += len(value)
        elif isinstance(value, list | tuple):
            total += 8 * len(value)
        elif isinstance(value, dict):
            total += len(orjson.dumps(value, default=str))
    return total


def _hold_bytes_default() -> int:
    raw = os.environ.get(HOLD_BYTES_ENV)
    if not raw:
        return HOLD_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise StoreError(f"{HOLD_BYTES_ENV}={raw!r} is not a whole number of bytes") from None
    if value < 0:
        raise StoreError(f"{HOLD_BYTES_ENV}={raw!r} must be ≥ 0 bytes")
    return value


def _normalize(table: str, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for col in JSON_COLUMNS[table] & out.keys():
        out[col] = to_json_text(out[col])
    for col in TIMESTAMP_COLUMNS[table] & out.keys():
        out[col] = to_timestamp(out[col])
    for col in TOKEN_COLUMNS.get(table, frozenset()) & out.keys():
        out[col] = ids_text(out[col])
    return out


def _object_array(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise so lists stay list objects, not a 2-D array
        arr[i] = v
    return arr


_LIST_DTYPES = {"INTEGER[]": np.int32, "TINYINT[]": np.int8, "DOUBLE[]": np.float64}


def _column(sql_type: str, values: list[Any]) -> np.ndarray:
    """One column of a batch; numeric lists become numpy arrays, which DuckDB scans much faster than lists."""
    dtype = _LIST_DTYPES.get(sql_type)
    if dtype is not None:
        values = [v if v is None or isinstance(v, np.ndarray) else np.asarray(v, dtype=dtype) for v in values]
    return _object_array(values)


class _Op:
    """One queued write: an `insert` (append rows), `upsert` (rollouts) or `run_status` update."""

    __slots__ = ("kind", "table", "row")

    def __init__(self, kind: str, table: str, row: dict[str, Any]) -> None:
        self.kind, self.table, self.row = kind, table, row


_IDLE_WAIT_S = 5.0


def _close_when_idle(con: duckdb.DuckDBPyConnection) -> bool:
    """Close `con`, waiting (up to _IDLE_WAIT_S) for a query another thread runs on it: DuckDB refuses a close
    while the connection is busy instead of waiting. False when it was still busy at the end."""
    deadline = time.monotonic() + _IDLE_WAIT_S
    while True:
        try:
            con.close()
            return True
        except duckdb.ResourceInUseException:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        except duckdb.Error:  # closed already
            return True


class Store:
    """Read-write handle on one store file. Only one process may hold it; it serves live queries itself."""

    def __init__(
        self,
        path: Path,
        con: duckdb.DuckDBPyConnection,
        *,
        linger_s: float = 0.05,
        max_batch: int = 2000,
        body_deltas: bool = True,
        hold_bytes: int | None = None,
    ) -> None:
        self.path = path
        self._con = con
        self._linger_s = linger_s
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.dead_letter: list[dict[str, Any]] = []
        self.commits = 0
        # rows a full disk refused, in order (the writer thread's; read by health())
        self._held: list[_Op] = []
        self._held_bytes = 0
        self._hold_limit = _hold_bytes_default() if hold_bytes is None else hold_bytes
        self._disk_error: str | None = None
        self._held_since: float | None = None
        self._shown = (0, 0)  # (held rows, held bytes) as of the last attempt: what health() reports
        self._warned_at = 0.0
        self._closed = False
        self._close_lock = threading.Lock()
        # cursors handed out for reads: close ends them, since one left inside a transaction blocks the
        # checkpoint, and FORCE CHECKPOINT then spins until it is interrupted (minutes; seen in a replay)
        self._cursors: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
        # the writer's connection refuses a second call at once ("busy"): handing out a cursor (a live query's
        # thread) and closing never overlap
        self._con_lock = threading.Lock()
        self._thread_error: BaseException | None = None
        # the writer thread's: request bodies stored as splices on earlier ones (off: every body whole, as schema 4 did)
        self._deltas = BodyDeltas(enabled=body_deltas)
        self._live: Any = None
        self.query_token = secrets.token_urlsafe(24)  # required by the live query endpoints
        self._thread = threading.Thread(target=self._run, name=f"store-writer:{path.name}", daemon=True)
        self._thread.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (s := ref()) is not None and s.close())

    # ----------------------------------------------------------------- opening
    @classmethod
    def open(cls, path: str | Path, *, lock_wait_s: float = 10.0, **kwargs: Any) -> Store:
        """Open (or create) a store read-write; waits up to `lock_wait_s` for short-lived readers to let go."""
        path = Path(path).expanduser().resolve()
        existed = existing_store(path)  # before anything touches it: a file that is not a DuckDB database is refused as it is
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + lock_wait_s
        while True:
            try:
                con = duckdb.connect(str(path), config={"default_block_size": str(BLOCK_SIZE)})
                break
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise StoreError(f"cannot open store {path}: {exc}") from exc
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"store {path} is held by another process ({exc}); only one process may write a store: "
                        f"stop the other writer or use a different store path"
                    ) from exc
                time.sleep(0.1)
            except duckdb.Error as exc:
                raise StoreError(f"cannot open store {path}: {exc}") from exc
        try:
            if not existed or check_ours(con, path):  # never chmod a file the project did not create
                owner_only(path)
            arm_wal(path)
            create_schema(con)
        except BaseException:
            con.close()
            raise
        return cls(path, con, **kwargs)

    # ----------------------------------------------------------------- writes (all non-blocking)
    def _enqueue(self, kind: str, table: str, row: dict[str, Any]) -> None:
        if self._closed:
            raise StoreError(f"store {self.path} is closed; open it again to write")
        if self._thread_error is not None:
            raise StoreError(f"store writer thread for {self.path} died: {self._thread_error!r}")
        unknown = row.keys() - COLUMNS[table].keys()
        if unknown:
            raise StoreError(f"unknown column(s) for table {table}: {sorted(unknown)}; known: {list(COLUMNS[table])}")
        self._queue.put(_Op(kind, table, dict(row)))

    def insert_run(self, run_id: str, config: dict[str, Any], status: str = RunStatus.RUNNING) -> None:
        """Create the run's row (or refresh its config and status when it already exists, e.g. on resume)."""
        self._enqueue("upsert", "runs", {"run_id": run_id, "config": redact(config), "status": status, "created_at": utcnow()})

    def update_run_status(self, run_id: str, status: str) -> None:
        self._enqueue("run_status", "runs", {"run_id": run_id, "status": status})

    def upsert_rollout(self, row: dict[str, Any]) -> None:
        """Insert a rollout or update only the columns given in `row` (which must hold `rollout_id`)."""
        if "rollout_id" not in row:
            raise StoreError("upsert_rollout needs a 'rollout_id'")
        self._enqueue("upsert", "rollouts", row)

    def record_call(self, row: dict[str, Any]) -> None:
        """Queue one call row (durable within ~linger + one commit); never touches the disk in the caller."""
        self._enqueue("insert", "calls", row)

    def record_blob(self, row: dict[str, Any]) -> None:
        """Store an image once per `sha256` (an upsert: writing the same hash again adds no row)."""
        self._enqueue("upsert", "blobs", row)

    def insert_samples(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self._enqueue("insert", "samples", {"created_at": utcnow(), **row})

    def insert_train_step(self, row: dict[str, Any]) -> None:
        self._enqueue("insert", "train_steps", {"created_at": utcnow(), **row})

    def set_meta(self, key: str, value: str | None) -> None:
        """Set one `meta` row (None: remove it) once everything queued before is committed: meta rows are few and
        rare, so they skip the batch queue and commit in one transaction of their own on the writer's connection."""
        self.flush()
        cur = self.cursor()
        try:
            cur.execute("BEGIN")
            cur.execute("DELETE FROM meta WHERE key = ?", [key])  # meta has no key constraint
            if value is not None:
                cur.execute("INSERT INTO meta VALUES (?, ?)", [key, value])
            cur.execute("COMMIT")
        except duckdb.Error:
            cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued before this call is committed (or dead-lettered)."""
        if self._thread_error is not None:
            raise StoreError(f"store writer thread died: {self._thread_error!r}")
        if not self._thread.is_alive():
            if self._closed:
                return
            raise StoreError("store writer thread is not running")
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        if not done.wait(timeout):
            raise StoreError(f"store flush did not finish within {timeout} s")
        if self._thread_error is not None:
            raise StoreError(f"store writer thread died: {self._thread_error!r}")

    async def aflush(self) -> None:
        """`flush` for asyncio callers (runs in a worker thread)."""
        import asyncio

        await asyncio.to_thread(self.flush)

    def pending(self) -> int:
        """Approximate number of queued, not yet committed writes."""
        return self._queue.qsize()

    # ----------------------------------------------------------------- reads in this process
    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of the writer's connection for reads in this process (one per thread)."""
        with self._con_lock:
            if self._closed:
                raise StoreError(f"store {self.path} is closed")
            cur = self._con.cursor()
            self._cursors.add(cur)
            return cur

    def serve_queries(self, host: str = "127.0.0.1", **kwargs: Any) -> str:
        """Serve read-only SQL over HTTP on a free loopback port and write `<store>.live.json`; returns the URL."""
        if self._live is None:
            self._live = LiveServer(self, host=host, **kwargs)
            self._live.start()
        return self._live.url

    def handle_query(self, sql: str, max_rows: int | None = None) -> dict[str, Any]:
        """Run one read-only query on its own cursor and return it as a JSON-ready dict."""
        return handle_query(self, sql, max_rows=max_rows)

    # ----------------------------------------------------------------- closing
    def close(self) -> None:
        """Flush, checkpoint and close; idempotent and safe from atexit or a signal handler's caller."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        if self._held:
            self._spill_held()
        with self._con_lock:  # from here no cursor is handed out (cursor() sees _closed)
            for cur in list(self._cursors):  # a reader's open transaction would block the checkpoint
                _close_when_idle(cur)
            try:
                self._con.execute("CHECKPOINT")
            except duckdb.Error as exc:  # the data is in the WAL either way: the next open replays it
                log.warning("checkpoint of %s failed on close: %s", self.path, exc)
            if not _close_when_idle(self._con):
                log.warning("store %s: a reader's query still ran after %.0f s; closed without waiting for it", self.path, _IDLE_WAIT_S)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- the writer thread
    def _run(self) -> None:
        with self._con_lock:
            cur = self._con.cursor()
        try:
            while True:
                try:
                    item = self._queue.get(timeout=HOLD_RETRY_S) if self._held else self._queue.get()
                except queue.Empty:  # rows held for a full disk: try them again
                    self._write_batch(cur, [])
                    continue
                batch: list[_Op] = []
                waiters: list[threading.Event] = []
                stop = False
                deadline = time.monotonic() + self._linger_s
                while True:
                    stop = _sort(item, batch, waiters) or stop
                    if stop or waiters or len(batch) >= self._max_batch:
                        # a flush or stop commits now; drain what is already queued first
                        try:
                            while len(batch) < self._max_batch:
                                stop = _sort(self._queue.get_nowait(), batch, waiters) or stop
                        except queue.Empty:
                            pass
                        break
                    remaining = deadline - time.monotonic()
                    try:
                        item = self._queue.get(timeout=max(remaining, 0)) if remaining > 0 else self._queue.get_nowait()
                    except queue.Empty:
                        break
                if batch or self._held:
                    self._write_batch(cur, batch)
                    backlog = self._queue.qsize()
                    if backlog > BACKLOG_WARNING and time.monotonic() - self._warned_at > 10:
                        self._warned_at = time.monotonic()
                        log.warning("store %s is falling behind: %d writes queued", self.path, backlog)
                for w in waiters:
                    w.set()
                if stop:
                    return
        except BaseException as exc:  # keep the reason for flush() callers
            self._thread_error = exc
            log.exception("store writer thread for %s died", self.path)
            raise
        finally:
            cur.close()
            self._release_waiters()

    def _release_waiters(self) -> None:
        try:
            while True:
                item = self._queue.get_nowait()
                if isinstance(item, tuple) and item and item[0] is _FLUSH:
                    item[1].set()
        except queue.Empty:
            pass

    def _write_batch(self, cur: duckdb.DuckDBPyConnection, batch: list[_Op]) -> None:
        try:
            self._write_ops(cur, batch)
        finally:  # what health() reports changes between attempts only, never while held rows are being retried
            self._shown = (len(self._held), self._held_bytes)

    def _write_ops(self, cur: duckdb.DuckDBPyConnection, batch: list[_Op]) -> None:
        if self._held:  # rows a full disk refused go first, so writes keep their order
            batch = self._take_held() + batch
        arm_wal(self.path)  # a checkpoint removed it: the next commit would create it with the umask's mode
        try:
            cur.execute("BEGIN TRANSACTION")
            self._apply(cur, batch)
            cur.execute("COMMIT")
            self._deltas.commit()
            self.commits += 1
            self._disk_ok()
            return
        except Exception as exc:
            self._deltas.discard()
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass
            if not disk_full(exc):
                log.warning("store batch of %d writes failed (%s); retrying row by row", len(batch), exc)
        for i, op in enumerate(batch):  # row by row, each its own transaction, so one bad row loses only itself
            arm_wal(self.path)
            try:
                cur.execute("BEGIN TRANSACTION")
                self._apply(cur, [op])
                cur.execute("COMMIT")
                self._deltas.commit()
                self.commits += 1
            except Exception as exc:
                self._deltas.discard()
                try:
                    cur.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                if disk_full(exc) or not self._dead(cur, op, exc):
                    self._hold(batch[i:], exc)  # this row and every later one, in order: retried when space returns
                    return
        self._disk_ok()

    # ----------------------------------------------------------------- a full disk
    def _hold(self, ops: list[_Op], exc: BaseException) -> None:
        """Keep rows a full disk refused (never dropped; `health` reports them, the proxy refuses calls past the bound)."""
        first = self._disk_error is None
        for op in ops:
            self._held.append(op)
            self._held_bytes += _row_bytes(op.row)
        self._disk_error = str(exc)
        if first:
            self._held_since = time.monotonic()
            log.error("store %s: the disk is full (%s); holding %d row(s) in memory and retrying every %.0f s", self.path, exc, len(self._held), HOLD_RETRY_S)

    def _spill_held(self) -> None:
        """At close with rows still held (the disk never had space again): write them, one JSON object a line, under
        FORGETUI_HOME/held/ (another volume, as a rule), so closing loses nothing silently."""
        ops = self._take_held()
        target = home() / "held" / f"{self.path.name}.{os.getpid()}.{int(time.time())}.jsonl"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                for op in ops:
                    f.write(dead_letter_bytes({"store": str(self.path), "kind": op.kind, "table": op.table, "row": op.row}) + b"\n")
            log.error("store %s closed with %d row(s) a full disk refused: they are in %s (one JSON object a line)", self.path, len(ops), target)
        except OSError as exc:
            log.error("store %s closed with %d row(s) a full disk refused, and they could not be written to %s either (%s): they are lost", self.path, len(ops), target, exc)

    def _take_held(self) -> list[_Op]:
        ops, self._held, self._held_bytes = self._held, [], 0
        return ops

    def _disk_ok(self) -> None:
        if self._disk_error is not None and not self._held:
            log.warning("store %s: writing again; every held row is stored", self.path)
            self._disk_error, self._held_since = None, None

    def health(self) -> dict[str, Any]:
        """The store's state: ok; degraded (rows held for a full disk, retried); refusing (held rows past the bound)."""
        held, held_bytes = self._shown
        if self._thread_error is not None:
            return {"state": "refusing", "held_rows": held, "held_bytes": held_bytes, "error": f"store writer thread died: {self._thread_error!r}"}
        if not held and self._disk_error is None:
            return {"state": "ok", "held_rows": 0, "held_bytes": 0}
        state = "refusing" if held_bytes >= self._hold_limit else "degraded"
        return {"state": state, "held_rows": held, "held_bytes": held_bytes, "limit_bytes": self._hold_limit, "error": self._disk_error}

    def refusing(self) -> str | None:
        """Why new calls must be refused now (held rows past the bound, or a dead writer), or None while it can take them."""
        health = self.health()
        if health["state"] != "refusing":
            return None
        return (
            f"the call was not run: the store cannot record it ({health.get('error')}); {health['held_rows']} recorded call(s) "
            f"({health['held_bytes'] >> 20} MiB) are held in memory until the disk of {self.path} has space again. Free space there and retry"
        )

    def _dead(self, cur: duckdb.DuckDBPyConnection, op: _Op, exc: Exception) -> bool:
        """Keep a row that failed: as JSON in `store_errors`, else as bytes in `dead_letters` (which cannot refuse them);
        False when neither took it (a full disk): the caller holds it."""
        pk = PRIMARY_KEYS.get(op.table)
        key = op.row.get(pk) if pk else None
        entry = {"at": utcnow(), "table_name": op.table, "row": op.row, "error": str(exc)}
        self.dead_letter.append(entry)
        try:
            cur.execute(
                "INSERT INTO store_errors VALUES (?, ?, ?, ?)",
                [entry["at"], op.table, to_json_text(op.row), str(exc)],
            )
            log.error("store: a %s row (%s=%r) could not be stored as given; kept as JSON in store_errors: %s", op.table, pk, key, exc)
            return True
        except Exception as exc2:  # noqa: BLE001 - the row itself cannot be JSON here: keep its bytes
            error = f"{exc}; and as JSON in store_errors: {exc2}"
        try:
            cur.execute(
                "INSERT INTO dead_letters VALUES (?, ?, ?, ?, ?)",
                [entry["at"], op.table, None if key is None else str(key), dead_letter_bytes(op.row), error],
            )
            log.error("store: kept the %s row %r as raw bytes in dead_letters (%s)", op.table, key, error)
            return True
        except Exception as exc3:  # noqa: BLE001 - a full disk or a broken database: the caller holds the row
            self.dead_letter.pop()
            log.error("store: could not keep the failed %s row %r even as bytes (%s); holding it to retry", op.table, key, exc3)
            return False

    def problem_counts(self) -> dict[str, int]:
        """Rows kept because they could not be stored as given: {'store_errors': n, 'dead_letters': m} (after a flush)."""
        self.flush()
        return dict(self.cursor().execute("SELECT kept_in, rows FROM store_problems").fetchall())

    def _apply(self, cur: duckdb.DuckDBPyConnection, ops: list[_Op]) -> None:
        inserts: dict[str, list[dict[str, Any]]] = {}
        for op in ops:
            if op.kind == "insert":
                inserts.setdefault(op.table, []).append(op.row)
                continue
            self._flush_inserts(cur, inserts)  # keep the order of writes to the same table
            row = _normalize(op.table, op.row)
            if op.kind == "run_status":
                cur.execute("UPDATE runs SET status = ? WHERE run_id = ?", [row["status"], row["run_id"]])
            else:
                _upsert(cur, op.table, row)
        self._flush_inserts(cur, inserts)

    def _flush_inserts(self, cur: duckdb.DuckDBPyConnection, inserts: dict[str, list[dict[str, Any]]]) -> None:
        for table, rows in inserts.items():
            normal = [_normalize(table, r) for r in rows]
            if table == "calls":  # each body whole or as a splice on an earlier one (core/store/bodies.py)
                for row in normal:
                    if "request" in row:
                        row.update(self._deltas.encode(row, row["request"]))
            _bulk_insert(cur, table, normal)
        inserts.clear()


def _sort(item: Any, batch: list[_Op], waiters: list[threading.Event]) -> bool:
    """Put one queued item where the writer loop wants it: a write in `batch`, a flush's event in
    `waiters`; True for the stop sentinel."""
    if item is _STOP:
        return True
    if isinstance(item, tuple) and item and item[0] is _FLUSH:
        waiters.append(item[1])
    else:
        batch.append(item)
    return False


def _upsert(cur: duckdb.DuckDBPyConnection, table: str, row: dict[str, Any]) -> None:
    """Insert ``row``, or set its columns on the row with the same key.

    A keyed UPDATE, then an INSERT when it touched nothing, rather than INSERT ... ON CONFLICT: DuckDB
    runs the conflict path at about four times the CPU of the UPDATE (3 ms against 0.7 ms a row), and a
    run writes several status changes per rollout. The writer thread is the only writer, so nothing can
    insert the key between the two statements.
    """
    pk = PRIMARY_KEYS[table]
    cols = list(row)
    updates = [c for c in cols if c != pk]
    if updates:
        sql = f"UPDATE {table} SET {', '.join(f'{q(c)} = ?' for c in updates)} WHERE {q(pk)} = ?"
        (changed,) = cur.execute(sql, [row[c] for c in updates] + [row[pk]]).fetchone()
    else:
        (changed,) = cur.execute(f"SELECT count(*) FROM {table} WHERE {q(pk)} = ?", [row[pk]]).fetchone()
    if not changed:
        cur.execute(f"INSERT INTO {table} ({', '.join(map(q, cols))}) VALUES ({', '.join('?' for _ in cols)})", [row[c] for c in cols])


def _bulk_insert(cur: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
    """Append rows in one statement by scanning a dict of numpy object arrays (far faster than executemany)."""
    if not rows:
        return
    types = COLUMNS[table]
    cols = [c for c in types if any(c in r for r in rows)]
    if len(rows) == 1:
        row = rows[0]
        cur.execute(
            f"INSERT INTO {table} ({', '.join(map(q, cols))}) VALUES ({', '.join('?' for _ in cols)})",
            [row.get(c) for c in cols],
        )
        return
    data = {f"c{i}": _column(types[c], [r.get(c) for r in rows]) for i, c in enumerate(cols)}
    select = ", ".join(f"CAST(c{i} AS {types[c]})" for i, c in enumerate(cols))
    view = f"_forgetui_batch_{threading.get_ident()}"
    cur.register(view, data)
    try:
        cur.execute(f"INSERT INTO {table} ({', '.join(map(q, cols))}) SELECT {select} FROM {view}")
    finally:
        cur.unregister(view)


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create every table (idempotent), check the file's schema version, then (re)create the views and macros."""
    try:
        con.execute(SCHEMA_SQL)
        found = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if found is None:
            con.execute(
                "INSERT INTO meta VALUES ('schema_version', ?), ('created_at', ?)",
                [str(SCHEMA_VERSION), utcnow().isoformat()],
            )
        elif int(found[0]) > SCHEMA_VERSION:
            raise StoreError(
                f"this store has schema version {found[0]}, newer than this forgetui ({SCHEMA_VERSION}); "
                f"upgrade forgetui to open it"
            )
        elif int(found[0]) < SCHEMA_VERSION:
            migrate(con)
            con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
        con.execute(VIEWS_SQL)
    except duckdb.Error as exc:
        raise StoreError(f"cannot create the store schema: {exc}") from exc


def migrate(con: duckdb.DuckDBPyConnection) -> None:
    """Bring an older store up to this schema: add the columns it lacks, and turn INTEGER[] token columns (before
    schema 6) into token text in place (they keep DuckDB's default compression: ALTER cannot choose one); the
    behaviour views older stores kept in the file go (queries get them as TEMP views, core/store/behaviour.py)."""
    for name in VIEW_NAMES:
        con.execute(f"DROP VIEW IF EXISTS {name}")
    for table, columns in COLUMNS.items():
        have = dict(con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?", [table]).fetchall())
        for column, sql_type in columns.items():
            if column not in have:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {q(column)} {column_sql(table, column, sql_type)}")
            elif column in TOKEN_COLUMNS.get(table, ()) and have[column] != sql_type:
                log.info("store: turning %s.%s (%s) into token text", table, column, have[column])
                con.execute(f"ALTER TABLE {table} ALTER COLUMN {q(column)} SET DATA TYPE {sql_type} USING {token_text_sql(q(column))}")


def owner_only(path: Path) -> None:
    """Make a store file readable and writable by its owner only (a warning where that is not allowed)."""
    try:
        os.chmod(path, FILE_MODE)
    except OSError as exc:
        log.warning("could not make %s readable by its owner only: %s", path, exc)


def arm_wal(path: Path) -> None:
    """Create the store's write-ahead log owner-only before DuckDB does: DuckDB keeps an existing file's mode."""
    wal = Path(f"{path}.wal")
    try:
        fd = os.open(wal, os.O_CREAT | os.O_WRONLY, FILE_MODE)
    except OSError as exc:
        log.warning("could not create %s owner-only: %s", wal, exc)
        return
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError:
        pass
    finally:
        os.close(fd)


def install_signal_flush(store: Store, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
    """Close `store` on SIGINT/SIGTERM, then hand the signal to the previous handler (main thread only).

    Servers that own their signal handling (uvicorn) should instead close the store in their shutdown hook.
    """

    for signum in signals:
        previous = signal.getsignal(signum)

        def handler(sig: int, frame: Any, previous: Any = previous) -> None:
            store.close()
            if callable(previous):
                previous(sig, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(sig, signal.SIG_DFL)
                signal.raise_signal(sig)

        signal.signal(signum, handler)
