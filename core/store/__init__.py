"""The DuckDB store: one writer process per store file; live reads go through the writer (see live.py).

Shutdown: whoever owns the `Store` closes it (`close()` flushes, checkpoints and is idempotent; an atexit
hook calls it too). Servers with their own signal handling (the uvicorn proxy) close it in their shutdown
hook; plain scripts can call `install_signal_flush(store)`.
"""

from core.store.live import LiveServer, handle_query
from core.store.query import format_result, latest_store, run_query, store_for_run
from core.store.readonly import QueryResult, execute_read_only
from core.store.schema import SCHEMA_DOC, SCHEMA_SQL, SCHEMA_VERSION
from core.store.writer import Store, install_signal_flush

__all__ = [
    "SCHEMA_DOC",
    "SCHEMA_SQL",
    "SCHEMA_VERSION",
    "LiveServer",
    "QueryResult",
    "Store",
    "execute_read_only",
    "format_result",
    "handle_query",
    "install_signal_flush",
    "latest_store",
    "run_query",
    "store_for_run",
]
