"""Read-only SQL on a store from any process: through the writer's live endpoint, or the file opened read-only.

The pieces: `readonly` (the guard and capped execution on a connection), `sidecar` (the writer's live endpoint),
`shard_query` (a run's several stores read as one). This module runs a query on one store, formats results
and finds stores under FORGETUI_HOME.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
from pathlib import Path
from typing import Any

import duckdb
import orjson

from core import paths
from core.errors import StoreBusyError, StoreError
from core.store.filecheck import existing_store
from core.store.readonly import DEFAULT_MAX_ROWS, READER_SETTINGS, QueryCancel, QueryResult, execute_read_only
from core.store.schema import SCHEMA_VERSION
from core.store.sidecar import post_live, read_sidecar, sidecar_path

__all__ = ["SHARDS_DIR", "format_result", "last_written", "latest_store", "run_query", "run_shards", "store_for_run"]

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"  # runs/<run_id>/shards/<shard>/store.duckdb: one store per veRL agent-loop worker


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
    if not existing_store(store_path):
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


def newer_schema(store_path: str | Path) -> str | None:
    """A warning when the store was written by a newer forgetui (its schema version is past this one's), else None:
    the proxy refuses to write such a store; a reader may read it, but columns and views may mean something else."""
    try:
        rows = run_query(store_path, "SELECT value FROM meta WHERE key = 'schema_version'").rows
    except StoreError:  # no meta table: not a store this check can say anything about
        return None
    try:
        found = int(rows[0][0]) if rows else None
    except (TypeError, ValueError):
        return f"store {store_path} has an unreadable schema version {rows[0][0]!r}; its rows may not mean what this forgetui expects"
    if found is None or found <= SCHEMA_VERSION:
        return None
    return (
        f"store {store_path} has schema version {found}, newer than this forgetui ({SCHEMA_VERSION}): the rows were read, but "
        "columns and views may have changed meaning; upgrade forgetui to read it as written (the proxy refuses to write it)"
    )


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
