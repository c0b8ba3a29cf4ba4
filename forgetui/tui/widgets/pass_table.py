"""The pass@k / pass^k of a run's eval report: one row per k, a pass@k and a pass^k column per env × harness;
drawn as one Rich table, so the box is exactly as tall and wide as its content."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from forgetui.tui.rows import fmt


def report_table(report: dict[str, Any]) -> Table | None:
    """k down, each group's pass@k and pass^k across; None without a scored group."""
    groups = report.get("groups") or []
    ks = [str(k) for k in report.get("ks") or []]
    if not groups or not ks:
        return None
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    table.add_column("k", justify="right", style="bold")
    many = len(groups) > 1
    for g in groups:
        prefix = f"{g['env']}×{g['harness']} " if many else ""
        table.add_column(f"{prefix}pass@k", justify="right")
        table.add_column(f"{prefix}pass^k", justify="right")
    for k in ks:
        table.add_row(k, *(cell for g in groups for cell in (fmt(g["pass_at_k"].get(k)) or "-", fmt(g["pass_hat_k"].get(k)) or "-")))
    return table


def scores_line(report: dict[str, Any]) -> str:
    """Per group: mean score over its samples and tasks (timeouts count as 0; infra errors are left out)."""
    return " · ".join(f"mean score {fmt(g.get('mean_score'))} over {g['samples']} samples of {g['tasks']} tasks"
                      for g in report.get("groups") or [])


class PassTable(Static):
    """pass@k (unbiased) and pass^k per k; a k with too few samples per task shows -."""

    BORDER_TITLE = "pass@k / pass^k"
    DEFAULT_CSS = """
    PassTable { border: round $primary-darken-1; width: auto; height: auto; padding: 0 1; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(Text("no scored rollouts yet", style="dim"), **kwargs)
        self.report: dict[str, Any] = {}

    def show_report(self, report: dict[str, Any]) -> None:
        if report == self.report:
            return
        self.report = report
        table = report_table(report)
        self.update(table if table is not None else Text("no scored rollouts yet", style="dim"))

    def rows(self) -> list[list[str]]:
        """(k, pass@k, pass^k, ...) as shown, one list per k."""
        groups = self.report.get("groups") or []
        return [[str(k), *(fmt(g[key].get(str(k))) or "-" for g in groups for key in ("pass_at_k", "pass_hat_k"))]
                for k in self.report.get("ks") or []]
