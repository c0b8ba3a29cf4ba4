"""The home screen: tabs Runs, Calls, Rollouts and SQL (and the live run's own tab when `forgetui run` opened the
TUI). The Calls, Rollouts and SQL tabs follow the run in focus: the one under the Runs list's cursor (or the
live run once it started). The Runs list's actions — new run, stop, resume, delete, gc, compare — live here,
and the footer shows a key only where it does something."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Static, TabbedContent, TabPane

from core.errors import ForgetuiError
from forgetui.tui import launcher
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.rows import SORT_KEYS, RunInfo
from forgetui.tui.screens.compare_screen import CompareScreen
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.source import RunCatalog, RunSource
from forgetui.tui.sql_history import SqlHistory
from forgetui.tui.widgets.calls_pane import CallsPane
from forgetui.tui.widgets.filter_bar import FilterBar
from forgetui.tui.widgets.key_footer import KeyFooter
from forgetui.tui.widgets.line_table import LineTable
from forgetui.tui.widgets.live_run import LiveRun
from forgetui.tui.widgets.rollouts_pane import RolloutsPane
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.sql_console import SqlConsole

if TYPE_CHECKING:
    from core.config import RunConfig

log = logging.getLogger(__name__)

TABS = ("tab-live", "tab-runs", "tab-calls", "tab-rollouts", "tab-sql")
TAB_FOCUS = {"tab-live": "#live-rollouts", "tab-runs": "#runs", "tab-calls": "#calls-table",
             "tab-rollouts": "#rollouts-table", "tab-sql": "#sql-input"}
RESUMABLE = frozenset({"failed", "interrupted", "stale"})


def empty_home_text(home: Path) -> Group:
    """What the Runs tab says before there is any run: how to start one."""
    keys = Table.grid(padding=(0, 2))
    keys.add_column(style="bold cyan", no_wrap=True)
    keys.add_column()
    keys.add_row("n", "start a run from a form: env, harness, model, samples, training steps")
    keys.add_row("forgetui demo", "in a shell: short evals and a short training on built-in models")
    keys.add_row("forgetui run CONFIG.toml", "in a shell: a run from a config file (examples/demo.toml)")
    return Group(Text(f"No runs yet under {home}.\n", style="bold"), keys,
                 Text("\nRuns appear here as they write their stores, live ones included. ? lists every key.",
                      style="dim"))


class HomeScreen(Screen):
    """Given `run_config`, it also runs it (the live run's tab, first) and the run is in focus once it started."""

    class RunsListed(Message):
        """A fresh list of every run under FORGETUI_HOME."""

        def __init__(self, runs: list[RunInfo]) -> None:
            super().__init__()
            self.runs = runs

    class ListFailed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    class Launched(Message):
        """A run process started from here: its launch record (the Runs list follows it)."""

        def __init__(self, record_path: Path) -> None:
            super().__init__()
            self.record_path = record_path

    class Done(Message):
        """A worker's action on a run finished (launched, stopped, deleted, gc): what to tell the user."""

        def __init__(self, note: str, title: str = "", error: bool = False) -> None:
            super().__init__()
            self.note = note
            self.title = title
            self.error = error

    AUTO_FOCUS = "#runs"
    BINDINGS = [
        Binding("q", "app.quit", "Quit"),
        Binding("n", "new_run", "New run"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("c", "compare", "Compare"),
        Binding("x", "stop", "Stop"),
        Binding("R", "resume", "Resume"),
        Binding("D", "delete", "Delete"),
        Binding("g", "gc", "gc"),
        Binding("S", "sort", "Sort", show=False),
        Binding("r", "refresh", "Refresh", show=False),
        Binding("left", "step_tab(-1)", "Tabs", key_display="←→"),
        Binding("right", "step_tab(1)", "Next tab", show=False),
        *(Binding(str(n), f"show_tab('{tab}')", tab[4:].capitalize(), show=False) for n, tab in enumerate(TABS)),
    ]

    def __init__(self, catalog: RunCatalog, *, refresh_s: float = 2.0, list_s: float = 5.0,
                 run_config: RunConfig | None = None, resume: str | None = None, ks: list[int] | None = None,
                 poll_s: float = 1.0) -> None:
        super().__init__()
        self.catalog = catalog
        self.refresh_s = refresh_s
        self.list_s = list_s
        self.run_config = run_config
        self.run_args = {"resume": resume, "ks": ks, "poll_s": poll_s}
        self.in_focus: tuple[RunSource, str] | None = None  # what the Calls, Rollouts and SQL tabs show
        self._last_error: str | None = None
        if run_config is not None:
            self.AUTO_FOCUS = "#live-rollouts"

    @property
    def live(self) -> LiveRun | None:
        found = self.query(LiveRun)
        return found.first() if found else None

    @property
    def runs(self) -> RunsTable:
        return self.query_one(RunsTable)

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(id="tabs", initial="tab-live" if self.run_config is not None else "tab-runs"):
            if self.run_config is not None:
                with TabPane("Run", id="tab-live"):
                    yield LiveRun(self.run_config, id="live", **self.run_args)  # type: ignore[arg-type]
            with TabPane("Runs", id="tab-runs"), Vertical(id="runs-pane"):
                yield FilterBar("runs", placeholder="filter runs (any column; Enter keeps it, Esc clears)")
                yield RunsTable(id="runs")
                yield Static(empty_home_text(self.catalog.home_path()), id="empty-home")
            with TabPane("Calls", id="tab-calls"):
                yield CallsPane(refresh_s=self.refresh_s, id="calls")
            with TabPane("Rollouts", id="tab-rollouts"):
                yield RolloutsPane(refresh_s=self.refresh_s, id="rollouts")
            with TabPane("SQL", id="tab-sql"):
                yield SqlConsole(SqlHistory(self.catalog.home_path() / "tui" / "sql_history.json"), id="sql")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.list_runs()
        self.set_interval(self.list_s, self._tick)

    # ------------------------------------------------------------------ the runs
    def _tick(self) -> None:
        for launched in getattr(self.app, "launched", []):
            launched.alive()  # reaps a launched process that ended, so its pid is free
        if not any(w.group == "list" and w.is_running for w in self.workers):  # a slow store must not pile up threads
            self.list_runs()

    @work(thread=True, exclusive=True, group="list", exit_on_error=False)
    def list_runs(self) -> None:
        """Every run under FORGETUI_HOME (a broken folder must not take the TUI down: its error is shown)."""
        try:
            self.post_message(self.RunsListed(self.catalog.list()))
        except Exception as exc:
            log.exception("listing the runs failed")
            self.post_message(self.ListFailed(f"{type(exc).__name__}: {exc}"))

    @on(RunsListed)
    @dropped_once_closed
    def _listed(self, message: RunsListed) -> None:
        table = self.runs
        table.show_runs(message.runs)
        empty = not message.runs
        table.display = not empty
        self.query_one("#empty-home").display = empty
        if not empty and self.focused is None and self.active_tab == "tab-runs":
            table.focus()  # the first runs appeared (the table was hidden, so nothing had the focus)
        self.refresh_bindings()

    @on(ListFailed)
    def _list_failed(self, message: ListFailed) -> None:
        if message.error != self._last_error:  # periodic refreshes must not repeat the same toast
            self._last_error = message.error
            self.notify(message.error, title="cannot list the runs", severity="error", markup=False)

    @on(LineTable.Highlighted, "#runs")
    def _run_highlighted(self, event: LineTable.Highlighted) -> None:
        info: RunInfo | None = event.row
        # under `forgetui run` the live run stays in focus until the user picks another on the Runs list
        # (a refresh of the list, behind the live tab, moves its cursor without the user)
        picked = self.run_config is None or self.active_tab == "tab-runs"
        if info is not None and info.kind != "launch" and picked:
            self.set_in_focus(info.source, info.run_id)
        self.refresh_bindings()

    @on(LineTable.Selected, "#runs")
    def _run_opened(self, event: LineTable.Selected) -> None:
        info: RunInfo = event.row
        if info.kind == "launch":
            self._show_launch(info)
        else:
            self.app.push_screen(RunScreen(info.source, info.run_id))

    def _show_launch(self, info: RunInfo) -> None:
        record = info.launch
        if record is None:
            return
        question = (f"{info.run_id}: `forgetui {' '.join(record.args)}`\n\n"
                    + (f"{info.reason}\n\n" if info.reason else "still starting\n\n") + f"output: {record.log_path}")

        def answer(choice: str | None) -> None:
            if choice == "forget":
                self.delete(info)

        choices = (("close", "Close"),) + ((("forget", "Forget it"),) if info.status == "refused" else ())
        self.app.push_screen(Confirm(question, choices), answer)

    # ------------------------------------------------------------------ the run in focus
    def set_in_focus(self, source: RunSource, run_id: str) -> None:
        """The Calls, Rollouts and SQL tabs follow this run from now on."""
        if self.in_focus == (source, run_id):
            return
        self.in_focus = (source, run_id)
        self.sub_title = f"run {run_id}" if source.store_file is None else f"{run_id} · {source.store}"
        self._show_tab_data()

    def _show_tab_data(self) -> None:
        source, run_id = self.in_focus if self.in_focus is not None else (None, None)
        tab = self.active_tab
        self.query_one(CallsPane).show(source, tab == "tab-calls")
        self.query_one(RolloutsPane).show(source, run_id, tab == "tab-rollouts")
        self.query_one(SqlConsole).show_source(source)

    @property
    def active_tab(self) -> str:
        return self.query_one("#tabs", TabbedContent).active

    @on(TabbedContent.TabActivated, "#tabs")
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._show_tab_data()
        self.refresh_bindings()

    @on(LiveRun.Started)
    def _live_started(self, message: LiveRun.Started) -> None:
        live = self.live
        if live is not None and live.source is not None:
            self.set_in_focus(live.source, message.run_id)
        run_id = message.run_id
        self.runs.follow_row(lambda info: info.kind == "run" and info.run_id == run_id)  # the Runs list's cursor too
        self.list_runs()

    @on(LineTable.Selected, "#live-rollouts")
    def _live_rollout(self, event: LineTable.Selected) -> None:
        live = self.live
        if live is not None and live.source is not None:
            self.app.push_screen(RolloutScreen(live.source, event.row.rollout_id))

    # ------------------------------------------------------------------ keys
    def _runs_shown(self) -> RunsTable | None:
        """The Runs list when its tab is the one shown and it has runs (None also while the screen closes)."""
        tabs, runs = self.query("#tabs"), self.query(RunsTable)
        if not tabs or not runs or tabs.first(TabbedContent).active != "tab-runs" or not runs.first().display:
            return None
        return runs.first(RunsTable)

    def _selected(self) -> RunInfo | None:
        runs = self._runs_shown()
        return runs.selected if runs is not None else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A key shows in the footer only where it does something: the Runs list's keys on its tab, stop on a
        run that runs, resume on one that stopped, delete on one that does not run, compare on a run."""
        info = self._selected()
        if action == "filter":
            tabs = self.query("#tabs")
            tab = tabs.first(TabbedContent).active if tabs else ""
            return tab in ("tab-calls", "tab-rollouts") or tab == "tab-runs" and self._runs_shown() is not None
        if action in ("sort", "gc"):
            return self._runs_shown() is not None
        if action == "compare":
            return info is not None and info.kind != "launch"
        if action == "stop":
            return info is not None and info.kind == "run" and info.live
        if action == "resume":
            return info is not None and info.kind == "run" and info.shown_status in RESUMABLE and not info.live
        if action == "delete":
            return info is not None and (info.kind == "run" and not info.live or info.kind == "launch" and info.status == "refused")
        if action == "show_tab" and parameters == ("tab-live",):
            return self.run_config is not None
        return True

    def action_refresh(self) -> None:
        self.list_runs()
        self._show_tab_data()
        pane = {"tab-calls": CallsPane, "tab-rollouts": RolloutsPane}.get(self.active_tab)
        if pane is CallsPane and self.in_focus is not None:
            self.query_one(CallsPane).load_calls(self.in_focus[0], force=True)
        elif pane is RolloutsPane and self.in_focus is not None:
            self.query_one(RolloutsPane).load(*self.in_focus, force=True)

    def action_show_tab(self, tab: str) -> None:
        if tab == "tab-live" and self.run_config is None:
            return
        self.query_one("#tabs", TabbedContent).active = tab
        target = self.query(TAB_FOCUS[tab])
        if target and target.first().display:
            target.first().focus()

    def action_step_tab(self, step: int) -> None:
        tabs = [t for t in TABS if t != "tab-live" or self.run_config is not None]
        self.action_show_tab(tabs[(tabs.index(self.active_tab) + step) % len(tabs)])

    def action_filter(self) -> None:
        pane = self.query_one(f"#{self.active_tab}", TabPane)
        bars = pane.query(FilterBar)
        if bars:
            bars.first().open()

    def action_sort(self) -> None:
        table = self.runs
        table.set_sort(SORT_KEYS[(SORT_KEYS.index(table.sort_key) + 1) % len(SORT_KEYS)])

    def action_new_run(self) -> None:
        self.app.push_screen(NewRunScreen(self.catalog.home_path() / "tui" / "configs"), self._launch_config)

    def _launch_config(self, path: Path | None) -> None:
        if path is not None:
            self.launch(["run", str(path), "--no-ui"], f"run of {path.name}")

    def action_resume(self) -> None:
        info = self._selected()
        if info is not None:
            self.launch(["run", "--resume", info.run_id, "--no-ui"], f"resume of {info.run_id}", new_run=False)

    @work(thread=True, group="launch", exit_on_error=False)
    def launch(self, args: list[str], what: str, new_run: bool = True) -> None:
        """Start `forgetui ARGS`; a new run's row gets the Runs list's cursor once it shows (a resumed run has it)."""
        try:
            started = launcher.launch(args, self.catalog.home_path())
        except (ForgetuiError, OSError) as exc:
            self.post_message(self.Done(str(exc), f"cannot start the {what}", error=True))
            return
        self.app.launched.append(started)  # type: ignore[attr-defined]
        if new_run:
            self.post_message(self.Launched(started.record_path))
        self.post_message(self.Done(f"pid {started.pid}; it keeps running if you quit. Output: {started.log_path}",
                                    f"started the {what}"))

    @on(Launched)
    def _launched(self, message: Launched) -> None:
        """The Runs list's cursor goes to the launch (and stays on it when its run appears): Calls, Rollouts and
        SQL follow it from then."""
        record = message.record_path
        self.runs.follow_row(lambda info: info.launch is not None and info.launch.path.name == record.name,
                         until=lambda info: info.kind == "run")

    @on(Done)
    def _done(self, message: Done) -> None:
        self.notify(message.note, title=message.title, severity="error" if message.error else "information", markup=False)
        self.list_runs()

    def action_stop(self) -> None:
        info = self._selected()
        if info is None:
            return

        def answer(choice: str | None) -> None:
            if choice == "yes":
                self.stop(info)

        self.app.push_screen(Confirm(
            f"Stop run {info.run_id}? Its process gets SIGTERM: its sandboxes are removed and the run is marked "
            f"interrupted (R resumes it later).", (("yes", "Stop it"), ("no", "Cancel")), focus="no"), answer)

    @work(thread=True, group="stop", exit_on_error=False)
    def stop(self, info: RunInfo) -> None:
        """SIGTERM to the run's writer (the pid in its store's live sidecar)."""
        try:
            pid = launcher.stop_run(info.source.run_dir)
        except (ForgetuiError, OSError) as exc:
            self.post_message(self.Done(str(exc), "cannot stop", error=True))
        else:
            self.post_message(self.Done(f"sent SIGTERM to pid {pid}: its sandboxes are being removed",
                                        f"stopping {info.run_id}"))

    def action_delete(self) -> None:
        info = self._selected()
        if info is None:
            return
        if info.kind == "launch":
            self.delete(info)  # a refused launch: its record and output, nothing else exists of it
            return

        def answer(choice: str | None) -> None:
            if choice == "yes":
                self.delete(info)

        self.app.push_screen(Confirm(f"Delete run {info.run_id}? Its folder goes: store, logs, checkpoints.\n"
                                     f"{info.source.run_dir}", (("yes", "Delete"), ("no", "Keep")), focus="no"), answer)

    @work(thread=True, group="delete", exit_on_error=False)
    def delete(self, info: RunInfo) -> None:
        try:
            if info.kind == "launch" and info.launch is not None:
                launcher.forget_launch(info.launch)
            else:
                launcher.delete_run(info.source.run_dir)
        except (ForgetuiError, OSError) as exc:
            self.post_message(self.Done(str(exc), "cannot delete", error=True))
        else:
            self.post_message(self.Done(f"removed {info.path}", f"deleted {info.run_id}"))

    def action_gc(self) -> None:
        def answer(choice: str | None) -> None:
            if choice == "yes":
                self.gc()

        self.app.push_screen(Confirm(
            "Remove the sandboxes (Docker containers, local folders) of every run whose process is gone?\n"
            "Runs still going keep theirs; stopped runs of any run folder lose theirs.",
            (("yes", "Remove them"), ("no", "Cancel")), focus="no"), answer)

    @work(thread=True, group="gc", exit_on_error=False)
    def gc(self) -> None:
        self.post_message(self.Done("looking for sandboxes of runs that died…", "gc"))
        try:
            said = launcher.gc(self.catalog.home_path())
        except (ForgetuiError, OSError) as exc:
            self.post_message(self.Done(str(exc), "gc failed", error=True))
        else:
            self.post_message(self.Done(said, "gc"))

    def action_compare(self) -> None:
        """The first press marks run A; the second, on another run, compares it (B) with A."""
        info = self._selected()
        table = self.runs
        if info is None:
            return
        if table.marked is None or table.marked.key == info.key:
            table.mark(None if table.marked is not None else info)
            return
        first = table.marked
        table.mark(None)
        self.app.push_screen(CompareScreen(first, info))

    def open_store(self, path: Path) -> None:
        """A store file anywhere (the palette's "Open a store"): listed, and in focus."""
        source = self.catalog.open_store(path)
        self.set_in_focus(source, source.run_id)
        self.list_runs()
        self.action_show_tab("tab-calls")
