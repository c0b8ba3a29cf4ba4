"""The pass@k / pass^k table of a run's eval report (one row per env × harness group)."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable

from forgetui.tui.run_data import fmt


def report_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows): env, harness, tasks, samples, mean score, pass@k… then pass^k…, timeouts, infra errors."""
    ks = [str(k) for k in report.get("ks") or []]
    columns = ["env", "harness", "tasks", "samples", "mean", *(f"pass@{k}" for k in ks), *(f"pass^{k}" for k in ks),
               "timeouts", "infra"]
    rows = []
    for g in report.get("groups") or []:
        rows.append([str(g["env"]), str(g["harness"]), str(g["tasks"]), str(g["samples"]), fmt(g.get("mean_score")),
                     *(fmt(g["pass_at_k"].get(k)) for k in ks), *(fmt(g["pass_hat_k"].get(k)) for k in ks),
                     str(g.get("timeouts", 0)), str(g.get("infra_errors", 0))])
    return columns, rows


class PassTable(DataTable):
    """pass@k (unbiased) and pass^k per env × harness; a k with too few samples per task shows blank."""

    BORDER_TITLE = "pass@k / pass^k"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="none", show_cursor=False, **kwargs)  # type: ignore[arg-type]
        self._shown: tuple | None = None

    def show_report(self, report: dict[str, Any]) -> None:
        columns, rows = report_rows(report)
        if (columns, rows) == self._shown:
            return
        self._shown = (columns, rows)
        self.clear(columns=True)
        self.add_columns(*columns)
        self.add_rows(rows)
