"""A query result, windowed: the table holds a few hundred rows of it at a time (any size stays responsive);
long cells are cut, and Enter on a cell opens it in full."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable

from core.store.readonly import QueryResult
from forgetui.tui.messages import OpenCell
from forgetui.tui.rows import cell_text
from forgetui.tui.widgets.windowed_table import WindowedTable

CELL_CHARS = 60


def short_cell(value: object) -> Text:
    if value is None:
        return Text("NULL", style="dim")
    text = cell_text(value).replace("\n", "↵")
    return Text(text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…")


class ResultTable(WindowedTable):
    """`show_result` replaces everything; `clear_result` empties it (an error replaces the old result)."""

    DEFAULT_CSS = """
    ResultTable { border: round $primary-darken-1; }
    ResultTable:focus { border: round $accent; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="cell", zebra_stripes=True, **kwargs)
        self.result: QueryResult | None = None

    def count(self) -> int:
        return len(self.result.rows) if self.result is not None else 0

    def cells(self, index: int) -> Sequence[Text]:
        assert self.result is not None
        return [short_cell(v) for v in self.result.rows[index]]

    def show_result(self, result: QueryResult) -> None:
        self.clear(columns=True)
        self.result = result
        for i, name in enumerate(result.columns):  # columns may repeat (SELECT 1, 1): keys must be unique
            self.add_column(name, key=f"c{i}")
        self.show_window(0, 0)

    def clear_result(self) -> None:
        self.clear(columns=True)
        self.result, self.window_start = None, 0
        self.border_subtitle = ""

    def on_window_changed(self) -> None:
        self.border_subtitle = f"rows {self.window_label()}"

    def on_data_table_cell_selected(self, event: DataTable.CellSelected) -> None:
        event.stop()
        if self.result is None:
            return
        row, col = self.window_start + event.coordinate.row, event.coordinate.column
        self.post_message(OpenCell(self.result.columns[col], self.result.rows[row][col]))
