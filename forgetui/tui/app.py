"""The forgetui TUI app: workers do every read and post messages; handlers update widgets."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, TabbedContent, TabPane

from core.errors import ForgetuiError
from forgetui.tui import data
from forgetui.tui.messages import (
    CallLoaded,
    CallSelected,
    CallsLoaded,
    LoadFailed,
    RunSql,
    SqlFinished,
    StoreSelected,
    StoresLoaded,
)
from forgetui.tui.widgets.call_inspector import CallInspector
from forgetui.tui.widgets.calls_table import CallsTable
from forgetui.tui.widgets.sql_console import SqlConsole
from forgetui.tui.widgets.store_list import StoreList

log = logging.getLogger(__name__)


class ForgetuiApp(App[int]):
    """Stores on the left; the selected store's calls + inspector, or the SQL console, on the right."""

    CSS_PATH = "app.tcss"
    TITLE = "forgetui"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("r", "refresh", "Refresh"),
        Binding("s", "focus_stores", "Stores"),
        Binding("c", "show_tab('tab-calls')", "Calls"),
        Binding("e", "show_tab('tab-sql')", "SQL"),
    ]

    def __init__(self, home: Path | None = None, *, refresh_s: float = 2.0, stores_refresh_s: float = 5.0) -> None:
        super().__init__()
        self.catalog = data.StoreCatalog(home)
        self.refresh_s = refresh_s
        self.stores_refresh_s = stores_refresh_s
        self.store: Path | None = None
        self.call_id: str | None = None
        self._catalog_lock = threading.Lock()
        self._calls_stamp: tuple[Path, float] | None = None
        self._last_error: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield StoreList(id="stores")
            with TabbedContent(id="tabs", initial="tab-calls"):
                with TabPane("Calls", id="tab-calls"), Vertical(id="calls-pane"):
                    yield CallsTable(id="calls")
                    yield CallInspector(id="inspector")
                with TabPane("SQL", id="tab-sql"):
                    yield SqlConsole(id="sql")
        yield Footer()

    def on_mount(self) -> None:
        self.load_stores()
        self.set_interval(self.stores_refresh_s, self._tick_stores)
        self.set_interval(self.refresh_s, self._tick_calls)

    # ------------------------------------------------------------------ actions
    def action_refresh(self) -> None:
        self.load_stores()
        if self.store is not None:
            self.load_calls(self.store, force=True)

    def action_focus_stores(self) -> None:
        self.query_one(StoreList).focus()

    def action_show_tab(self, tab: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab
        (self.query_one(CallsTable) if tab == "tab-calls" else self.query_one("#sql-input")).focus()

    def select_store(self, path: Path) -> None:
        """Make `path` the store the calls table and SQL console work on."""
        self.post_message(StoreSelected(Path(path)))

    def _busy(self, group: str) -> bool:
        return any(w.group == group and w.is_running for w in self.workers)

    def _tick_stores(self) -> None:
        if not self._busy("stores"):  # a slow store must not pile up threads
            self.load_stores()

    def _tick_calls(self) -> None:
        if self.store is not None and not self._busy("calls"):
            self.load_calls(self.store)

    # ------------------------------------------------------------------ workers (all I/O happens here)
    @work(thread=True, exclusive=True, group="stores", exit_on_error=False)
    def load_stores(self) -> None:
        try:
            with self._catalog_lock:
                stores = self.catalog.list()
        except Exception as exc:  # a broken home folder must not take the TUI down
            log.exception("listing stores failed")
            self.post_message(LoadFailed("stores", str(exc)))
        else:
            self.post_message(StoresLoaded(stores))

    @work(thread=True, exclusive=True, group="calls", exit_on_error=False)
    def load_calls(self, path: Path, force: bool = False) -> None:
        try:
            stamp = (path, data.last_written(path))
            if not force and stamp == self._calls_stamp and not data.is_live(path):
                return
            calls = data.load_calls(path)
            self._calls_stamp = stamp
        except ForgetuiError as exc:
            self.post_message(LoadFailed("calls", str(exc)))
        except Exception as exc:
            log.exception("loading calls of %s failed", path)
            self.post_message(LoadFailed("calls", f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(CallsLoaded(path, calls))

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
    def run_sql(self, path: Path, sql: str) -> None:
        try:
            result = data.run_sql(path, sql)
        except ForgetuiError as exc:
            self.post_message(SqlFinished(sql, error=str(exc)))
        except Exception as exc:
            log.exception("console query failed")
            self.post_message(SqlFinished(sql, error=f"{type(exc).__name__}: {exc}"))
        else:
            self.post_message(SqlFinished(sql, result=result))

    # ------------------------------------------------------------------ message handlers (widgets change here)
    @on(StoresLoaded)
    def _stores_loaded(self, message: StoresLoaded) -> None:
        self.query_one(StoreList).show_stores(message.stores)
        if self.store is None and message.stores:
            self.select_store(message.stores[0].path)

    @on(StoreSelected)
    def _store_selected(self, message: StoreSelected) -> None:
        if message.path == self.store:
            return
        self.store = message.path
        self.call_id = None
        self._calls_stamp = None
        self.sub_title = str(message.path)
        self.query_one(StoreList).highlight_store(message.path)
        self.query_one(CallsTable).clear_calls()
        self.query_one(CallInspector).show_message("select a call")
        self.load_calls(message.path, force=True)

    @on(CallsLoaded)
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
    def _call_loaded(self, message: CallLoaded) -> None:
        if message.detail.call_id == self.call_id:
            self.query_one(CallInspector).show_call(message.detail)

    @on(RunSql)
    def _run_sql(self, message: RunSql) -> None:
        if self.store is None:
            self.query_one(SqlConsole).show_error("select a store first (left)")
            return
        self.run_sql(self.store, message.sql)

    @on(SqlFinished)
    def _sql_finished(self, message: SqlFinished) -> None:
        console = self.query_one(SqlConsole)
        if message.result is not None:
            console.show_result(message.result)
        else:
            console.show_error(message.error or "query failed")

    @on(LoadFailed)
    def _load_failed(self, message: LoadFailed) -> None:
        if message.what == "call":
            self.query_one(CallInspector).show_message(message.error, style="bold red")
            return
        if message.error != self._last_error:  # periodic refreshes must not repeat the same toast
            self._last_error = message.error
            self.notify(message.error, title=f"cannot load {message.what}", severity="error", markup=False)


def run_tui(home: Path | None = None) -> int:
    """Run the TUI until the user quits; logging goes to the Textual devtools console meanwhile."""
    from textual.logging import TextualHandler

    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [TextualHandler()]
    try:
        app = ForgetuiApp(home)
        result = app.run()
    finally:
        root.handlers = saved
    return int(result or app.return_code or 0)
