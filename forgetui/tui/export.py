"""Write a query result to CSV or Parquet (the SQL console's export)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from core.errors import StoreError
from core.store.query import format_result
from core.store.readonly import QueryResult


def export_path(folder: Path, fmt: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return folder / f"query-{stamp}.{fmt}"


def export_result(result: QueryResult, path: Path) -> Path:
    """`path`'s suffix picks the format: .csv (lists and JSON as JSON text) or .parquet (types kept by pyarrow)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        path.write_text(format_result(result, "csv"))
        return path
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        names = [c if c not in result.columns[:i] else f"{c}_{i}" for i, c in enumerate(result.columns)]
        try:
            table = pa.table({n: [row[i] for row in result.rows] for i, n in enumerate(names)})
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise StoreError(f"cannot write this result as Parquet ({exc}); export it as CSV instead") from exc
        pq.write_table(table, path)
        return path
    raise StoreError(f"unknown export format {path.suffix!r}; use .csv or .parquet")
