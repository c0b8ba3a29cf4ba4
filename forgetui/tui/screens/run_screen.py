"""A run, live or finished: status and why it failed, counts and throughput, pass@k/pass^k, its rollouts,
training curves and behaviour metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.lazy import Lazy
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, Static, TabbedContent, TabPane

from core.errors import ForgetuiError
from core.registry import model_shown_for
from core.status import Tally
from forgetui.tui import heap, launcher
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.progress import ACTIVE, CallRate
from forgetui.tui.rows import RunDetail, fmt, one_line
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.source import RunSource
from forgetui.tui.widgets.behaviour_table import BehaviourTable
from forgetui.tui.widgets.filter_bar import FilterBar
from forgetui.tui.widgets.key_footer import KeyFooter
from forgetui.tui.widgets.line_table import LineTable
from forgetui.tui.widgets.pass_table import PassTable, scores_line
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.train_curves import TrainCurves

REFRESH_S = 2.0
WHY_HINT = ("failed before any rollout finished, and the run recorded no reason: the process that ran it printed "
            "it (runs launched from this TUI keep their output in FORGETUI_HOME/tui/launched/)")


def summary_text(d: RunDetail, calls_per_s: float | None) -> Text:
    """Status (and why it failed), env × harness × model, progress by outcome, throughput; then the last errors."""
    tally = Tally()
    for r in d.rollouts:
        tally.add(r.status, r.passed)
    text = Text()
    text.append(d.run_id, style="bold cyan")
    text.append(f"  {d.status}", style={"done": "bold green", "running": "bold cyan", "failed": "bold red"}.get(d.status, "bold yellow"))
    if d.status not in ("done", "running", "starting"):
        why = d.reason or (WHY_HINT if d.status == "failed" and not tally.finished else None)
        if why:
            text.append(f"\nwhy: {why}", style="bold red" if d.reason else "red")
    env, harness = (d.config.get("env") or {}).get("name", ""), (d.config.get("harness") or {}).get("name", "")
    policy = model_shown_for((d.config.get("policy") or {}).get("backend", ""), harness)
    text.append(f"\n{env} × {harness} × {policy}", style="dim")
    text.append(f"\n{tally.finished}/{len(d.rollouts)} rollouts finished · {d.busy} in sandboxes · {d.n_calls} calls")
    if calls_per_s is not None:
        text.append(f" · {calls_per_s:.2f} calls/s")
    counts = [f"{label} {n}" for label, n in (("passed", tally.passed), ("below threshold", tally.below_threshold),
                                              ("harness failed", tally.harness_failed), ("timeout", tally.timeout),
                                              ("infra error", tally.infra_error)) if n]
    if counts:
        text.append("\n" + " · ".join(counts))
    scores = scores_line(d.report)
    if scores:
        text.append(f"\n{scores}")
    if d.train_steps:
        last = d.train_steps[-1]
        text.append(f"\nstep {last['step']}: reward {fmt(last.get('reward_mean'))} · pass rate {fmt(last.get('pass_rate'))}"
                    f" · loss {fmt(last.get('loss'), '.4g')} · logprob diff max {fmt(last.get('logprob_diff_max'), '.2g')}")
    for err in d.errors[-2:]:
        text.append(f"\n! {err[:200]}", style="red")
    return text


def refresh_error(error: str) -> str:
    """A failed refresh in a line: DuckDB's lock error (its writer holds the file) in words."""
    if "Could not set lock" in error or "Conflicting lock" in error:
        return "the store is locked by its writer for a moment"
    return one_line(error, 160)


