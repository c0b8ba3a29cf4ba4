"""Is an existing file at a store path a DuckDB database, and one of ours? Checked before DuckDB opens it (issue 44 item 2).

DuckDB opens almost anything it is given (a JSON file opens as an empty in-memory database, whose rows
are then lost at exit), and the writer used to chmod the file and arm a `.wal` beside it: a wrong
`--store notes.json` cost the user the file's mode and left a stray WAL. The check reads the file's
header only: DuckDB's main header starts with an 8-byte checksum, then the magic bytes `DUCK`.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from core.errors import StoreError

DUCKDB_MAGIC = b"DUCK"
MAGIC_OFFSET = 8


def existing_store(path: Path) -> bool:
    """False when nothing is at `path` (a new store); True for a DuckDB file; StoreError for anything else there."""
    if not path.exists() and not path.is_symlink():
        return False
    if not path.is_file():
        raise StoreError(f"{path} is not a file (a folder or a device): give the path of a .duckdb store, e.g. {path / 'store.duckdb'}")
    try:
        with path.open("rb") as f:
            head = f.read(MAGIC_OFFSET + len(DUCKDB_MAGIC))
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head[MAGIC_OFFSET:] != DUCKDB_MAGIC:
        what = "an empty file" if not head else "not a DuckDB database"
        raise StoreError(
            f"{path} exists and is {what}: refusing to use it as a store (it was left as it is); "
            "give a new path or an existing forgetui .duckdb store"
        )
    return True


def check_ours(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """True for a forgetui store, False for an empty database; StoreError for a DuckDB file with other tables."""
    tables = {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
    if not tables:
        return False  # an empty database: a store's tables go in
    if "meta" in tables and con.execute("SELECT count(*) FROM meta WHERE key = 'schema_version'").fetchone() == (1,):
        return True
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    raise StoreError(f"{path} is a DuckDB database of something else (tables {shown}), not a forgetui store: refusing to write into it; give a new path")
