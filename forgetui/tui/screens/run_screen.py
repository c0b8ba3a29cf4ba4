"""A run, live or finished: counts and throughput, pass@k/pass^k, training curves, behaviour metrics, recent errors, its rollouts."""

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
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, Static, TabbedContent, TabPane

from core.errors import ForgetuiError
from core.registry import model_shown_for
from forgetui.tui import heap
from forgetui.tui.messages import BehaviourLoaded, LoadFailed, RunLoaded
from forgetui.tui.run_data import RunDetail, RunSource, fmt, load_run
from forgetui.tui.widgets.behaviour_table import BehaviourTable
from forgetui.tui.widgets.key_footer import KeyFooter
from forgetui.tui.widgets.pass_table import PassTable
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.train_curves import TrainCurves

REFRESH_S = 2.0


def summary_text(d: RunDetail, calls_per_s: float | None) -> Text:
    """Status, progress, throughput, sandboxes busy, model; then the last errors."""
    done = sum(1 for r in d.rollouts if r.status in ("done", "failed", "timeout", "infra_error"))
    text = Text()
    text.append(d.run_id, style="bold cyan")
    text.append(f"  {d.status}", style={"done": "bold green", "running": "bold cyan", "failed": "bold red"}.get(d.status, "bold yellow"))
    env, harness = (d.config.get("env") or {}).get("name", ""), (d.config.get("harness") or {}).get("name", "")
    policy = model_shown_for((d.config.get("policy") or {}).get("backend", ""), harness)
    text.append(f"\n{env} × {harness} × {policy}", style="dim")
    text.append(f"\n{done}/{len(d.rollouts)} rollouts finished · {d.busy} in sandboxes · {d.n_calls} calls")
    if calls_per_s is not None:
        text.append(f" · {calls_per_s:.2f} calls/s")
    if d.train_steps:
        last = d.train_steps[-1]
        text.append(f"\nstep {last['step']}: reward {fmt(last.get('reward_mean'))} · pass rate {fmt(last.get('pass_rate'))}"
                    f" · loss {fmt(last.get('loss'), '.4g')} · logprob diff max {fmt(last.get('logprob_diff_max'), '.2g')}")
    for err in d.errors[-2:]:
        text.append(f"\n! {err[:200]}", style="red")
    return text


class RunScreen(Screen):
    """Loads the run on a worker (and again every REFRESH_S while it runs); Enter on a rollout opens it."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back"), Binding("r", "reload", "Refresh"),
                Binding("t", "toggle_tab", "Rollouts/curves/behaviour")]
    TABS = ("tab-lines", "tab-curves", "tab-behaviour")
    # focus lands on the rollouts at once: each focus move restyles the widget (a DataTable: ~10 ms), and
    # Textual's default would focus the first focusable widget before on_mount moved it here
    AUTO_FOCUS = "#run-lines"

    def __init__(self, source: RunSource, run_id: str | None = None, refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.source = source
        self.run_id = run_id or source.run_id
        self.refresh_s = refresh_s
        self.detail: RunDetail | None = None
        self._calls_seen: tuple[float, int] | None = None
        self._calls_per_s: float | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="run-screen"):
            with Horizontal(id="run-top"):
                yield Static(Text(f"loading {self.run_id}…", style="dim"), id="run-summary-text")
                yield PassTable(id="run-pass")
            with TabbedContent(id="run-tabs"):
                with TabPane("Rollouts", id="tab-lines"):
                    yield RolloutLines(self.source, id="run-lines")
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

    def action_reload(self) -> None:
        self.load()
        if self.query_one("#run-tabs", TabbedContent).active == "tab-behaviour":
            self.load_behaviour()

    @on(TabbedContent.TabActivated, "#run-tabs")
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "tab-behaviour":  # computed on demand: a pass over every recorded call
            self.load_behaviour()

    @work(thread=True, exclusive=True, group="behaviour", exit_on_error=False)
    def load_behaviour(self) -> None:
        from core.analytics.metrics import behaviour_table, display_rows

        run = self.source.store_file if self.source.store_file is not None else self.source.run_dir
        try:
            self.post_message(BehaviourLoaded(*display_rows(behaviour_table([run]))))
        except ForgetuiError as exc:
            self.post_message(LoadFailed("behaviour", str(exc)))

    @on(BehaviourLoaded)
    def _behaviour_loaded(self, message: BehaviourLoaded) -> None:
        self._on_widget(BehaviourTable, lambda table: table.show_rows(message.header, message.rows))

    @work(thread=True, exclusive=True, group="run", exit_on_error=False)
    def load(self) -> None:
        try:
            if self.detail is None:  # the first load: a live run's later polls would freeze their own garbage
                with heap.loading():
                    detail = load_run(self.source, self.run_id)
            else:
                detail = load_run(self.source, self.run_id)
            self.post_message(RunLoaded(detail))
        except ForgetuiError as exc:
            self.post_message(LoadFailed("run", str(exc)))

    @on(RunLoaded)
    def _loaded(self, message: RunLoaded) -> None:
        d = message.detail
        first, self.detail = self.detail is None, d
        now = time.monotonic()
        if self._calls_seen is not None and now > self._calls_seen[0]:
            self._calls_per_s = max(0, d.n_calls - self._calls_seen[1]) / (now - self._calls_seen[0])
        self._calls_seen = (now, d.n_calls)
        self.query_one("#run-summary-text", Static).update(
            summary_text(d, self._calls_per_s if d.status == "running" else None))
        self.query_one(PassTable).show_report(d.report)
        self._on_widget(TrainCurves, lambda curves: curves.show_steps(d.train_steps))
        self.query_one(RolloutLines).show_lines(d.rollouts)
        if first:  # once: a live run's later polls would freeze their own garbage until the screen closes
            self.call_after_refresh(heap.freeze_loaded)

    def _on_widget(self, kind: type[Widget], apply: Callable[[Any], Any], tries: int = 50) -> None:
        """`apply` to this screen's `kind` widget; a lazily mounted one (a hidden tab's) gets it once it is there."""
        found = self.query(kind)
        if found:
            apply(found.first())
        elif tries > 0:
            self.call_after_refresh(self._on_widget, kind, apply, tries - 1)

    def action_toggle_tab(self) -> None:
        tabs = self.query_one("#run-tabs", TabbedContent)
        tabs.active = self.TABS[(self.TABS.index(tabs.active) + 1) % len(self.TABS)] if tabs.active in self.TABS else self.TABS[0]
        widget = {"tab-lines": RolloutLines, "tab-curves": TrainCurves, "tab-behaviour": BehaviourTable}[tabs.active]
        self._on_widget(widget, lambda w: w.focus())

    @on(LoadFailed)
    def _failed(self, message: LoadFailed) -> None:
        message.stop()
        if message.what == "behaviour":  # the run itself loaded: say it on the table, keep the summary
            self._on_widget(BehaviourTable, lambda table: setattr(table, "border_subtitle", message.error[:200]))
            return
        self.query_one("#run-summary-text", Static).update(Text(message.error, style="bold red"))
