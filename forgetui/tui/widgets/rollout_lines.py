"""A run's rollouts (status, task, sample, step, reward, calls, tokens, duration, error); Enter opens one.

Rows are added PAGE at a time (more as the cursor nears the end; End adds the rest a page per event-loop turn),
so a run of 10,000 rollouts opens without freezing the screen."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from forgetui.tui.messages import RolloutOpened
from forgetui.tui.run_data import ROLLOUT_LINE_COLUMNS, RolloutLine, RunSource
from forgetui.tui.widgets.rollouts_table import STATUS_STYLES

PAGE = 200


def styled(column: str, value: str, line: RolloutLine) -> Text | str:
    if column == "status":
        return Text(value, style=STATUS_STYLES.get(value, ""))
    if column == "reward" and value and line.passed is not None:
        return Text(value, style="green" if line.passed else "red")
    return value


class RolloutLines(DataTable):
    """Rows by position (`lines[i]` is row i); refreshed in place when only cells changed, so the cursor stays."""

    BORDER_TITLE = "Rollouts"
    BINDINGS = [Binding("end", "to_end", "Last", show=False)]

    def __init__(self, source: RunSource, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self.source = source
        self.lines: list[RolloutLine] = []
        self._cells: list[dict[str, str]] = []  # of the rows shown

    @property
    def total(self) -> int:
        return len(self.lines)

    def on_mount(self) -> None:
        for name in ROLLOUT_LINE_COLUMNS:
            self.add_column(name, key=name)

    def show_lines(self, lines: list[RolloutLine]) -> None:
        same_rows = [x.rollout_id for x in lines[: len(self._cells)]] == [x.rollout_id for x in self.lines[: len(self._cells)]]
        self.lines = list(lines)
        if not same_rows or len(lines) < len(self._cells):  # membership or order changed: rebuild
            keep = self.cursor_row
            self.clear()
            self._cells = []
            self._add_page(max(PAGE, min(keep + 1, len(lines))))
            if 0 <= keep < self.row_count:
                self.move_cursor(row=keep, animate=False)
        else:
            for i, old in enumerate(self._cells):
                cells = lines[i].cells()
                if cells != old:
                    for j, c in enumerate(ROLLOUT_LINE_COLUMNS):
                        if cells[c] != old[c]:
                            self.update_cell_at((i, j), styled(c, cells[c], lines[i]))
                    self._cells[i] = cells
            if not self._cells:
                self._add_page(PAGE)
        self._subtitle()

    def _add_page(self, n: int = PAGE) -> None:
        start = len(self._cells)
        new = self.lines[start: start + n]
        cells = [line.cells() for line in new]
        for row, line in zip(cells, new, strict=True):
            self.add_row(*(styled(c, row[c], line) for c in ROLLOUT_LINE_COLUMNS))
        self._cells += cells
        self._subtitle()

    def _subtitle(self) -> None:
        shown = f"{len(self._cells)}/" if len(self._cells) < len(self.lines) else ""
        self.border_subtitle = f"{shown}{len(self.lines)} rollouts · Enter opens one"

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.cursor_row >= len(self._cells) - PAGE // 4 and len(self._cells) < len(self.lines):
            self._add_page()

    async def action_to_end(self) -> None:
        while len(self._cells) < len(self.lines):
            self._add_page()
            await asyncio.sleep(0)  # let the screen breathe between pages
        if self.row_count:
            self.move_cursor(row=self.row_count - 1, animate=False)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self._cells):
            self.post_message(RolloutOpened(self.source, self.lines[event.cursor_row].rollout_id))
