"""Read-only SQL on a store from any process: through the writer's live endpoint, or the file opened read-only."""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from core import paths
from core.errors import StoreError

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 100_000
SHARDS_DIR = "shards"  # runs/<run_id>/shards/<shard>/store.duckdb: one store per veRL agent-loop worker
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


def execute_read_only(cur: duckdb.DuckDBPyConnection, sql: str, max_rows: int = DEFAULT_MAX_ROWS) -> QueryResult:
    """Run checked statements inside a READ ONLY transaction on a locked-down `cur`; the last one's rows are returned."""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise StoreError(f"max_rows must be a positive integer, not {max_rows!r}")
    if not isinstance(sql, str):
        raise StoreError(f"SQL must be a string, not {type(sql).__name__}")
    lock_down(cur)
    statements = check_read_only(cur, sql)
    cur.execute("BEGIN TRANSACTION READ ONLY")
    try:
        for stmt in statements:
            cur.execute(stmt)
        columns = [d[0] for d in cur.description] if cur.description else []
        types = [str(d[1]) for d in cur.description] if cur.description else []
        rows = [list(r) for r in cur.fetchmany(max_rows + 1)] if cur.description else []
    except duckdb.InterruptException as exc:
        raise StoreError(f"query interrupted: cancelled, or past its time limit ({exc})") from exc
    except duckdb.Error as exc:
        raise StoreError(f"query failed: {exc}") from exc
    finally:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass
    truncated = len(rows) > max_rows
    return QueryResult(columns, rows[:max_rows], truncated, types)


# ---------------------------------------------------------------------- finding the store and its writer
def sidecar_path(store_path: Path) -> Path:
    """`<store>.live.json`: written by a writer that serves live queries."""
    return Path(str(store_path) + ".live.json")


def process_state(pid: int) -> str | None:
    """The one-letter state in /proc/<pid>/stat (R, S, Z...), or None where there is no such file."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else None


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot, /proc/<pid>/stat field 22): tells a reused pid apart; None if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether `pid` runs: not gone, not a zombie (dead, not yet reaped), and (given `started`) not a reused pid."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if process_state(pid) in ("Z", "X"):  # killed; only its exit status is left for its parent to read
        return False
    return started is None or process_start(pid) in (None, started)


def read_sidecar(store_path: Path) -> dict[str, Any] | None:
    """The live endpoint of the store's writer, or None; a sidecar left by a dead process is removed."""
    side = sidecar_path(store_path)
    try:
        info = orjson.loads(side.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", side, exc)
        return None
    pid = int(info.get("pid", 0))
    if pid <= 0 or not pid_alive(pid):
        log.info("removing stale %s (pid %s is gone)", side, pid)
        side.unlink(missing_ok=True)
        return None
    return info


def run_query(
    store_path: str | Path, sql: str, *, max_rows: int = DEFAULT_MAX_ROWS, timeout: float = 60.0, cancel: QueryCancel | None = None
) -> QueryResult:
    """Run read-only SQL on a store, live (through its writer) or from the file; never blocks the writer."""
    import httpx

    store_path = Path(store_path).expanduser().resolve()
    info = read_sidecar(store_path)
    if info is not None:
        headers = {"X-Forgetui-Token": str(info.get("token", ""))}
        try:
            resp = httpx.post(info["url"], json={"sql": sql, "max_rows": max_rows}, headers=headers, timeout=timeout)
        except httpx.TransportError as exc:
            log.info("live endpoint %s of %s does not answer (%s); opening the file", info["url"], store_path, exc)
        else:
            data = resp.json()
            if resp.status_code != 200:
                raise StoreError(data.get("error") or f"live query failed with HTTP {resp.status_code}")
            return QueryResult.from_dict(data)
    if not store_path.exists():
        raise StoreError(f"no store at {store_path}")
    try:
        con = duckdb.connect(str(store_path), read_only=True, config=dict(READER_SETTINGS))
    except duckdb.Error as exc:
        if "lock" in str(exc).lower():
            raise StoreError(
                f"store {store_path} is open in a writer process that serves no live query endpoint "
                f"(no live {sidecar_path(store_path).name}); query it after that process ends, "
                f"or start it with live queries on ({exc})"
            ) from exc
        raise StoreError(f"cannot open store {store_path} read-only: {exc}") from exc
    try:
        if cancel is not None:
            cancel.watch(con)
        return execute_read_only(con, sql, max_rows)
    finally:
        con.close()


# ---------------------------------------------------------------------- output
def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (list, dict, tuple)):
        return orjson.dumps(value, default=str).decode()
    return str(value)


