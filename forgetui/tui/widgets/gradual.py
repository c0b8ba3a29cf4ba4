"""Adding many rows to a DataTable a chunk per screen refresh, so thousands of rows never freeze the screen."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from textual.widgets import DataTable

CHUNK = 150


def add_gradually(table: DataTable, keys: Sequence[str], cells_of: Callable[[str], Sequence[Any]]) -> None:
    """Add a row per key, CHUNK now and CHUNK after each refresh; `cells_of(key)` is asked when the row is added
    (so a row updated meanwhile goes in with its newest cells). Keys already in the table or gone are skipped."""
    head, rest = keys[:CHUNK], keys[CHUNK:]
    for key in head:
        cells = cells_of(key)
        if cells is not None and key not in table.rows:
            table.add_row(*cells, key=key)
    if rest:
        table.call_after_refresh(add_gradually, table, rest, cells_of)
