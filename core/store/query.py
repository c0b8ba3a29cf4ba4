"""Read-only SQL on a store from any process: through the writer's live endpoint, or the file opened read-only."""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import orjson

from core import paths
from core.errors import StoreBusyError, StoreError
from core.store.behaviour import create_temp_views
from core.store.tokens import TOKEN_IDS_MACRO

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
    finally:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass
    return QueryResult(columns, rows, truncated, types)


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
    host = info.get("host")
    if host and host != socket.gethostname():  # a writer on another node (a shared FORGETUI_HOME): its pid says nothing here
        log.debug("%s belongs to a writer on host %s", side, host)
        return None
    pid = int(info.get("pid", 0))
    if pid <= 0 or not pid_alive(pid):
        log.info("removing stale %s (pid %s is gone)", side, pid)
        side.unlink(missing_ok=True)
        return None
    return info


def sidecar_host(store_path: Path) -> str | None:
    """The host a store's sidecar says its writer runs on; None without a (readable) sidecar or a host in it."""
    try:
        host = orjson.loads(sidecar_path(store_path).read_bytes()).get("host")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    return str(host) if host else None


def run_query(
    store_path: str | Path, sql: str, *, max_rows: int = DEFAULT_MAX_ROWS, timeout: float = 60.0, cancel: QueryCancel | None = None
) -> QueryResult:
    """Run read-only SQL on a store, live (through its writer) or from the file; never blocks the writer."""
    import httpx

    store_path = Path(store_path).expanduser().resolve()
    info = read_sidecar(store_path)
    if info is not None:
        try:
            return post_live(info, sql, max_rows, timeout)
        except httpx.TransportError as exc:
            log.info("live endpoint %s of %s does not answer (%s); opening the file", info["url"], store_path, exc)
    if not store_path.exists():
        raise StoreError(f"no store at {store_path}")
    try:
        con = duckdb.connect(str(store_path), read_only=True, config=dict(READER_SETTINGS))
    except duckdb.Error as exc:
        if "lock" in str(exc).lower():
            raise StoreBusyError(
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


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# ---------------------------------------------------------------------- a run's stores read as one
LOCK_WAIT_S = 2.0  # how long a held store without a live endpoint is retried (a writer opening, or one writing for a moment)
LIVE_COLUMNS_SQL = (  # one row, so that no row cap cuts it
    "SELECT list([c.table_name, c.column_name, c.data_type] ORDER BY c.table_name, c.column_index) "
    "FROM duckdb_columns() c JOIN duckdb_tables() t USING (table_oid) "
    "WHERE t.database_name = current_database() AND t.schema_name = 'main'"
)
# while the plan of a query is read on empty stand-in tables: statistics would prove every scan empty and drop it,
# and a filter pushed into a scan would hide its columns from the scan's projections
PLAN_SETTINGS = "SET disabled_optimizers = 'statistics_propagation,filter_pushdown'"
_FLOATS = ("DOUBLE", "FLOAT", "REAL")


@dataclass
class LiveShard:
    """A store a running writer holds, read through that writer's live endpoint (its sidecar)."""

    path: Path
    info: dict[str, Any]
    alias: str
    columns: dict[str, dict[str, str]]  # table → column → DuckDB type, in the writer's order


_client_lock = threading.Lock()
_client: Any = None


def _http() -> Any:
    """One HTTP client for every live read of this process (a new one costs ~30 ms of TLS setup); no proxy from the environment."""
    global _client
    import httpx

    with _client_lock:
        if _client is None:
            _client = httpx.Client(trust_env=False)
        return _client


def post_live(info: dict[str, Any], sql: str, max_rows: int, timeout: float) -> QueryResult:
    """Send read-only SQL to a writer's live endpoint (`info` from its sidecar); httpx.TransportError if it does not answer."""
    headers = {"X-Forgetui-Token": str(info.get("token", ""))}
    resp = _http().post(info["url"], json={"sql": sql, "max_rows": max_rows}, headers=headers, timeout=timeout)
    try:
        data = resp.json()
    except ValueError:
        data = {}
    if resp.status_code != 200:
        raise StoreError(data.get("error") or f"live query failed with HTTP {resp.status_code}")
    return QueryResult.from_dict(data)


def _held(exc: duckdb.Error) -> bool:
    """Whether an ATTACH failed because a writer holds the file (another process's lock, or this process's own writer)."""
    text = str(exc).lower()
    return any(word in text for word in ("lock", "in use", "already attached"))


def _held_error(path: Path, exc: duckdb.Error, silent_url: str | None = None) -> StoreError:
    """What a user sees for a store a writer holds that serves no live endpoint (or one that does not answer)."""
    side = sidecar_path(path)
    host = sidecar_host(path)
    if host is not None and host != socket.gethostname():
        why = (f"on host {host}: its live query endpoint answers on that host's loopback only; "
               f"run the query there, or after that writer ends")
    elif silent_url is not None:
        why = f"whose live query endpoint {silent_url} (in {side.name}) does not answer; try again, or after that writer ends"
    else:
        why = (f"that serves no live query endpoint (no live {side.name} beside it); "
               f"read it after that writer ends, or start the writer with live queries on")
    return StoreBusyError(f"store {path} is held by a running writer process {why} ({exc})")


def _open_store(con: duckdb.DuckDBPyConnection, path: Path, alias: str, *, lock_wait_s: float, timeout: float) -> LiveShard | None:
    """ATTACH `path` read-only as `alias`; a store a running writer holds is read through its live endpoint instead."""
    import httpx

    deadline = time.monotonic() + lock_wait_s
    silent_url = None
    while True:
        try:
            con.execute(f"ATTACH {_literal(str(path))} AS {alias} (READ_ONLY)")
            return None
        except duckdb.Error as exc:
            if not _held(exc):
                raise StoreError(f"cannot open store {path} read-only: {exc}") from exc
            held = exc
        info = read_sidecar(path)
        if info is not None:
            try:
                return LiveShard(path, info, alias, _live_columns(info, timeout))
            except httpx.TransportError as exc:  # a writer closing: its file is free in a moment
                log.info("live endpoint %s of %s does not answer (%s)", info.get("url"), path, exc)
                silent_url = str(info.get("url"))
        if time.monotonic() >= deadline:
            raise _held_error(path, held, silent_url) from held
        time.sleep(0.1)


def _live_columns(info: dict[str, Any], timeout: float) -> dict[str, dict[str, str]]:
    """Every table of a live store with its columns and types, asked of its writer."""
    tables: dict[str, dict[str, str]] = {}
    ((columns,),) = post_live(info, LIVE_COLUMNS_SQL, 1, timeout).rows
    for table, column, sql_type in columns or []:
        tables.setdefault(table, {})[column] = sql_type
    return tables


def _create_table(con: duckdb.DuckDBPyConnection, alias: str, table: str, columns: dict[str, str]) -> None:
    cols = ", ".join(f"{_quoted(c)} {t}" for c, t in columns.items())
    con.execute(f"CREATE OR REPLACE TABLE {alias}.main.{_quoted(table)} ({cols})")


def _create_views(con: duckdb.DuckDBPyConnection, tables: dict[str, list[str]], narrow: dict[str, list[str]] | None = None) -> None:
    """One view per table over every store holding it (UNION ALL BY NAME); `narrow` keeps only those columns of a table."""
    for name, aliases in tables.items():
        keep = (narrow or {}).get(name)
        cols = {a: "*" if keep is None else _select_list(con, a, name, keep) for a in aliases}
        if name == "runs":  # every worker writes its run's row: one row per run (the first store's), or joins double
            union = " UNION ALL BY NAME ".join(f"SELECT {cols[a]}, {i} AS __store FROM {a}.main.runs" for i, a in enumerate(aliases))
            view = f"SELECT * EXCLUDE (__store) FROM ({union}) QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY __store) = 1"
        else:
            view = " UNION ALL BY NAME ".join(f"SELECT {cols[a]} FROM {a}.main.{_quoted(name)}" for a in aliases)
        con.execute(f"CREATE OR REPLACE VIEW {_quoted(name)} AS {view}")


def _select_list(con: duckdb.DuckDBPyConnection, alias: str, table: str, keep: list[str]) -> str:
    """The columns of `keep` one store's table has, in its order (a NULL `keep[0]` when it has none of them)."""
    sql = "SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = 'main' AND table_name = ? ORDER BY column_index"
    have = [c for (c,) in con.execute(sql, [alias, table]).fetchall() if c in keep]
    return ", ".join(map(_quoted, have)) or f"NULL AS {_quoted(keep[0])}"


def _plan_scans(node: Any, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every table scan (its `extra_info`) in an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(node, list):
        for child in node:
            _plan_scans(child, out)
    elif isinstance(node, dict):
        info = node.get("extra_info")
        if isinstance(info, dict) and "Table" in info:
            out.append(info)
        _plan_scans(node.get("children"), out)
    return out


def scanned_columns(con: duckdb.DuckDBPyConnection, sql: str, live: list[LiveShard]) -> dict[str, list[str]]:
    """The live shards' tables the query scans and, per table, the columns it reads (in the writer's order).

    Read from DuckDB's own plan on the empty stand-in tables (statistics-based pruning and filter pushdown
    off), so views, CTEs and subqueries count; a table no scan reads is not pulled at all.
    """
    aliases = {s.alias for s in live}
    known = live_tables(live)
    wanted: dict[str, set[str]] = {}
    con.execute(PLAN_SETTINGS)
    try:
        for stmt in con.extract_statements(sql):
            if stmt.type != duckdb.StatementType.SELECT:
                continue  # EXPLAIN and PRAGMA table_info read no rows (EXPLAIN ANALYZE times the stand-ins)
            try:
                (_, plan), = con.execute(f"EXPLAIN (FORMAT JSON) {stmt.query}").fetchall()
            except duckdb.Error as exc:
                raise StoreError(f"query failed: {exc}") from exc
            for scan in _plan_scans(orjson.loads(plan), []):
                alias, _, table = str(scan["Table"]).partition(".main.")
                if alias not in aliases or table not in known:
                    continue
                proj = scan.get("Projections") or []
                wanted.setdefault(table, set()).update([proj] if isinstance(proj, str) else proj)
    finally:
        con.execute("RESET disabled_optimizers")
    out = {}
    for table, cols in wanted.items():
        order = list(known[table])
        # count(*) reads no column, yet the rows count: one column carries them
        out[table] = [c for c in order if c in cols] + sorted(cols - known[table].keys()) if cols else order[:1]
    return out


def live_tables(live: list[LiveShard]) -> dict[str, dict[str, str]]:
    """Every table of the live shards with every column any of them has."""
    known: dict[str, dict[str, str]] = {}
    for shard in live:
        for table, cols in shard.columns.items():
            known.setdefault(table, {}).update(cols)
    return known


def _wire(column: str, sql_type: str) -> tuple[str, str]:
    """(what the writer sends, how the reader rebuilds it from that text) for one column: every value travels as
    text DuckDB writes and reads back exactly (BLOBs as base64, floats with NaN and ±inf, lists as JSON)."""
    col, base = _quoted(column), sql_type.upper()
    if base == "BLOB":
        return f"to_base64({col})", "from_base64({})"
    if base.endswith("[]") and base[:-2] in _FLOATS:
        return f"to_json(CAST({col} AS VARCHAR[]))", f"CAST(CAST(CAST({{}} AS JSON) AS VARCHAR[]) AS {sql_type})"
    if base.endswith("]") or base.startswith(("STRUCT", "MAP", "UNION")):
        return f"to_json({col})", f"CAST(CAST({{}} AS JSON) AS {sql_type})"
    return f"CAST({col} AS VARCHAR)", f"CAST({{}} AS {sql_type})"


def pull_table(con: duckdb.DuckDBPyConnection, shard: LiveShard, table: str, columns: list[str], timeout: float) -> int:
    """Copy `columns` of a live shard's table into its in-memory stand-in; StoreError past the endpoint's row cap."""
    import numpy as np

    types = {c: shard.columns[table][c] for c in columns}
    wires = [_wire(c, t) for c, t in types.items()]
    sql = f"SELECT {', '.join(w for w, _ in wires)} FROM main.{_quoted(table)}"
    result = post_live(shard.info, sql, DEFAULT_MAX_ROWS, timeout)
    if result.truncated:
        raise StoreError(
            f"live store {shard.path}: table {table} has more than {len(result.rows)} rows, more than its writer's live "
            f"endpoint answers at once; query that store alone (--store {shard.path}: the query runs in its writer) "
            f"or the whole run after its writers end"
        )
    _create_table(con, shard.alias, table, types)
    if not result.rows:
        return 0
    data = {}
    for i in range(len(columns)):
        arr = np.empty(len(result.rows), dtype=object)
        arr[:] = [row[i] for row in result.rows]
        data[f"c{i}"] = arr
    view = f"__forgetui_pull_{shard.alias}"
    con.register(view, data)
    try:
        select = ", ".join(back.format(f"c{i}") for i, (_, back) in enumerate(wires))
        con.execute(f"INSERT INTO {shard.alias}.main.{_quoted(table)} SELECT {select} FROM {view}")
    finally:
        con.unregister(view)
    return len(result.rows)


def _pull_live(
    con: duckdb.DuckDBPyConnection, live: list[LiveShard], needed: dict[str, list[str]], tables: dict[str, list[str]],
    *, narrow: bool, timeout: float, cancel: QueryCancel | None,
) -> None:
    """Fill the live shards' stand-ins with the rows of the tables the query reads; `narrow`: their views keep only those columns.

    Narrow views make a column the plan did not read a binder error rather than NULLs on the live rows.
    """
    for shard in live:
        for table, cols in needed.items():
            if table not in shard.columns:
                continue
            if cancel is not None and cancel.cancelled:
                raise StoreError("query interrupted: cancelled")
            mine = [c for c in cols if c in shard.columns[table]] or list(shard.columns[table])[:1]
            n = pull_table(con, shard, table, mine, timeout)
            log.debug("pulled %d %s rows (%d columns) from the live store %s", n, table, len(mine), shard.path)
    _create_views(con, {t: tables[t] for t in needed if t in tables}, needed if narrow else None)


def run_query_shards(
    stores: list[Path], sql: str, *, max_rows: int = DEFAULT_MAX_ROWS, cancel: QueryCancel | None = None,
    lock_wait_s: float = LOCK_WAIT_S, timeout: float = 60.0,
) -> QueryResult:
    """Read-only SQL over several stores as one: each ATTACHed read-only, every table a UNION ALL BY NAME view.

    A store a running writer holds (a veRL worker still writing its shard) is read through that writer's
    live endpoint: the rows of the tables the query reads (only the columns it reads) are copied into an
    in-memory stand-in, so the query, aggregates included, runs once over every store's rows together.
    """
    con = duckdb.connect(":memory:")
    if cancel is not None:
        cancel.watch(con)
    try:
        check_read_only(con, sql)
        tables: dict[str, list[str]] = {}
        live: list[LiveShard] = []
        for i, path in enumerate(stores):
            alias = f"shard{i}"
            shard = _open_store(con, path, alias, lock_wait_s=lock_wait_s, timeout=timeout)
            if shard is None:
                names = [n for (n,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ?", [alias]).fetchall()]
            else:
                live.append(shard)
                con.execute(f"ATTACH ':memory:' AS {alias}")
                for table, cols in shard.columns.items():
                    _create_table(con, alias, table, cols)
                names = list(shard.columns)
            for name in names:
                tables.setdefault(name, []).append(alias)
        _create_views(con, tables)
        con.execute(TOKEN_IDS_MACRO)  # token text read as INTEGER[], as in each store
        if not live:
            return execute_read_only(con, sql, max_rows)
        needed = scanned_columns(con, sql, live)
        _pull_live(con, live, needed, tables, narrow=True, timeout=timeout, cancel=cancel)
        try:
            return execute_read_only(con, sql, max_rows)
        except StoreError as exc:
            if not isinstance(exc.__cause__, duckdb.BinderException):
                raise
        # the query binds a column the plan did not read: every column of those tables, then
        log.info("reading every column of %s from the live stores (the plan's columns did not bind)", ", ".join(needed))
        known = live_tables(live)
        _pull_live(con, live, {t: list(known[t]) for t in needed}, tables, narrow=False, timeout=timeout, cancel=cancel)
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
