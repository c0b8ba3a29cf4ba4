"""A query result, paged: rows are added PAGE at a time as the cursor nears the end (any size stays
responsive); long cells are cut, and Enter on a cell opens it in full."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from core.store.query import QueryResult
from forgetui.tui.data import cell_text
from forgetui.tui.screens.cell_viewer import CellViewer

PAGE = 500
CELL_CHARS = 60


def short_cell(value: object) -> Text:
    if value is None:
        return Text("NULL", style="dim")
    text = cell_text(value).replace("\n", "↵")
    return Text(text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…")


class ResultTable(DataTable):
    """`show_result` replaces everything; `clear_result` empties it (an error replaces the old result)."""

    BINDINGS = [Binding("ctrl+end", "load_all_end", "Last row", show=False)]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="cell", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self.result: QueryResult | None = None
        self.loaded = 0

    def show_result(self, result: QueryResult) -> None:
        self.clear(columns=True)
        self.result, self.loaded = result, 0
        for i, name in enumerate(result.columns):  # columns may repeat (SELECT 1, 1): keys must be unique
            self.add_column(name, key=f"c{i}")
        self.load_page()

    def clear_result(self) -> None:
        self.clear(columns=True)
        self.result, self.loaded = None, 0
        self.border_subtitle = ""

    def load_page(self) -> None:
        if self.result is None or self.loaded >= len(self.result.rows):
            return
        rows = self.result.rows[self.loaded: self.loaded + PAGE]
        self.add_rows([[short_cell(v) for v in row] for row in rows])
        self.loaded += len(rows)
        self.border_subtitle = f"{self.loaded}/{len(self.result.rows)} rows shown"

    def on_data_table_cell_highlighted(self, event: DataTable.CellHighlighted) -> None:
        if event.coordinate.row >= self.loaded - PAGE // 5:
            self.load_page()

    def action_load_all_end(self) -> None:
        while self.result is not None and self.loaded < len(self.result.rows):
            self.load_page()
        self.move_cursor(row=self.row_count - 1)

    def on_data_table_cell_selected(self, event: DataTable.CellSelected) -> None:
        event.stop()
        if self.result is None:
            return
        row, col = event.coordinate.row, event.coordinate.column
        self.app.push_screen(CellViewer(self.result.columns[col], self.result.rows[row][col]))
