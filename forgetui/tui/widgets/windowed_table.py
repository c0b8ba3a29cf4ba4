"""A DataTable that holds only a window of a long list of rows: Textual's DataTable recomputes per-row offsets
on every change (cost grows with its row count), so 10,000 rows held at once make each update slow.
Moving the cursor near the window's edge slides the window; Home/End jump to the list's ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

WINDOW = 100  # rows held at once (a tall terminal shows ~45; each new row is measured on the event loop)
EDGE = 10  # the window slides when the cursor comes this close to its edge


class WindowedTable(DataTable):
    """Subclasses give `cells(i)` for row i of `count()` rows; `window_start` is the window's first row."""

    BINDINGS = [
        Binding("end,ctrl+end", "to_end", "Last", show=False),
        Binding("home,ctrl+home", "to_start", "First", show=False),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.window_start = 0
        self._sliding = False
        self._slide_pending = False

    # -- what subclasses give
    def count(self) -> int:
        raise NotImplementedError

    def cells(self, index: int) -> Sequence[Any]:
        raise NotImplementedError

    # -- the window
    @property
    def absolute_row(self) -> int:
        """The cursor's row in the whole list."""
        return self.window_start + self.cursor_row

    def show_window(self, offset: int, cursor: int | None = None) -> None:
        """Hold rows offset..offset+WINDOW (clamped) and put the cursor on absolute row `cursor`."""
        total = self.count()
        offset = max(0, min(offset, total - WINDOW)) if total > WINDOW else 0
        column = self.cursor_column
        self._sliding = True
        try:
            self.clear()
            self.window_start = offset
            for i in range(offset, min(total, offset + WINDOW)):  # plain strings as Text: DataTable parses str as markup
                self.add_row(*(Text(c) if isinstance(c, str) else c for c in self.cells(i)))
            if cursor is not None and self.row_count:
                self.move_cursor(row=max(0, min(cursor - offset, self.row_count - 1)), column=column, animate=False)
        finally:
            self._sliding = False
        self.on_window_changed()

    def on_window_changed(self) -> None:
        """Hook: the window moved or was refilled (subclasses update their subtitle)."""

    def window_label(self) -> str:
        total = self.count()
        if total <= self.row_count:
            return f"{total}"
        return f"{self.window_start + 1}–{self.window_start + self.row_count} of {total}"

    def _slide_if_at_edge(self, row: int) -> None:
        if self._sliding or self._slide_pending:
            return
        if self._at_edge(row):
            self._slide_pending = True
            self.call_after_refresh(self._slide)

    def _at_edge(self, row: int) -> bool:
        forward = row >= self.row_count - EDGE and self.window_start + self.row_count < self.count()
        return forward or (row < EDGE and self.window_start > 0)

    def _slide(self) -> None:
        """Centre the window on the cursor as it is now (keys pressed since the edge was reached count)."""
        self._slide_pending = False
        if self._at_edge(self.cursor_row):
            here = self.absolute_row
            self.show_window(here - WINDOW // 2, here)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._slide_if_at_edge(event.cursor_row)

    def on_data_table_cell_highlighted(self, event: DataTable.CellHighlighted) -> None:
        self._slide_if_at_edge(event.coordinate.row)

    def action_to_end(self) -> None:
        self.show_window(self.count() - WINDOW, self.count() - 1)

    def action_to_start(self) -> None:
        self.show_window(0, 0)
