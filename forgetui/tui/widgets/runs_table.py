"""Every run under FORGETUI_HOME, one line each: its status and scores first, then where it ran and why it failed."""

from __future__ import annotations

from typing import Any

from rich.style import Style
from textual import events

from forgetui.tui.rows import RUN_COLUMNS, RunInfo, one_line, sort_runs
from forgetui.tui.widgets.line_table import Cell, Column, LineTable

STATUS_STYLES = {"running": "cyan", "done": "green", "failed": "bold red", "interrupted": "yellow", "stale": "magenta",
                 "starting": "cyan", "refused": "bold red", "unreadable": "red", "ending": "cyan"}
# the run column keeps a whole run id (date-time-suffix): its end is what tells two runs of a minute apart
WIDTHS = {"run": Column("run", 24, shrink=True, min_width=20), "status": Column("status", 11),
          "pass rate": Column("pass rate", 9, short="pass"), "reward": Column("reward", 6, short="rew"),
          "pass@k": Column("pass@k", 9), "progress": Column("progress", 11, short="done"), "step": Column("step", 7),
          "env": Column("env", 24, shrink=True, min_width=8), "harness": Column("harness", 20, shrink=True, min_width=8),
          "model": Column("model", 32, shrink=True, min_width=10), "created": Column("created", 16, shrink=True, min_width=10),
          "why": Column("why", 120, shrink=True, min_width=12)}


class RunsTable(LineTable):
    """Runs sorted by `sort_key` and filtered by `/`; Enter posts Selected with the RunInfo."""

    COLUMNS = tuple(WIDTHS[name] for name in RUN_COLUMNS)
    NOUN = "runs"
    EMPTY = "no runs yet"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sort_key = "created"
        self.marked: RunInfo | None = None  # run A of a comparison, once chosen

    def row_key(self, row: RunInfo) -> str:
        return row.key

    def cells_of(self, row: RunInfo) -> list[Cell]:
        cells = row.cells()
        out: list[Cell] = []
        for name in RUN_COLUMNS:
            style = None
            if name == "status":
                style = STATUS_STYLES.get(cells[name])
            elif name == "run" and row.kind != "run":
                style = "dim" if row.kind == "proxy" else "italic"
            elif name == "why" and cells[name]:
                style = "red"
            value = cells[name]
            if name == "run" and self.marked is not None and row.key == self.marked.key:
                value, style = "A▸" + value, "bold magenta"
            out.append((value, Style.parse(style) if style else None))
        return out

    def show_runs(self, runs: list[RunInfo]) -> None:
        self.set_rows(sort_runs(runs, self.sort_key))

    def set_sort(self, key: str) -> None:
        self.sort_key = key
        self.set_rows(sort_runs(self.rows, key))

    def mark(self, info: RunInfo | None) -> None:
        """Mark `info` as run A of a comparison (None: no mark)."""
        self.marked = info
        self.set_rows(self.rows)

    def subtitle(self) -> str:
        """Counts and sort; run A of a comparison; why the run under the cursor failed (the why column is the
        last one, off-screen on a narrow terminal)."""
        text = super().subtitle() + f" · sorted by {self.sort_key}"
        if self.marked is not None:
            text += f" · A = {self.marked.run_id}: c on run B compares"
        row = self.selected
        if row is not None and row.reason:
            text = f"why: {one_line(row.reason, 200)} · " + text
        return text

    def on_mouse_move(self, event: events.MouseMove) -> None:
        """Hovering a run that failed shows why in full."""
        index = self.row_at(event)
        reason = self.shown[index].reason if index is not None else None
        self.tooltip = reason or None
