"""A run's stores read as one (veRL runs write one shard per agent-loop worker): each ATTACHed read-only, or read
through its writer's live endpoint while that writer holds it, every table a UNION ALL BY NAME view."""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import orjson

from core.errors import StoreBusyError, StoreError
from core.store.readonly import DEFAULT_MAX_ROWS, QueryCancel, QueryResult, check_read_only, execute_read_only
from core.store.sidecar import post_live, read_sidecar, sidecar_host, sidecar_path
from core.store.tokens import TOKEN_IDS_MACRO

log = logging.getLogger(__name__)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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