class RunScreen(Screen):
    """Loads the run on a worker (and again every REFRESH_S while it runs); Enter on a rollout opens it."""

    class Loaded(Message):
        def __init__(self, detail: RunDetail, live: bool = False) -> None:
            super().__init__()
            self.detail = detail
            self.live = live  # a process writes it now (its store's live sidecar names one)

    class BehaviourLoaded(Message):
        """The run's behaviour table (header, rows) as `forgetui analyze` prints it."""

        def __init__(self, header: list[str], rows: list[list[str]]) -> None:
            super().__init__()
            self.header = header
            self.rows = rows

    class Stopping(Message):
        """What stopping the run did (or why it could not)."""

        def __init__(self, note: str, error: bool = False) -> None:
            super().__init__()
            self.note = note
            self.error = error

    class Failed(Message):
        def __init__(self, what: str, error: str) -> None:
            super().__init__()
            self.what = what
            self.error = error

    CSS_PATH = "run_screen.tcss"
    BINDINGS = [Binding("escape", "app.pop_screen", "Back", key_display="esc/q"),
                Binding("q", "app.pop_screen", "Back", show=False), Binding("r", "reload", "Refresh"),
                Binding("slash", "filter", "Filter", key_display="/"),
                Binding("left", "step_tab(-1)", "Tabs", key_display="←→"),
                Binding("right", "step_tab(1)", "Next tab", show=False),
                Binding("t", "step_tab(1)", "Next tab"),
                Binding("x", "stop", "Stop run")]  # where ←/→ move inside a table (behaviour), t still does
    TABS = ("tab-lines", "tab-curves", "tab-behaviour")
    # focus lands on the rollouts at once: each focus move restyles the widget, and Textual's default would
    # focus the first focusable widget before on_mount moved it here
    AUTO_FOCUS = "#run-lines"

    def __init__(self, source: RunSource, run_id: str | None = None, refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.source = source
        self.run_id = run_id or source.run_id
        self.refresh_s = refresh_s
        self.detail: RunDetail | None = None
        self._rate = CallRate()
        self._calls_per_s: float | None = None
        self.live = False  # a process writes the run now: x stops it

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="run-screen"):
            with Horizontal(id="run-top"):
                yield Static(Text(f"loading {self.run_id}…", style="dim"), id="run-summary-text")
                yield PassTable(id="run-pass")
            with TabbedContent(id="run-tabs"):
                with TabPane("Rollouts", id="tab-lines"), Vertical():
                    yield FilterBar("run-lines", placeholder="filter rollouts (any column; Enter keeps it, Esc clears)")
                    yield RolloutLines(id="run-lines")
                # the hidden tabs' widgets mount after the first paint: styling and laying them out with the
                # rest made the Run screen's first frame the TUI benchmark's worst stall
                with TabPane("Training curves", id="tab-curves"):
                    yield Lazy(TrainCurves(id="run-curves"))
                with TabPane("Behaviour", id="tab-behaviour"):
                    yield Lazy(BehaviourTable(id="run-behaviour"))
        yield KeyFooter()

    def on_unmount(self) -> None:
        heap.thaw()

    def on_mount(self) -> None:
        self.sub_title = f"run {self.run_id}"
        self.action_reload()
        self.set_interval(self.refresh_s, self._tick)

    def _tick(self) -> None:
        live = self.detail is None or self.detail.status in ("running", "starting") or self.source.live()
        if live and not any(w.is_running for w in self.workers):
            self.action_reload()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "filter":
            return self.query_one("#run-tabs", TabbedContent).active == "tab-lines"
        if action == "stop":
            return self.live
        return True

    def action_stop(self) -> None:
        """Stop the run (after asking): SIGTERM to its writer, or the TUI's own run when `forgetui run` runs it here."""
        if not self.live:
            return

        def answer(choice: str | None) -> None:
            if choice != "yes":
                return
            inside = getattr(self.app, "live", None)
            if inside is not None and inside.progress.run_id == self.run_id and inside.state in ACTIVE:
                inside.stop()
            else:
                self.stop_writer()

        self.app.push_screen(Confirm(
            f"Stop run {self.run_id}? Its sandboxes are removed and it is marked interrupted "
            f"(`forgetui run --resume {self.run_id}` finishes it).", (("yes", "Stop it"), ("no", "Cancel")), focus="no"),
            answer)

    @work(thread=True, group="stop", exit_on_error=False)
    def stop_writer(self) -> None:
        try:
            pid = launcher.stop_run(self.source.run_dir)
        except (ForgetuiError, OSError) as exc:
            self.post_message(self.Stopping(str(exc), error=True))
        else:
            self.post_message(self.Stopping(f"sent SIGTERM to pid {pid}: its sandboxes are being removed"))

    @on(Stopping)
    @dropped_once_closed
    def _stopping(self, message: Stopping) -> None:
        self.notify(message.note, title=f"stopping {self.run_id}", severity="error" if message.error else "information",
                    markup=False)
        self.action_reload()

    def action_reload(self) -> None:
        self.load()
        if self.query_one("#run-tabs", TabbedContent).active == "tab-behaviour":
            self.load_behaviour()

    def action_filter(self) -> None:
        self.query_one(FilterBar).open()

    @on(TabbedContent.TabActivated, "#run-tabs")
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "tab-behaviour":  # computed on demand: a pass over every recorded call
            self.load_behaviour()
        self.refresh_bindings()

    @work(thread=True, exclusive=True, group="behaviour", exit_on_error=False)
    def load_behaviour(self) -> None:
        from core.analytics.metrics import behaviour_table, display_rows

        run = self.source.store_file if self.source.store_file is not None else self.source.run_dir
        try:
            self.post_message(self.BehaviourLoaded(*display_rows(behaviour_table([run]))))
        except ForgetuiError as exc:
            self.post_message(self.Failed("behaviour", str(exc)))

    @on(BehaviourLoaded)
    @dropped_once_closed
    def _behaviour_loaded(self, message: BehaviourLoaded) -> None:
        self._on_widget(BehaviourTable, lambda table: table.show_rows(message.header, message.rows))

    @work(thread=True, exclusive=True, group="run", exit_on_error=False)
    def load(self) -> None:
        try:
            if self.detail is None:  # the first load: a live run's later polls would freeze their own garbage
                with heap.loading():
                    detail = self.source.run_detail(self.run_id)
            else:
                detail = self.source.run_detail(self.run_id)
            self.post_message(self.Loaded(detail, live=detail.status in ("running", "starting") and self.source.live()))
        except ForgetuiError as exc:
            self.post_message(self.Failed("run", str(exc)))

    @on(Loaded)
    @dropped_once_closed
    def _loaded(self, message: Loaded) -> None:
        d = message.detail
        first, self.detail = self.detail is None, d
        if message.live != self.live:
            self.live = message.live
            self.refresh_bindings()
        self._calls_per_s = self._rate.add(time.monotonic(), d.n_calls)
        self.query_one("#run-summary-text", Static).update(
            summary_text(d, self._calls_per_s if d.status == "running" else None))
        self.query_one(PassTable).show_report(d.report)
        self._on_widget(TrainCurves, lambda curves: curves.show_steps(d.train_steps))
        self.query_one(RolloutLines).show_lines(d.rollouts)
        if first:  # once: a live run's later polls would freeze their own garbage until the screen closes
            self.call_after_refresh(heap.freeze_loaded)

    @on(LineTable.Selected, "#run-lines")
    def _open(self, event: LineTable.Selected) -> None:
        self.app.push_screen(RolloutScreen(self.source, event.row.rollout_id))

    def _on_widget(self, kind: type[Widget], apply: Callable[[Any], Any], tries: int = 50) -> None:
        """`apply` to this screen's `kind` widget; a lazily mounted one (a hidden tab's) gets it once it is there."""
        found = self.query(kind)
        if found:
            apply(found.first())
        elif tries > 0:
            self.call_after_refresh(self._on_widget, kind, apply, tries - 1)

    def action_step_tab(self, step: int) -> None:
        tabs = self.query_one("#run-tabs", TabbedContent)
        tabs.active = self.TABS[(self.TABS.index(tabs.active) + step) % len(self.TABS)] if tabs.active in self.TABS else self.TABS[0]
        widget = {"tab-lines": RolloutLines, "tab-curves": TrainCurves, "tab-behaviour": BehaviourTable}[tabs.active]
        self._on_widget(widget, lambda w: w.focus())

    @on(Failed)
    @dropped_once_closed
    def _failed(self, message: Failed) -> None:
        if message.what == "behaviour":  # the run itself loaded: say it on the table, keep the summary
            self._on_widget(BehaviourTable, lambda table: setattr(table, "border_subtitle", message.error[:200]))
            return
        if self.detail is not None:  # a refresh failed (a store busy a moment, as a resumed run reopens it): keep
            # what was shown, say it under it; the next refresh retries
            shown = summary_text(self.detail, self._calls_per_s if self.detail.status == "running" else None)
            shown.append(f"\n(refresh failed, retrying: {refresh_error(message.error)})", style="dim")
            self.query_one("#run-summary-text", Static).update(shown)
            return
        self.query_one("#run-summary-text", Static).update(Text(message.error, style="bold red"))
