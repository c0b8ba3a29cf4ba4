"""A run's rollouts (status, task, sample, step, reward, calls, tokens, duration, error); Enter opens one."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from forgetui.tui.messages import RolloutOpened
from forgetui.tui.run_data import ROLLOUT_LINE_COLUMNS, RolloutLine, RunSource
from forgetui.tui.widgets.rollouts_table import STATUS_STYLES


class RolloutLines(DataTable):
    """Rows keyed by rollout id, diffed on refresh so the cursor stays put."""

    BORDER_TITLE = "Rollouts"

    def __init__(self, source: RunSource, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self.source = source
        self._cells: dict[str, dict[str, str]] = {}
        self._keys: list[str] = []  # rollout id per row (add_rows makes its own row keys)

    def on_mount(self) -> None:
        for name in ROLLOUT_LINE_COLUMNS:
            self.add_column(name, key=name)

    @staticmethod
    def _styled(column: str, value: str, line: RolloutLine) -> Text | str:
        if column == "status":
            return Text(value, style=STATUS_STYLES.get(value, ""))
        if column == "reward" and value and line.passed is not None:
            return Text(value, style="green" if line.passed else "red")
        return value

    def show_lines(self, lines: list[RolloutLine]) -> None:
        wanted = {line.rollout_id: line for line in lines}
        if list(wanted) != list(self._cells):  # order or membership changed: rebuild, keeping the cursor's row
            keep = self.cursor_row
            self.clear()
            self._cells = {}
            self.add_rows([[self._styled(c, line.cells()[c], line) for c in ROLLOUT_LINE_COLUMNS] for line in lines])
            self._keys = [line.rollout_id for line in lines]
            self._cells = {line.rollout_id: line.cells() for line in lines}
            if keep is not None and 0 <= keep < len(lines):
                self.move_cursor(row=keep, animate=False)
        else:
            for i, (rid, line) in enumerate(wanted.items()):
                cells = line.cells()
                if cells != self._cells[rid]:
                    for j, c in enumerate(ROLLOUT_LINE_COLUMNS):
                        if cells[c] != self._cells[rid][c]:
                            self.update_cell_at((i, j), self._styled(c, cells[c], line))
                    self._cells[rid] = cells
        self.border_subtitle = f"{len(lines)} rollouts · Enter opens one"

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if 0 <= event.cursor_row < len(self._keys):
            self.post_message(RolloutOpened(self.source, self._keys[event.cursor_row]))
