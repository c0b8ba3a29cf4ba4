"""The live run dashboard: run id and store, progress, throughput, the reward curve, rollouts and the summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import ProgressBar, Static

from forgetui.tui.data import ROLLOUT_COLUMNS, RunProgress
from forgetui.tui.widgets.reward_chart import RewardChart
from forgetui.tui.widgets.rollouts_table import RolloutsTable

if TYPE_CHECKING:
    from core.eval.summary import RunSummary

STATE_STYLES = {"starting": "yellow", "running": "cyan", "stopping": "bold yellow", "interrupted": "bold yellow",
                "done": "bold green", "failed": "bold red"}


def counts_text(progress: RunProgress) -> Text:
    c = progress.counts()
    text = Text(f"{c.done}/{c.total} done", style="bold")
    for label, n, style in (("passed", c.passed, "green"), ("failed", c.failed, "red"),
                            ("timeouts", c.timeouts, "yellow"), ("infra errors", c.infra_errors, "magenta")):
        text.append("  ·  ")
        text.append(f"{label} {n}", style=style if n else "dim")
    return text


def throughput_text(progress: RunProgress, now: float) -> Text:
    rpm = progress.rollouts_per_min(now)
    text = Text("throughput  ", style="bold")
    text.append("-" if rpm is None else f"{rpm:.1f}")
    text.append(" rollouts/min  ·  ")
    text.append("-" if progress.calls_per_s is None else f"{progress.calls_per_s:.2f}")
    text.append(" calls/s  ·  ")
    text.append("-" if progress.n_calls is None else str(progress.n_calls))
    text.append(" calls recorded")
    return text


def summary_text(summary: RunSummary) -> Text:
    """Counts, mean reward, pass@k and pass^k of a finished run."""
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    text = Text("Summary  ", style="bold underline")
    text.append(f"{summary.rollouts} rollouts: passed {summary.passed} · failed {summary.failed} · "
                f"timeouts {summary.timeouts} · infra errors {summary.infra_errors} · "
                f"mean reward {fmt(summary.mean_reward)}\n")
    text.append("pass@k  " + "  ".join(f"pass@{k} {fmt(v)}" for k, v in summary.pass_at_k.items()) + "\n")
    text.append("pass^k  " + "  ".join(f"pass^{k} {fmt(v)}" for k, v in summary.pass_hat_k.items()))
    if summary.extra.get("eval_json"):
        text.append(f"\neval report {summary.extra['eval_json']}", style="dim")
    text.append("\npress q to quit", style="dim")
    return text


class RunDashboard(Vertical):
    """Filled by the app from a RunProgress (attributes down); it keeps no run state of its own."""

    BORDER_TITLE = "Run"

    def compose(self) -> ComposeResult:
        yield Static("", id="run-header")
        with Horizontal(id="run-progress-bar"):
            yield ProgressBar(total=None, show_eta=False, id="run-bar")
            yield Static("", id="run-counts")
        yield Static(throughput_text(RunProgress(), 0.0), id="run-throughput")
        yield RewardChart(id="run-reward")
        yield RolloutsTable(ROLLOUT_COLUMNS, id="run-rollouts")
        yield Static("", id="run-summary")

    def show_state(self, state: str, run_id: str | None, store: object | None, detail: str | None = None) -> None:
        """The header line: run id, state, store path, and a detail line (an error, what to do next)."""
        text = Text("run ", style="bold")
        text.append(run_id or "(planning…)", style="bold cyan")
        text.append("  ")
        text.append(state, style=STATE_STYLES.get(state, ""))
        text.append(f"\nstore {store if store is not None else '-'}", style="dim")
        if detail:
            text.append(f"\n{detail}", style="red" if state == "failed" else "yellow")
        self.query_one("#run-header", Static).update(text)
        self.border_subtitle = state

    def show_progress(self, progress: RunProgress, now: float) -> None:
        c = progress.counts()
        bar = self.query_one("#run-bar", ProgressBar)
        if c.total:
            bar.update(total=c.total, progress=c.done)
        self.query_one("#run-counts", Static).update(counts_text(progress))
        self.query_one("#run-throughput", Static).update(throughput_text(progress, now))
        self.query_one(RewardChart).show_curve(progress.reward_curve(), progress.rewards)
        self.query_one("#run-rollouts", RolloutsTable).show_rollouts(progress.sorted_rows())

    def show_summary(self, summary: RunSummary) -> None:
        self.query_one("#run-summary", Static).update(summary_text(summary))
