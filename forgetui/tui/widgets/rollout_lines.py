"""A run's rollouts, one line each: outcome, task, sample, step, reward, calls, sampled tokens, duration, error."""

from __future__ import annotations

from rich.style import Style

from forgetui.tui.rows import ROLLOUT_COLUMNS, RolloutRow
from forgetui.tui.widgets.line_table import Cell, Column, LineTable

# core's outcomes (and the statuses of rollouts not finished yet)
OUTCOME_STYLES = {"passed": "green", "passed (h.fail)": "yellow", "below_threshold": "yellow", "harness_failed": "red", "timeout": "yellow",
                  "infra_error": "magenta", "running": "cyan", "starting": "cyan", "verifying": "cyan", "pending": "dim"}
# at 80 columns the counts take short headers and the error gives up its width before the task does: the task
# name is what tells two rows apart
WIDTHS = {"outcome": Column("outcome", 15), "task": Column("task", 40, shrink=True, min_width=16),
          "sample": Column("sample", 6, short="#"), "step": Column("step", 4, short="st"),
          "reward": Column("reward", 6, short="rew"), "calls": Column("calls", 5, short="cl"),
          "tokens": Column("tokens", 7, short="tok"), "duration": Column("duration", 8, short="dur"),
          "attempt": Column("attempt", 7, short="att"), "error": Column("error", 80, shrink=True, min_width=5)}


class RolloutLines(LineTable):
    """Rollouts by step, task and sample; Enter posts Selected with the RolloutRow (its screen opens it)."""

    COLUMNS = tuple(WIDTHS[name] for name in ROLLOUT_COLUMNS)
    NOUN = "rollouts"
    EMPTY = "no rollouts yet"

    def row_key(self, row: RolloutRow) -> str:
        return row.rollout_id

    def cells_of(self, row: RolloutRow) -> list[Cell]:
        cells = row.cells()
        out: list[Cell] = []
        for name in ROLLOUT_COLUMNS:
            style = None
            if name == "outcome":
                style = OUTCOME_STYLES.get(cells[name])
            elif name == "reward" and cells[name] and row.passed is not None:
                style = "green" if row.passed else "red"
            out.append((cells[name], Style.parse(style) if style else None))
        return out

    def show_lines(self, rows: list[RolloutRow]) -> None:
        self.set_rows(rows)

    def subtitle(self) -> str:
        return super().subtitle() + " · Enter opens one"
