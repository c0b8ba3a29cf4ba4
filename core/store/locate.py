"""Where a run's stores are: a run id, a run folder (its store and a veRL run's worker shards) or a store file."""

from __future__ import annotations

from pathlib import Path

from core.errors import ConfigError
from core.store.query import SHARDS_DIR, store_for_run


def store_of(run: str | Path) -> Path:
    """A run id (FORGETUI_HOME/runs/<id>/store.duckdb) or a store file's path; the file must exist."""
    path = Path(run).expanduser()
    if path.suffix == ".duckdb" or path.is_file():
        if not path.exists():
            raise ConfigError(f"no store at {path}")
        return path
    store = store_for_run(str(run))
    if not store.exists():
        raise ConfigError(f"no run {run!r}: {store} does not exist (give a run id from `forgetui sql` or a store.duckdb path)")
    return store


def stores_of(run: str | Path) -> list[Path]:
    """The store files of a run: a run id or a run folder (its store, and a veRL run's worker shards), or one store file."""
    path = Path(run).expanduser()
    if path.suffix == ".duckdb" or path.is_file():
        return [store_of(path)]
    run_dir = path if path.is_dir() else store_for_run(str(run)).parent
    shards = sorted((run_dir / SHARDS_DIR).glob("*/store.duckdb"))
    main = run_dir / "store.duckdb"
    if not shards:
        return [store_of(main if path.is_dir() else run)]
    return ([main] if main.exists() else []) + shards  # a veRL run: one store per agent-loop worker, read as one
