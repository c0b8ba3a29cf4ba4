"""The forgetui TUI app: workers do every read and post messages; handlers update widgets."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import DataTable, Header, Input, TabbedContent, TabPane

from core.errors import ForgetuiError
from core.store.query import QueryCancel
from forgetui.tui import data, heap, launcher, run_data, settings
from forgetui.tui.messages import (
    CallLoaded,
    CallSelected,
    CallsLoaded,
    LoadFailed,
    RolloutFinished,
    RolloutOpened,
    RolloutsLoaded,
    RunFailed,
    RunFinished,
    RunInterrupted,
    RunOpened,
    RunPolled,
    RunsLoaded,
    RunSql,
    RunStarted,
    SqlFinished,
    StoreSelected,
    StoresLoaded,
)
from forgetui.tui.screens.confirm import Confirm, Prompt
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.sql_history import SqlHistory
from forgetui.tui.widgets.call_inspector import CallInspector
from forgetui.tui.widgets.calls_table import CallsTable
from forgetui.tui.widgets.key_footer import KeyFooter
from forgetui.tui.widgets.result_table import ResultTable
from forgetui.tui.widgets.rollouts_table import RolloutsTable
from forgetui.tui.widgets.run_dashboard import RunDashboard
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.sql_console import CancelSql, ExportSql, SqlConsole
from forgetui.tui.widgets.store_list import StoreList

if TYPE_CHECKING:
    from core.config import RunConfig

log = logging.getLogger(__name__)

ACTIVE_RUN_STATES = frozenset({"starting", "running"})
TAB_FOCUS = {"tab-runs": "#runs", "tab-calls": "#calls", "tab-sql": "#sql-input", "tab-rollouts": "#rollouts", "tab-run": "#run-rollouts"}


def _dropped_once_closed(handler: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """For the results of workers and of the run thread (and the store selection they trigger): one
    that arrives while the app closes, its widgets already gone, is dropped. The widgets are composed
    once and never removed, so a missing one means exactly that."""

    @functools.wraps(handler)
    def handle(app: Any, message: Any) -> None:
        try:
            handler(app, message)
        except NoMatches:
            log.debug("dropped %s: the app is closing", type(message).__name__)

    return handle


class ForgetuiApp(App[int]):
    """Stores on the left; the selected store's calls + inspector, rollouts, or the SQL console, on the right.

    Given a `run_config`, it also runs it (a worker thread with its own event loop runs `execute_run`)
    and opens on the live run dashboard; q / Ctrl-C stop the run, which removes every sandbox.
    """

    CSS_PATH = "app.tcss"
    TITLE = "forgetui"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("r", "refresh", "Refresh"),
        Binding("s", "focus_stores", "Stores"),
        Binding("u", "show_tab('tab-runs')", "Runs"),
        Binding("c", "show_tab('tab-calls')", "Calls"),
        Binding("e", "show_tab('tab-sql')", "SQL"),
        Binding("o", "show_tab('tab-rollouts')", "Rollouts"),
        Binding("d", "show_tab('tab-run')", "Run"),
        Binding("slash", "filter_runs", "Filter", show=False),
        Binding("S", "sort_runs", "Sort", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("n", "new_run", "New run"),
        Binding("x", "stop_selected", "Stop", show=False),
        Binding("R", "resume_selected", "Resume", show=False),
        Binding("D", "delete_selected", "Delete", show=False),
        Binding("g", "gc", "gc", show=False),
        Binding("escape", "clear_filter", show=False),
    ]

    def __init__(
        self,
        home: Path | None = None,
        *,
        refresh_s: float = 2.0,
        stores_refresh_s: float = 5.0,
        run_config: RunConfig | None = None,
        resume: str | None = None,
        ks: list[int] | None = None,
        run_refresh_s: float = 1.0,
        exit_delay_s: float = 0.8,
    ) -> None:
        super().__init__()
        # the live run (only with run_config): its state, merged progress and the handle to stop it
        self.run_config = run_config
        self.resume = resume
        self.ks = ks
        self.run_refresh_s = run_refresh_s
        self.exit_delay_s = exit_delay_s
        self.run_state: str | None = "starting" if run_config is not None else None
        self.run_exit_code: int | None = None
        self.run_summary = None
        self.progress = data.RunProgress()
        self._run_lock = threading.Lock()
        self._run_handle: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._stop_requested = False
        self._run_done = threading.Event()
        self._stamps: dict[str, tuple[Path, float]] = {}  # what → (store, last written) of its last load
        self.catalog = data.StoreCatalog(home)
        self.run_catalog = run_data.RunCatalog(home)
        self.refresh_s = refresh_s
        self.stores_refresh_s = stores_refresh_s
        self.store: Path | None = None
        self.call_id: str | None = None
        self._catalog_lock = threading.Lock()
        self._last_error: str | None = None
        self._sql_seq = 0
        self._sql_cancel: QueryCancel | None = None  # cancels the running console query
        self.launched: list[launcher.Launched] = []  # runs started here: they outlive the TUI unless stopped
        self.settings = settings.Settings(self.catalog.home_path() / "tui" / "settings.json")
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield StoreList(id="stores")
            with TabbedContent(id="tabs", initial="tab-run" if self.run_config is not None else "tab-runs"):
                if self.run_config is not None:
                    with TabPane("Run", id="tab-run"):
                        yield RunDashboard(id="run")
                with TabPane("Runs", id="tab-runs"), Vertical(id="runs-pane"):
                    yield Input(placeholder="filter runs (any column; Esc clears)", id="runs-filter")
                    yield RunsTable(id="runs")
                with TabPane("Calls", id="tab-calls"), Vertical(id="calls-pane"):
                    yield CallsTable(id="calls")
                    yield CallInspector(id="inspector")
                with TabPane("Rollouts", id="tab-rollouts"):
                    yield RolloutsTable(data.STORE_ROLLOUT_COLUMNS, id="rollouts")
                with TabPane("SQL", id="tab-sql"):
                    yield SqlConsole(SqlHistory(self.catalog.home_path() / "tui" / "sql_history.json"), id="sql")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, lambda theme: self.settings.save_theme(theme.name))
        self.call_after_refresh(heap.freeze_loaded)  # the imported modules and the first screen, out of every full collection
        self.load_stores()
        self.load_runs()
        self.set_interval(self.stores_refresh_s, self._tick_stores)
        self.set_interval(self.refresh_s, self._tick_calls)
        self.set_interval(self.refresh_s, self._tick_rollouts)
        if self.run_config is not None:
            self.query_one(RunDashboard).show_state("starting", None, None, "planning the rollouts, building images…")
            self.set_interval(self.run_refresh_s, self._tick_run)
            self.run_engine()

    # ------------------------------------------------------------------ actions
    def action_refresh(self) -> None:
        self.load_stores()
        if self.store is not None:
            self.load_calls(self.store, force=True)

    def action_focus_stores(self) -> None:
        stores = self.query_one(StoreList)
        stores.add_class("-shown")
        stores.focus()

    def action_show_tab(self, tab: str) -> None:
        if tab == "tab-run" and self.run_config is None:
            return
        self.query_one("#tabs", TabbedContent).active = tab
        self.query_one(TAB_FOCUS.get(tab, "#sql-input")).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "show_tab" and parameters == ("tab-run",):
            return self.run_config is not None
        return True

    async def action_quit(self) -> None:
        """Quit; while a run is going, stop it first (its sandboxes are removed) and quit when it stopped.
        Runs launched from here as their own processes: ask whether they keep running."""
        alive = [p for p in self.launched if p.alive()]
        if alive and self.run_state not in ACTIVE_RUN_STATES:
            self.push_screen(Confirm(
                f"{len(alive)} run(s) launched here are still running. They can keep running headless "
                "(reopen forgetui later to watch them) or be stopped now (their sandboxes are removed).",
                (("keep", "Keep running and quit"), ("stop", "Stop them and quit"), ("cancel", "Cancel"))),
                self._quit_answer)
            return
        if self.run_state in ACTIVE_RUN_STATES:
            self.stop_run()
        elif self.run_state == "stopping":
            self.notify("stopping the run: removing its sandboxes…", title="please wait")
        else:
            self.exit(self.run_exit_code)

    def _quit_answer(self, answer: str | None) -> None:
        if answer == "stop":
            for p in self.launched:
                launcher.terminate(p.pid)
        if answer in ("keep", "stop"):
            self.exit(self.run_exit_code)

    # ------------------------------------------------------------------ run actions (Runs tab and palette)
    def get_system_commands(self, screen: Any) -> Any:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Runs", "every run under FORGETUI_HOME", lambda: self.action_show_tab("tab-runs"))
        yield SystemCommand("New run…", "a form over the run config; launches `forgetui run --no-ui`", self.action_new_run)
        yield SystemCommand("Resume the selected run", "`forgetui run --resume RUN_ID --no-ui`", self.action_resume_selected)
        yield SystemCommand("Stop the selected run", "SIGTERM to its writer: sandboxes removed, run interrupted",
                            self.action_stop_selected)
        yield SystemCommand("Delete the selected run", "its folder: store, logs, checkpoints (asks first)",
                            self.action_delete_selected)
        yield SystemCommand("gc", "remove sandboxes left behind by runs that died", self.action_gc)
        yield SystemCommand("Open a store by path…", "any DuckDB store file", self.action_open_store)
        yield SystemCommand("SQL console", "read-only SQL on the selected store", lambda: self.action_show_tab("tab-sql"))

    def _selected_run(self) -> run_data.RunInfo | None:
        info = self.query_one(RunsTable).selected()
        if info is None or info.kind != "run":
            self.notify("select a run in the Runs tab (u) first", severity="warning")
            return None
        return info

    def action_new_run(self) -> None:
        self.push_screen(NewRunScreen(self.catalog.home_path() / "tui" / "configs"), self._launch_config)

    def _launch_config(self, path: Path | None) -> None:
        if path is not None:
            self.launch_in_background(["run", str(path), "--no-ui"], f"run of {path.name}")

    def action_resume_selected(self) -> None:
        info = self._selected_run()
        if info is not None:
            self.launch_in_background(["run", "--resume", info.run_id, "--no-ui"], f"resume of {info.run_id}")

    @work(thread=True, group="launch", exit_on_error=False)
    def launch_in_background(self, args: list[str], what: str) -> None:
        try:
            started = launcher.launch(args, self.catalog.home_path())
        except (ForgetuiError, OSError) as exc:
            self.call_from_thread(self.notify, str(exc), title=f"cannot start the {what}", severity="error", markup=False)
            return
        self.launched.append(started)
        self.call_from_thread(self.notify, f"pid {started.pid}; it keeps running if you quit. Output: {started.log_path}",
                              title=f"started the {what}", markup=False)
        self.call_from_thread(self.load_runs)

    def action_stop_selected(self) -> None:
        info = self._selected_run()
        if info is None:
            return
        try:
            pid = launcher.stop_run(info.path)
        except ForgetuiError as exc:
            self.notify(str(exc), title="cannot stop", severity="error", markup=False)
        else:
            self.notify(f"sent SIGTERM to pid {pid}: its sandboxes are being removed", title=f"stopping {info.run_id}")

    def action_delete_selected(self) -> None:
        info = self._selected_run()
        if info is None:
            return

        def answer(choice: str | None) -> None:
            if choice != "yes":
                return
            try:
                launcher.delete_run(info.path)
            except ForgetuiError as exc:
                self.notify(str(exc), title="cannot delete", severity="error", markup=False)
            else:
                self.notify(f"removed {info.path}", title=f"deleted {info.run_id}", markup=False)
                self.load_runs()
                self.load_stores()

        self.push_screen(Confirm(f"Delete run {info.run_id}? Its folder goes: store, logs, checkpoints.\n{info.path}",
                                 (("yes", "Delete"), ("no", "Keep"))), answer)

    @work(thread=True, group="gc", exit_on_error=False)
    def action_gc(self) -> None:
        self.call_from_thread(self.notify, "looking for sandboxes of runs that died…", title="gc")
        try:
            said = launcher.gc(self.catalog.home_path())
        except (ForgetuiError, OSError) as exc:
            self.call_from_thread(self.notify, str(exc), title="gc failed", severity="error", markup=False)
        else:
            self.call_from_thread(self.notify, said, title="gc")

    def action_open_store(self) -> None:
        def opened(path: str | None) -> None:
            if not path:
                return
            store = Path(path).expanduser()
            if not store.is_file():
                self.notify(f"no store at {store}", severity="error", markup=False)
                return
            self.select_store(store.resolve())
            self.action_show_tab("tab-calls")

        self.push_screen(Prompt("Open a store file (DuckDB):", "~/.forgetui/stores/NAME.duckdb"), opened)

    def action_help_quit(self) -> None:
        """Ctrl-C stops a live run (as q does); otherwise Textual's hint on how to quit."""
        if self.run_state in ACTIVE_RUN_STATES:
            self.stop_run()
        elif self.run_state == "stopping":
            self.notify("stopping the run: removing its sandboxes…", title="please wait")
        else:
            super().action_help_quit()

    def stop_run(self) -> None:
        """Cancel the run: execute_run's cleanup removes every sandbox and marks the run interrupted."""
        with self._run_lock:
            self._stop_requested = True
            handle = self._run_handle
        if handle is not None:
            loop, task = handle
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the run's loop already closed: it is over anyway
                pass
        if self.run_state in ACTIVE_RUN_STATES:
            self.run_state = "stopping"
            self.query_one(RunDashboard).show_state(
                "stopping", self.progress.run_id, self.progress.store, "stopping: removing the run's sandboxes…")

    def select_store(self, path: Path) -> None:
        """Make `path` the store the calls table and SQL console work on."""
        self.post_message(StoreSelected(Path(path)))

    def _busy(self, group: str) -> bool:
        return any(w.group == group and w.is_running for w in self.workers)

    def _tick_stores(self) -> None:
        if not self._busy("stores"):  # a slow store must not pile up threads
            self.load_stores()
        if not self._busy("runs"):
            self.load_runs()

    def _tick_calls(self) -> None:
        if self.store is not None and not self._busy("calls") and self._tab_shown("tab-calls"):
            self.load_calls(self.store)

    def _tick_rollouts(self) -> None:
        if self.store is not None and not self._busy("rollouts") and self._tab_shown("tab-rollouts"):
            self.load_rollouts(self.store)

    def _tick_run(self) -> None:
        if self.progress.store is not None and self.run_state in ACTIVE_RUN_STATES | {"stopping"}:
            self._poll_run()

    def _poll_run(self) -> None:
        if self.progress.store is not None and self.progress.run_id and not self._busy("run-poll"):
            self.poll_run(self.progress.store, self.progress.run_id)

    # ------------------------------------------------------------------ workers (all I/O happens here)
    @work(thread=True, exclusive=True, group="stores", exit_on_error=False)
    def load_stores(self) -> None:
        self._list("stores", self.catalog.list, StoresLoaded)

    @work(thread=True, exclusive=True, group="runs", exit_on_error=False)
    def load_runs(self) -> None:
        self._list("runs", self.run_catalog.list, RunsLoaded)

    def _list(self, what: str, listing: Callable[[], list[Any]], loaded: Any) -> None:
        """On a worker thread: list what FORGETUI_HOME holds and post it (or why it failed)."""
        try:
            with self._catalog_lock:
                items = listing()
        except Exception as exc:  # a broken home folder must not take the TUI down
            log.exception("listing %s failed", what)
            self.post_message(LoadFailed(what, str(exc)))
        else:
            self.post_message(loaded(items))

    @work(thread=True, exclusive=True, group="calls", exit_on_error=False)
    def load_calls(self, path: Path, force: bool = False) -> None:
        self._load_if_changed("calls", path, force, data.load_calls, CallsLoaded)

    @work(thread=True, exclusive=True, group="rollouts", exit_on_error=False)
    def load_rollouts(self, path: Path, force: bool = False) -> None:
        self._load_if_changed("rollouts", path, force, data.load_rollouts, RolloutsLoaded)

    def _load_if_changed(self, what: str, path: Path, force: bool, load: Any, loaded: Any) -> None:
        """On a worker thread: load `what` from the store unless it is unchanged since the last load."""
        try:
            stamp = (path, data.last_written(path))
            if not force and stamp == self._stamps.get(what) and not data.is_live(path):
                return
            rows = load(path)
            self._stamps[what] = stamp
        except ForgetuiError as exc:
            self.post_message(LoadFailed(what, str(exc)))
        except Exception as exc:
            log.exception("loading %s of %s failed", what, path)
            self.post_message(LoadFailed(what, f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(loaded(path, rows))

    @work(thread=True, exclusive=True, group="run", exit_on_error=False)
    async def run_engine(self) -> None:
        """Run the config on this worker thread's own loop (model loading, image builds and the eval plot
        block; the UI must not), posting RunStarted / RolloutFinished and then how it ended."""
        from core.run import execute_run
        from core.store.query import store_for_run

        assert self.run_config is not None

        def on_start(run_id: str, total: int) -> None:
            self.post_message(RunStarted(run_id, store_for_run(run_id), total))

        def on_event(event) -> None:  # noqa: ANN001 - core.rollout.engine.RolloutEvent
            r = event.result
            row = data.rollout_from_event(event.rollout_id, event.task_id, str(r.status), r.reward, r.passed, r.error)
            self.post_message(RolloutFinished(row))

        task = asyncio.ensure_future(
            execute_run(self.run_config, resume=self.resume, on_event=on_event, on_start=on_start, ks=self.ks))
        with self._run_lock:
            self._run_handle = (asyncio.get_running_loop(), task)
            if self._stop_requested:
                task.cancel()
        try:
            summary = await task
        except asyncio.CancelledError:
            self.post_message(RunInterrupted())
        except ForgetuiError as exc:
            self.post_message(RunFailed(str(exc), code=2))
        except Exception as exc:
            log.exception("the run failed")
            self.post_message(RunFailed(f"{type(exc).__name__}: {exc}", code=1))
        else:
            self.post_message(RunFinished(summary))
        finally:
            with self._run_lock:
                self._run_handle = None
            self._run_done.set()

    @work(thread=True, exclusive=True, group="run-poll", exit_on_error=False)
    def poll_run(self, store: Path, run_id: str) -> None:
        """The run's rollouts and call count from its store (live endpoint while it runs); misses are retried."""
        try:
            rollouts = data.load_rollouts(store, run_id, limit=data.RUN_ROLLOUTS_LIMIT)
            n_calls = data.count_calls(store)
        except ForgetuiError as exc:  # e.g. the store between its writer closing and the file unlocking
            log.debug("polling run %s: %s", run_id, exc)
        except Exception:
            log.exception("polling run %s failed", run_id)
        else:
            self.post_message(RunPolled(run_id, rollouts, n_calls))

    @work(thread=True, exclusive=True, group="call", exit_on_error=False)
    def load_call(self, path: Path, call_id: str) -> None:
        try:
            detail = data.load_call(path, call_id)
        except ForgetuiError as exc:
            self.post_message(LoadFailed("call", str(exc)))
        except Exception as exc:
            log.exception("loading call %s failed", call_id)
            self.post_message(LoadFailed("call", f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(CallLoaded(detail))

    @work(thread=True, exclusive=True, group="sql", exit_on_error=False)
    def run_sql(self, path: Path, sql: str, seq: int = 0, cancel: QueryCancel | None = None) -> None:
        """A console query on a worker thread; a run's store reads together with its veRL shards."""
        try:
            if not sql.strip():
                raise ForgetuiError("type a query first, e.g. SELECT count(*) FROM calls")
            result = run_data.query_store(path, sql, max_rows=data.SQL_MAX_ROWS, cancel=cancel)
        except ForgetuiError as exc:
            self.post_message(SqlFinished(sql, error=str(exc), seq=seq))
        except Exception as exc:
            log.exception("console query failed")
            self.post_message(SqlFinished(sql, error=f"{type(exc).__name__}: {exc}", seq=seq))
        else:
            self.post_message(SqlFinished(sql, result=result, seq=seq))

    @work(thread=True, exclusive=True, group="export", exit_on_error=False)
    def export_sql(self, result: Any, path: Path) -> None:
        from forgetui.tui.export import export_result

        try:
            written = export_result(result, path)
        except (ForgetuiError, OSError) as exc:
            self.call_from_thread(self.notify, str(exc), title="export failed", severity="error", markup=False)
        else:
            self.call_from_thread(self.notify, f"{len(result.rows)} rows → {written}", title="exported", markup=False)

    # ------------------------------------------------------------------ message handlers (widgets change here)
    @on(StoresLoaded)
    @_dropped_once_closed
    def _stores_loaded(self, message: StoresLoaded) -> None:
        self.query_one(StoreList).show_stores(message.stores)
        if self.store is None and message.stores:
            self.select_store(message.stores[0].path)
        elif not message.stores:
            self.query_one(CallInspector).show_message(data.EMPTY_HOME_HINT.format(home=self.catalog.home_path()))

    @on(RunsLoaded)
    @_dropped_once_closed
    def _runs_loaded(self, message: RunsLoaded) -> None:
        table = self.query_one(RunsTable)
        table.show_runs(message.runs)
        if not message.runs:
            table.border_subtitle = "no runs yet: forgetui run examples/demo.toml"

    @on(RunOpened)
    def _run_opened(self, message: RunOpened) -> None:
        info = message.info
        source = run_data.RunSource(info.path) if info.kind == "run" else run_data.RunSource(info.path.parent, store_file=info.path)
        self.push_screen(RunScreen(source, info.run_id))

    @on(RolloutOpened)
    def _rollout_opened(self, message: RolloutOpened) -> None:
        self.push_screen(RolloutScreen(message.source, message.rollout_id))

    @on(DataTable.RowSelected, "#rollouts")
    def _store_rollout_selected(self, event: DataTable.RowSelected) -> None:
        if self.store is not None and event.row_key.value is not None:
            self.push_screen(RolloutScreen(run_data.store_source(self.store), str(event.row_key.value)))

    def action_filter_runs(self) -> None:
        self.action_show_tab("tab-runs")
        box = self.query_one("#runs-filter", Input)
        box.add_class("-shown")
        box.focus()

    def action_sort_runs(self) -> None:
        table = self.query_one(RunsTable)
        keys = run_data.SORT_KEYS
        table.set_sort(keys[(keys.index(table.sort_key) + 1) % len(keys)])

    def action_help(self) -> None:
        """Toggle Textual's keys panel: every binding of the focused widget and the app."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    def action_clear_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        if box.has_class("-shown"):
            box.value = ""
            box.remove_class("-shown")
            self.query_one(RunsTable).focus()

    @on(Input.Changed, "#runs-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_one(RunsTable).set_filter(event.value)

    @on(Input.Submitted, "#runs-filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.query_one(RunsTable).focus()

    @on(StoreSelected)
    @_dropped_once_closed
    def _store_selected(self, message: StoreSelected) -> None:
        self.query_one(StoreList).remove_class("-shown")  # (narrow screens) the pane hides once a store is chosen
        if message.chosen and self._tab_shown("tab-runs"):  # picking a store shows what is in it (focus stays in the list)
            self.query_one("#tabs", TabbedContent).active = "tab-calls"
        if message.path == self.store:
            return
        self.store = message.path
        self.call_id = None
        self._stamps.pop("calls", None)
        self.sub_title = str(message.path)
        self.query_one(StoreList).highlight_store(message.path)
        self.query_one(CallsTable).clear_calls()
        self.query_one(CallInspector).show_message("select a call")
        self._stamps.pop("rollouts", None)
        self.query_one("#rollouts", RolloutsTable).clear_rollouts()
        self._load_shown_tab(force=True)

    @on(TabbedContent.TabActivated, "#tabs")
    def _main_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._load_shown_tab()

    def _load_shown_tab(self, force: bool = False) -> None:
        """Load the store's calls or rollouts when their tab is the one shown.

        Each fills a table of up to a thousand rows, measured and styled on the event loop even while
        hidden; loading them for a tab nobody looks at stalled the screen on top (a run opened from
        the Runs tab) for hundreds of milliseconds.
        """
        if self.store is None:
            return
        if self._tab_shown("tab-calls"):
            self.load_calls(self.store, force=force)
        elif self._tab_shown("tab-rollouts"):
            self.load_rollouts(self.store, force=force)

    def _tab_shown(self, tab: str) -> bool:
        return self.screen is self.screen_stack[0] and self.query_one("#tabs", TabbedContent).active == tab

    @on(RolloutsLoaded)
    @_dropped_once_closed
    def _rollouts_loaded(self, message: RolloutsLoaded) -> None:
        if message.path == self.store:
            self.query_one("#rollouts", RolloutsTable).show_rollouts(message.rollouts)

    # ------------------------------------------------------------------ the live run
    def _show_run(self) -> None:
        self.query_one(RunDashboard).show_progress(self.progress, time.monotonic())

    @on(RunStarted)
    @_dropped_once_closed
    def _run_started(self, message: RunStarted) -> None:
        self.progress.start(message.run_id, message.store, message.total, time.monotonic())
        if self.run_state == "starting":
            self.run_state = "running"
        self.title = f"forgetui run {message.run_id}"
        self.query_one(RunDashboard).show_state(self.run_state or "running", message.run_id, message.store)
        self._show_run()
        self.select_store(message.store)  # the browser follows the run's store (calls live)

    @on(RolloutFinished)
    @_dropped_once_closed
    def _rollout_finished(self, message: RolloutFinished) -> None:
        self.progress.apply_event(message.row)
        self._show_run()

    @on(RunPolled)
    @_dropped_once_closed
    def _run_polled(self, message: RunPolled) -> None:
        if message.run_id != self.progress.run_id:
            return
        self.progress.apply_rows(message.rollouts)
        if message.n_calls is not None:
            self.progress.apply_calls(message.n_calls, time.monotonic())
        self._show_run()

    @on(RunFinished)
    @_dropped_once_closed
    def _run_finished(self, message: RunFinished) -> None:
        self.run_state, self.run_exit_code, self.run_summary = "done", 0, message.summary
        dashboard = self.query_one(RunDashboard)
        dashboard.show_state("done", message.summary.run_id, message.summary.store)
        dashboard.show_summary(message.summary)
        self._poll_run()  # the final rows, from the closed store
        if self._stop_requested:  # it finished just as the user asked to quit
            self.set_timer(self.exit_delay_s, lambda: self.exit(0))

    @on(RunInterrupted)
    @_dropped_once_closed
    def _run_interrupted(self, message: RunInterrupted) -> None:
        self.run_state, self.run_exit_code = "interrupted", 130
        self.query_one(RunDashboard).show_state(
            "interrupted", self.progress.run_id, self.progress.store,
            "every sandbox of the run was removed; `forgetui run --resume "
            f"{self.progress.run_id or 'RUN_ID'}` finishes it")
        self.set_timer(self.exit_delay_s, lambda: self.exit(130))

    @on(RunFailed)
    @_dropped_once_closed
    def _run_failed(self, message: RunFailed) -> None:
        self.run_state, self.run_exit_code = "failed", message.code
        self.query_one(RunDashboard).show_state(
            "failed", self.progress.run_id, self.progress.store, message.error + "\npress q to quit")
        self._poll_run()
        if self._stop_requested:
            self.set_timer(self.exit_delay_s, lambda: self.exit(message.code))

    async def on_unmount(self) -> None:
        """Never leave a run going behind the UI: stop it and wait for its cleanup (sandboxes removed)."""
        with self._run_lock:
            running = self._run_handle is not None
        if running:
            self.stop_run()
            await asyncio.to_thread(self._run_done.wait, 120)

    @on(CallsLoaded)
    @_dropped_once_closed
    def _calls_loaded(self, message: CallsLoaded) -> None:
        if message.path == self.store:
            self.query_one(CallsTable).show_calls(message.path, message.calls)
            self._last_error = None

    @on(CallSelected)
    def _call_selected(self, message: CallSelected) -> None:
        if self.store is None or message.call_id == self.call_id:
            return
        self.call_id = message.call_id
        self.load_call(self.store, message.call_id)

    @on(CallLoaded)
    @_dropped_once_closed
    def _call_loaded(self, message: CallLoaded) -> None:
        if message.detail.call_id == self.call_id:
            self.query_one(CallInspector).show_call(message.detail)

    @on(RunSql)
    def _run_sql(self, message: RunSql) -> None:
        if self.store is None:
            self.query_one(SqlConsole).show_error("select a store first (s)")
            return
        self._sql_seq += 1
        if self._sql_cancel is not None:
            self._sql_cancel.cancel()  # a newer query replaces it
        self._sql_cancel = QueryCancel()
        self.run_sql(self.store, message.sql, self._sql_seq, self._sql_cancel)

    @on(CancelSql)
    def _cancel_sql(self, message: CancelSql) -> None:
        """Stop the query: its connection is interrupted (a store file or a run's shards) and its answer dropped
        (a query sent to a live writer's endpoint runs on there, within that endpoint's time limit)."""
        self._sql_seq += 1
        if self._sql_cancel is not None:
            self._sql_cancel.cancel()
            self._sql_cancel = None
        self.workers.cancel_group(self, "sql")

    @on(ExportSql)
    def _export_sql(self, message: ExportSql) -> None:
        from forgetui.tui.export import export_path

        result = self.query_one(ResultTable).result
        if result is None or self.store is None:
            self.notify("run a query first", title="nothing to export", severity="warning")
            return
        source = run_data.store_source(self.store)
        folder = (source.run_dir if source.store_file is None else self.catalog.home_path()) / "exports"
        self.export_sql(result, export_path(folder, message.fmt))

    @on(SqlFinished)
    @_dropped_once_closed
    def _sql_finished(self, message: SqlFinished) -> None:
        if message.seq != self._sql_seq:
            return  # cancelled, or a newer query is running
        console = self.query_one(SqlConsole)
        if message.result is not None:
            console.show_result(message.result)
        else:
            console.show_error(message.error or "query failed")

    @on(LoadFailed)
    @_dropped_once_closed
    def _load_failed(self, message: LoadFailed) -> None:
        if message.what == "call":
            self.query_one(CallInspector).show_message(message.error, style="bold red")
            return
        if message.error != self._last_error:  # periodic refreshes must not repeat the same toast
            self._last_error = message.error
            self.notify(message.error, title=f"cannot load {message.what}", severity="error", markup=False)


def run_tui(
    home: Path | None = None,
    *,
    run_config: RunConfig | None = None,
    resume: str | None = None,
    ks: list[int] | None = None,
) -> int:
    """Run the TUI until the user quits (on a run dashboard given a run config); logging goes to the Textual
    devtools console meanwhile. Returns the exit code: 0, 130 when a run was interrupted, 1/2 when it failed."""
    from textual.logging import TextualHandler

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [TextualHandler()]
    try:
        app = ForgetuiApp(home, run_config=run_config, resume=resume, ks=ks)
        result = app.run()
    finally:
        root.handlers = saved
    return int(result or app.return_code or 0)
