"""A SQL console on the run in focus: editor, schema browser, status line and a paged result.

Run keys: F5, Ctrl+R and Ctrl+Enter (the last only where the terminal reports it: kitty protocol); Esc cancels a
running query; Ctrl+↑/↓ step through the history; Ctrl+A selects all; F8/F9 export the result as CSV/Parquet."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Static

from core.errors import ForgetuiError
from core.store.readonly import QueryCancel, QueryResult
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.export import export_path, export_result
from forgetui.tui.source import SQL_MAX_ROWS, RunSource
from forgetui.tui.sql_history import SqlHistory
from forgetui.tui.widgets.result_table import ResultTable
from forgetui.tui.widgets.schema_tree import SchemaTree
from forgetui.tui.widgets.sql_editor import SqlEditor

log = logging.getLogger(__name__)

DEFAULT_SQL = "SELECT api, status, count(*) AS calls FROM calls GROUP BY ALL ORDER BY calls DESC"
HINT = "F5 / Ctrl+R run · Esc cancels · Ctrl+↑↓ history · Ctrl+A all · Enter on a cell shows it · F8 CSV · F9 Parquet"


class SqlConsole(Vertical):
    """Runs the editor's query on `source` (set by the screen: the run in focus) on a worker thread."""

    # not scoped: the narrow layout's rules start at the Screen (-narrow comes from the app's HORIZONTAL_BREAKPOINTS)
    SCOPED_CSS = False
    DEFAULT_CSS = """
    SqlConsole { height: 1fr; }
    SqlConsole #sql-top { height: 11; }
    Screen.-narrow SqlConsole #sql-top { height: 8; }
    SqlConsole #sql-edit { width: 1fr; }
    SqlConsole #sql-input { height: 1fr; }
    SqlConsole #sql-bar { height: 3; }
    SqlConsole #sql-run { margin-right: 2; }
    SqlConsole #sql-hint { width: 1fr; height: 3; content-align: left middle; color: $text-muted; }
    SqlConsole #sql-schema { width: 44; height: 1fr; }
    Screen.-narrow SqlConsole #sql-schema { width: 26; }
    SqlConsole #sql-status { height: auto; max-height: 6; padding: 0 1; }
    SqlConsole #sql-result { height: 1fr; }
    """

    class Finished(Message):
        """A query finished: a result, or the error to show; `seq` says which run of the console it answers."""

        def __init__(self, seq: int, result: QueryResult | None = None, error: str | None = None) -> None:
            super().__init__()
            self.seq = seq
            self.result = result
            self.error = error

    class Exported(Message):
        def __init__(self, note: str, error: bool = False) -> None:
            super().__init__()
            self.note = note
            self.error = error

    BORDER_TITLE = "SQL"
    BINDINGS = [
        Binding("f5", "run", "Run SQL", priority=True),
        Binding("ctrl+r", "run", "Run SQL", show=False, priority=True),
        Binding("ctrl+enter", "run", "Run SQL", show=False, priority=True),
        Binding("ctrl+j", "run", "Run SQL", show=False, priority=True),
        Binding("escape", "cancel", "Cancel", show=False, priority=True),  # before the editor takes Esc
        Binding("ctrl+up", "history(-1)", "History", show=False, priority=True),
        Binding("ctrl+down", "history(1)", show=False, priority=True),
        Binding("f8", "export('csv')", "CSV"),
        Binding("f9", "export('parquet')", "Parquet"),
    ]

    def __init__(self, history: SqlHistory | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history or SqlHistory()
        self.source: RunSource | None = None
        self.running = False
        self._seq = 0
        self._cancel: QueryCancel | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="sql-top"):
            with Vertical(id="sql-edit"):
                yield SqlEditor(DEFAULT_SQL, id="sql-input")
                with Horizontal(id="sql-bar"):
                    yield Button("Run (F5)", id="sql-run", variant="primary")
                    yield Static(HINT, id="sql-hint")
            yield SchemaTree(id="sql-schema")
        yield Static("", id="sql-status")
        yield ResultTable(id="sql-result")

    @property
    def sql(self) -> str:
        return self.query_one(SqlEditor).text

    @sql.setter
    def sql(self, value: str) -> None:
        self.query_one(SqlEditor).text = value

    def show_source(self, source: RunSource | None) -> None:
        """Follow the run in focus: the next query runs on it."""
        if source != self.source:
            self.source = source
            self.border_title = f"SQL on {source.run_id}" if source is not None else "SQL"

    def action_run(self) -> None:
        if self.source is None:
            self.show_error("no run to query yet: start one with n")
            return
        self._seq += 1
        if self._cancel is not None:
            self._cancel.cancel()  # a newer query replaces it
        self._cancel = QueryCancel()
        self.running = True
        self.set_status(Text(f"running on {self.source.run_id}… (Esc cancels)", style="yellow"))
        self.history.add(self.sql)
        self.run_query(self.source, self.sql, self._seq, self._cancel)

    @work(thread=True, exclusive=True, group="sql", exit_on_error=False)
    def run_query(self, source: RunSource, sql: str, seq: int, cancel: QueryCancel) -> None:
        """A console query on a worker thread; a run's store reads together with its veRL shards."""
        try:
            if not sql.strip():
                raise ForgetuiError("type a query first, e.g. SELECT count(*) FROM calls")
            self.post_message(self.Finished(seq, result=source.query(sql, max_rows=SQL_MAX_ROWS, cancel=cancel)))
        except ForgetuiError as exc:
            self.post_message(self.Finished(seq, error=str(exc)))
        except Exception as exc:
            log.exception("console query failed")
            self.post_message(self.Finished(seq, error=f"{type(exc).__name__}: {exc}"))

    @on(Finished)
    @dropped_once_closed
    def _finished(self, message: Finished) -> None:
        message.stop()
        if message.seq != self._seq:
            return  # cancelled, or a newer query is running
        if message.result is not None:
            self.show_result(message.result)
        else:
            self.show_error(message.error or "query failed")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.running  # Esc means something else while nothing runs
        if action == "export":
            return self.query_one(ResultTable).result is not None  # in the footer once there is a result
        return True

    def action_cancel(self) -> None:
        """Stop the query: its connection is interrupted (a store file or a run's shards) and its answer dropped
        (a query sent to a live writer's endpoint runs on there, within that endpoint's time limit)."""
        if not self.running:
            return
        self.running = False
        self._seq += 1
        if self._cancel is not None:
            self._cancel.cancel()
            self._cancel = None
        self.workers.cancel_group(self, "sql")
        self.set_status(Text("cancelled", style="yellow"))
        self.refresh_bindings()

    def action_history(self, direction: int) -> None:
        sql = self.history.older() if direction < 0 else self.history.newer()
        if sql is not None:
            self.sql = sql

    def action_export(self, fmt: str) -> None:
        result = self.query_one(ResultTable).result
        if result is None or self.source is None:
            return
        self.export(result, export_path(self.source.exports_dir, fmt))

    @work(thread=True, exclusive=True, group="export", exit_on_error=False)
    def export(self, result: QueryResult, path: Path) -> None:
        try:
            written = export_result(result, path)
        except (ForgetuiError, OSError) as exc:
            self.post_message(self.Exported(f"export failed: {exc}", error=True))
        else:
            self.post_message(self.Exported(f"exported {len(result.rows)} rows → {written}"))

    @on(Exported)
    @dropped_once_closed
    def _exported(self, message: Exported) -> None:
        message.stop()
        self.set_status(Text(message.note, style="bold red" if message.error else "green"))
        self.notify(message.note, title="export", severity="error" if message.error else "information", markup=False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "sql-run":
            event.stop()
            self.action_run()

    @on(SchemaTree.Picked)
    def _insert(self, event: SchemaTree.Picked) -> None:
        event.stop()
        editor = self.query_one(SqlEditor)
        editor.insert(event.name)
        editor.focus()

    @on(SqlEditor.Completions)
    def _completions(self, event: SqlEditor.Completions) -> None:
        event.stop()
        shown = event.names[:12]
        self.set_status(Text("Tab: " + "  ".join(shown) + (f"  … {len(event.names) - 12} more" if len(event.names) > 12 else ""),
                             style="cyan"))

    def set_status(self, text: Text | str) -> None:
        self.query_one("#sql-status", Static).update(text)

    def show_result(self, result: QueryResult) -> None:
        self.running = False
        self.query_one(ResultTable).show_result(result)
        note = f"{len(result.rows)} rows" + (" (truncated)" if result.truncated else "")
        self.set_status(Text(note, style="green"))
        self.refresh_bindings()

    def show_error(self, message: str) -> None:
        """The error replaces the previous result: a stale table under an error reads as the answer."""
        self.running = False
        self.query_one(ResultTable).clear_result()
        self.set_status(Text(message, style="bold red"))
        self.refresh_bindings()