def format_result(result: QueryResult, fmt: str = "table") -> str:
    """Render a result as a rich `table`, `csv` (with header) or `json` (a list of objects)."""
    if fmt == "json":
        objs = [dict(zip(result.columns, row, strict=False)) for row in result.rows]
        return orjson.dumps(objs, default=str, option=orjson.OPT_INDENT_2).decode()
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([_cell(v) for v in row] for row in result.rows)
        return buf.getvalue()
    if fmt == "table":
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(*result.columns, show_lines=False)
        for row in result.rows:
            table.add_row(*(Text(_cell(v)) if v is not None else Text("NULL", style="dim") for v in row))
        console = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False)
        console.print(table)
        if result.truncated:
            console.print(f"(truncated at {len(result.rows)} rows)")
        return console.file.getvalue()  # type: ignore[attr-defined]
    raise StoreError(f"unknown output format {fmt!r}; use table, csv or json")


def store_for_run(run_id: str) -> Path:
    """FORGETUI_HOME/runs/<run_id>/store.duckdb."""
    return paths.runs_dir() / run_id / "store.duckdb"


def run_shards(run_id: str) -> list[Path]:
    """The store shards of a run (one per veRL agent-loop worker), in name order; [] for a one-store run."""
    return sorted((paths.runs_dir() / run_id / SHARDS_DIR).glob("*/store.duckdb"))


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def run_query_shards(stores: list[Path], sql: str, *, max_rows: int = DEFAULT_MAX_ROWS, cancel: QueryCancel | None = None) -> QueryResult:
    """Read-only SQL over several stores as one: each ATTACHed read-only, every table a UNION ALL BY NAME view."""
    con = duckdb.connect(":memory:")
    if cancel is not None:
        cancel.watch(con)
    try:
        tables: dict[str, list[str]] = {}
        for i, path in enumerate(stores):
            alias = f"shard{i}"
            try:
                con.execute(f"ATTACH '{str(path).replace(chr(39), chr(39) * 2)}' AS {alias} (READ_ONLY)")
            except duckdb.Error as exc:
                if any(word in str(exc).lower() for word in ("lock", "in use", "already attached")):
                    raise StoreError(
                        f"store shard {path} is open in a running worker: query it alone with --store {path} "
                        f"(its live endpoint answers) or the whole run after its workers end ({exc})"
                    ) from exc
                raise StoreError(f"cannot open store shard {path} read-only: {exc}") from exc
            names = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [alias]).fetchall()
            for (name,) in names:
                tables.setdefault(name, []).append(alias)
        for name, aliases in tables.items():
            if name == "runs":  # every worker writes its run's row: one row per run (the first store's), or joins double
                union = " UNION ALL BY NAME ".join(f"SELECT *, {i} AS __store FROM {a}.main.runs" for i, a in enumerate(aliases))
                view = f"SELECT * EXCLUDE (__store) FROM ({union}) QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY __store) = 1"
            else:
                view = " UNION ALL BY NAME ".join(f"SELECT * FROM {a}.main.{_quoted(name)}" for a in aliases)
            con.execute(f"CREATE VIEW {_quoted(name)} AS {view}")
        return execute_read_only(con, sql, max_rows)
    finally:
        con.close()


def last_written(path: Path) -> float:
    """When a store was last written: the newer of the file and its WAL."""
    times = []
    for p in (path, Path(str(path) + ".wal")):
        try:
            times.append(p.stat().st_mtime)
        except FileNotFoundError:
            pass
    return max(times, default=0.0)


def latest_store(home: Path | None = None) -> Path | None:
    """The most recently written store under FORGETUI_HOME (runs/*/store.duckdb and stores/*.duckdb)."""
    home = Path(home) if home is not None else paths.home()
    candidates = [*home.glob("runs/*/store.duckdb"), *home.glob("stores/*.duckdb")]
    if not candidates:
        return None
    return max(candidates, key=last_written)
