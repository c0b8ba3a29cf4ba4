"""Read-only SQL on an open DuckDB connection: the statement guard, the reader lock-down, cancelling, capped fetches."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import duckdb

from core.errors import StoreError
from core.store.behaviour import create_temp_views

DEFAULT_MAX_ROWS = 100_000
ALLOWED_PRAGMAS = frozenset(
    {"table_info", "show_tables", "show_tables_expanded", "database_size", "storage_info", "version",
     "database_list", "show", "metadata_info", "functions", "collations", "platform", "user_agent"}
)
# What a reader connection may do beyond reading its own database: nothing. With external access off DuckDB
# refuses every file and URL a query names (COPY TO, even under EXPLAIN ANALYZE; read_text/read_csv/read_blob/
# read_json/glob; http URLs; ATTACH), extensions are never fetched or loaded on demand, and the lock makes every
# later SET fail, so a query cannot turn any of it back on (checked with duckdb 2.0; docs: "Securing DuckDB").
READER_SETTINGS: dict[str, bool] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,  # last: once set, no setting can change
}


@dataclass
class QueryResult:
    """Columns, rows (lists of values) and whether rows were cut at the row limit."""

    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = False
    types: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"columns": self.columns, "types": self.types, "rows": self.rows, "truncated": self.truncated}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueryResult:
        return cls(list(data["columns"]), [list(r) for r in data["rows"]], bool(data["truncated"]),
                   list(data.get("types") or []))


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    """Split `sql` into statements and refuse anything but SELECT / WITH / DESCRIBE / SHOW / EXPLAIN / PRAGMA info."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise StoreError(f"SQL does not parse: {exc}") from exc
    if not statements:
        raise StoreError("no SQL statement given")
    out = []
    for st in statements:
        kind = st.type
        if kind == duckdb.StatementType.PRAGMA:
            name = st.query.strip().split(None, 1)[1] if len(st.query.split()) > 1 else ""
            name = name.split("(")[0].split("=")[0].strip().rstrip(";").lower()
            if name not in ALLOWED_PRAGMAS:
                raise StoreError(f"PRAGMA {name} is not allowed here; only informational pragmas "
                                 f"({', '.join(sorted(ALLOWED_PRAGMAS))})")
        elif kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
            raise StoreError(
                f"only read-only queries are allowed (SELECT, WITH, DESCRIBE, SHOW, EXPLAIN, PRAGMA table_info); "
                f"got a {kind.name} statement: {st.query.strip()[:80]!r}"
            )
        out.append(st.query)
    return out


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Apply READER_SETTINGS to `con`'s database (global settings, so a writer's database too); idempotent."""
    if con.execute("SELECT current_setting('lock_configuration')").fetchone() == (True,):
        unsafe = [k for k, v in READER_SETTINGS.items()
                  if con.execute(f"SELECT current_setting('{k}')").fetchone() != (v,)]
        if unsafe:
            raise StoreError(f"this database's configuration is locked with {', '.join(unsafe)} still on; "
                             f"open it again without lock_configuration to query it here")
        return
    for name, value in READER_SETTINGS.items():
        con.execute(f"SET {name} = {str(value).lower()}")


class QueryCancel:
    """Cancels a read-only query running on another thread: the connection it runs on is interrupted.

    A query on a store file (or on a run's shards) stops at once ("query interrupted"); one sent to a live
    writer's endpoint runs on there (bounded by its own time limit) and only its answer is dropped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cons: list[duckdb.DuckDBPyConnection] = []
        self.cancelled = False

    def watch(self, con: duckdb.DuckDBPyConnection) -> None:
        """The connection the query runs on (interrupted at once if the cancel came first)."""
        with self._lock:
            self._cons.append(con)
            if not self.cancelled:
                return
        con.interrupt()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            cons = list(self._cons)
        for con in cons:
            try:
                con.interrupt()
            except duckdb.Error:  # closed already: the query ended
                pass


def _size(row: tuple) -> int:
    """About how many bytes a fetched row holds (its texts and blobs, and 16 per other value)."""
    return sum(len(v) if isinstance(v, str | bytes) else 16 * (len(v) if isinstance(v, list | dict) else 1) for v in row)


def _fetch(cur: duckdb.DuckDBPyConnection, max_rows: int, max_bytes: int | None) -> tuple[list[list[Any]], bool]:
    """Up to `max_rows` rows (and, given `max_bytes`, about that many bytes of them); whether more were left."""
    if max_bytes is None:
        rows = [list(r) for r in cur.fetchmany(max_rows + 1)]
        return rows[:max_rows], len(rows) > max_rows
    rows: list[list[Any]] = []
    size = 0
    while len(rows) <= max_rows:
        chunk = cur.fetchmany(min(2048, max_rows + 1 - len(rows)))
        if not chunk:
            return rows, False
        for row in chunk:
            size += _size(row)
            if size > max_bytes and rows:  # cut here: one huge row alone is still answered
                return rows, True
            rows.append(list(row))
    return rows[:max_rows], True


def execute_read_only(cur: duckdb.DuckDBPyConnection, sql: str, max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int | None = None) -> QueryResult:
    """Run checked statements inside a READ ONLY transaction on a locked-down `cur`; the last one's rows are returned.

    `max_bytes` cuts the rows at about that size too (a writer must not hold gigabytes of results for a reader).
    """
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise StoreError(f"max_rows must be a positive integer, not {max_rows!r}")
    if not isinstance(sql, str):
        raise StoreError(f"SQL must be a string, not {type(sql).__name__}")
    lock_down(cur)
    statements = check_read_only(cur, sql)
    try:
        create_temp_views(cur, sql)  # the behaviour views it names (not stored in the file)
    except duckdb.Error as exc:
        raise StoreError(f"query failed: {exc}") from exc
    cur.execute("BEGIN TRANSACTION READ ONLY")
    try:
        for stmt in statements:
            cur.execute(stmt)
        columns = [d[0] for d in cur.description] if cur.description else []
        types = [str(d[1]) for d in cur.description] if cur.description else []
        rows, truncated = _fetch(cur, max_rows, max_bytes) if cur.description else ([], False)
    except duckdb.InterruptException as exc:
        raise StoreError(f"query interrupted: cancelled, or past its time limit ({exc})") from exc
    except duckdb.Error as exc:
        raise StoreError(f"query failed: {exc}") from exc
    except UnicodeDecodeError as exc:
        # DuckDB cuts some error messages (json_extract's "Input: …") at a byte count, inside a UTF-8
        # character; its Python binding then raises this instead of the error it meant to raise.
        raise StoreError(
            "query failed: DuckDB's error message for it was cut inside a character and cannot be shown "
            f"({exc.reason} at byte {exc.start}); a JSON function given a non-JSON value does this: the raw "
            "`calls.*_token_ids` columns are packed, read them from `calls_full`"
        ) from exc
    finally:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass
    return QueryResult(columns, rows, truncated, types)
