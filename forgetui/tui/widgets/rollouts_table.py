"""Rollouts, one row each (key = rollout_id); updated in place so the cursor stays put."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from forgetui.tui.data import ROLLOUT_COLUMNS, RolloutRow
from forgetui.tui.run_data import RolloutLine
from forgetui.tui.widgets.gradual import add_gradually

STATUS_STYLES = {"done": "green", "failed": "red", "timeout": "yellow", "infra_error": "magenta",
                 "running": "cyan", "starting": "cyan", "verifying": "cyan", "pending": "dim"}


def styled(column: str, value: str, row: RolloutRow | RolloutLine) -> Text | str:
    """Colour the status cell (and a passing/failing reward); other cells stay plain text."""
    if column == "status":
        return Text(value, style=STATUS_STYLES.get(value, ""))
    if column == "reward" and value and row.passed is not None:
        return Text(value, style="green" if row.passed else "red")
    return value


class RolloutsTable(DataTable):
    """Shows RolloutRow cells for `columns`; `show_rollouts` diffs against what is shown."""

    BORDER_TITLE = "Rollouts"

    def __init__(self, columns: tuple[str, ...] = ROLLOUT_COLUMNS, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self.columns_shown = columns
        self._cells: dict[str, tuple[str, ...]] = {}
        self._rows: dict[str, RolloutRow] = {}

    def on_mount(self) -> None:
        for name in self.columns_shown:
            self.add_column(name, key=name)

    def show_rollouts(self, rows: list[RolloutRow]) -> None:
        """Add new rows, update changed cells, remove rows no longer there."""
        wanted = {r.rollout_id: r for r in rows}
        for gone in [k for k in self._cells if k not in wanted]:
            if gone in self.rows:
                self.remove_row(gone)
            del self._cells[gone]
            self._rows.pop(gone, None)
        new = []
        for rid, row in wanted.items():
            cells = row.cells(self.columns_shown)
            old = self._cells.get(rid)
            if old is None:
                new.append(rid)
            elif old != cells and rid in self.rows:
                for col, a, b in zip(self.columns_shown, old, cells, strict=True):
                    if a != b:
                        self.update_cell(rid, col, styled(col, b, row))
            self._cells[rid] = cells
            self._rows[rid] = row
        add_gradually(self, new, self._styled_cells)
        self.border_subtitle = f"{len(rows)} rollouts"

    def _styled_cells(self, rid: str) -> list[Text | str] | None:
        if rid not in self._cells:
            return None
        return [styled(c, v, self._rows[rid]) for c, v in zip(self.columns_shown, self._cells[rid], strict=True)]

    def clear_rollouts(self) -> None:
        self.clear()
        self._cells.clear()
        self._rows.clear()
        self.border_subtitle = ""

    def shown(self) -> dict[str, tuple[str, ...]]:
        """The cells shown per rollout id (plain text)."""
        return dict(self._cells)
