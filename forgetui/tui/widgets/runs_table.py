"""Every run under FORGETUI_HOME, one row each (key = run id): status, env, harness, model, progress, scores, step."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from forgetui.tui.messages import RunOpened
from forgetui.tui.run_data import RUN_COLUMNS, RunInfo, filter_runs, sort_runs

STATUS_STYLES = {"running": "cyan", "done": "green", "failed": "red", "interrupted": "yellow", "stale": "magenta",
                 "starting": "cyan"}


class RunsTable(DataTable):
    """Shows the catalog's runs filtered by `filter_text` and sorted by `sort_key`; Enter posts RunOpened."""

    BORDER_TITLE = "Runs"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self.runs: list[RunInfo] = []
        self.shown: list[RunInfo] = []
        self.filter_text = ""
        self.sort_key = "created"

    def on_mount(self) -> None:
        for name in RUN_COLUMNS:
            self.add_column(name, key=name)

    def show_runs(self, runs: list[RunInfo]) -> None:
        self.runs = list(runs)
        self._redraw()

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self._redraw()

    def set_sort(self, key: str) -> None:
        self.sort_key = key
        self._redraw()

    def selected(self) -> RunInfo | None:
        if not self.shown or self.cursor_row is None or not 0 <= self.cursor_row < len(self.shown):
            return None
        return self.shown[self.cursor_row]

    def _redraw(self) -> None:
        keep = self.selected()
        shown = sort_runs(filter_runs(self.runs, self.filter_text), self.sort_key)
        if [r.cells() for r in shown] == [r.cells() for r in self.shown]:
            self.shown = shown
            return
        self.shown = shown
        self.clear()
        for info in shown:
            cells = info.cells()
            row = [Text(cells[c], style=STATUS_STYLES.get(cells[c], "")) if c == "status" else cells[c]
                   for c in RUN_COLUMNS]
            if info.kind == "proxy":
                row[0] = Text(cells["run"] + " (proxy)", style="dim")
            self.add_row(*row, key=f"{info.path}::{info.run_id}")
        if keep is not None:
            for i, info in enumerate(shown):
                if (info.path, info.run_id) == (keep.path, keep.run_id):
                    self.move_cursor(row=i)
        filt = f" · filter “{self.filter_text}”" if self.filter_text else ""
        self.border_subtitle = f"{len(shown)}/{len(self.runs)} runs · sorted by {self.sort_key}{filt}"

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        info = self.selected()
        if info is not None:
            self.post_message(RunOpened(info))
