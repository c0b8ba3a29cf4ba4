"""The child process of `core.store.planner`: rehearses live queries on an empty copy of the store's schema.

Run by file path (``python -I plan_child.py``), so it imports duckdb and nothing of forgetui. stdin:
first a JSON setup message (the schema's DDL, the reader settings, a memory budget), then one
message per query; each message is its length (8 bytes, little-endian) and UTF-8 bytes. stdout: one
JSON answer per query, framed the same way: ``{"planned": true}``, ``{"planned": true, "error": ...}``
when DuckDB refused the query (the writer gives the authoritative error), or ``{"planned": false, ...}``
when planning ran out of its memory. A query whose planning outgrows the process's own memory cap
kills it; one that plans too long is killed by the parent.
"""

from __future__ import annotations

import json
import resource
import struct
import sys
from typing import Any


def _read() -> bytes | None:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        return None
    return sys.stdin.buffer.read(struct.unpack("<Q", head)[0])


def _write(obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(struct.pack("<Q", len(data)) + data)
    sys.stdout.buffer.flush()


def _vm_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


REHEARSED_ROWS = 10_000


def _rehearse(con: Any, duckdb: Any, sql: str) -> None:
    """Plan and run every statement on the empty tables: what a query costs without the store's rows (its planning,
    and values it makes from nothing: `repeat('x', 10^7) FROM range(2048)`, `range(10^12)`) is paid here."""
    for statement in con.extract_statements(sql):
        if statement.type in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
            con.execute(statement.query).fetchmany(REHEARSED_ROWS)


def main() -> None:
    import duckdb

    setup = json.loads(_read() or b"{}")
    con = duckdb.connect(":memory:", config={"threads": 1})
    con.execute(setup["ddl"])
    for name, value in setup["settings"].items():
        con.execute(f"SET {name} = {_literal(value)}")
    budget = int(setup["memory_bytes"])
    limit = _vm_bytes() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _write({"ready": True})
    while (message := _read()) is not None:
        try:
            _rehearse(con, duckdb, message.decode("utf-8"))
            _write({"planned": True})
        except (duckdb.OutOfMemoryException, MemoryError) as exc:
            _write({"planned": False, "error": str(exc)[:2000]})
        except duckdb.Error as exc:
            _write({"planned": True, "error": str(exc)[:2000]})
        except UnicodeDecodeError as exc:  # DuckDB's message cut inside a character: a refused query, not a costly one
            _write({"planned": True, "error": f"DuckDB's error message could not be decoded ({exc.reason})"})


if __name__ == "__main__":
    main()
