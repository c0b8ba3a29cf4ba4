"""A run's rollouts (status, task, sample, step, reward, calls, tokens, duration, error); Enter opens one.
A window of the rows is held at a time (WindowedTable), so a run of 10,000 rollouts stays quick."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable

from forgetui.tui.messages import RolloutOpened
from forgetui.tui.run_data import ROLLOUT_LINE_COLUMNS, RolloutLine, RunSource
from forgetui.tui.widgets.rollouts_table import styled
from forgetui.tui.widgets.windowed_table import WindowedTable


class RolloutLines(WindowedTable):
    """`show_lines` refreshes in place when only cells changed, so the cursor stays where it was."""

    BORDER_TITLE = "Rollouts"

    def __init__(self, source: RunSource, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.source = source
        self.lines: list[RolloutLine] = []

    @property
    def total(self) -> int:
        return len(self.lines)

    def count(self) -> int:
        return len(self.lines)

    def cells(self, index: int) -> Sequence[Text | str]:
        line = self.lines[index]
        values = line.cells()
        return [styled(c, values[c], line) for c in ROLLOUT_LINE_COLUMNS]

    def on_mount(self) -> None:
        for name in ROLLOUT_LINE_COLUMNS:
            self.add_column(name, key=name)

    def show_lines(self, lines: list[RolloutLine]) -> None:
        old, self.lines = self.lines, list(lines)
        window = range(self.window_start, self.window_start + self.row_count)
        same = len(old) == len(lines) and self.row_count and all(
            old[i].rollout_id == lines[i].rollout_id for i in window)
        if not same:
            self.show_window(self.window_start, self.absolute_row if self.row_count else 0)
            return
        for i in window:
            if lines[i].cells() != old[i].cells():
                for j, cell in enumerate(self.cells(i)):
                    self.update_cell_at((i - self.window_start, j), cell)

    def on_window_changed(self) -> None:
        self.border_subtitle = f"{self.window_label()} rollouts · Enter opens one"

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        index = self.window_start + event.cursor_row
        if 0 <= index < len(self.lines):
            self.post_message(RolloutOpened(self.source, self.lines[index].rollout_id))
