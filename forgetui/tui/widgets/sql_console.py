"""A SQL console on the selected store: editor, schema browser, status line and a paged result.

Run keys: F5, Ctrl+R and Ctrl+Enter (the last only where the terminal reports it: kitty protocol); Esc cancels a
running query; Ctrl+↑/↓ step through the history; F8/F9 export the result as CSV/Parquet (F6/F7 select in the editor)."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Static, TextArea

from core.store.query import QueryResult
from forgetui.tui.messages import RunSql
from forgetui.tui.sql_history import SqlHistory
from forgetui.tui.widgets.result_table import ResultTable
from forgetui.tui.widgets.schema_tree import SchemaPicked, SchemaTree

DEFAULT_SQL = "SELECT api, status, count(*) AS calls FROM calls GROUP BY ALL ORDER BY calls DESC"
HINT = "F5 / Ctrl+R run · Esc cancels · Ctrl+↑↓ history · Enter on a cell shows it · F8 CSV · F9 Parquet"


class CancelSql(Message):
    """The user cancelled the running query."""


class ExportSql(Message):
    """Export the shown result as `fmt` (csv or parquet)."""

    def __init__(self, fmt: str) -> None:
        super().__init__()
        self.fmt = fmt


class SqlConsole(Vertical):
    """Posts RunSql / CancelSql / ExportSql; the app answers through show_result / show_error / set_status."""

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

    def __init__(self, history: SqlHistory | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.history = history or SqlHistory()
        self.running = False

    def compose(self) -> ComposeResult:
        with Horizontal(id="sql-top"):
            with Vertical(id="sql-edit"):
                yield TextArea(DEFAULT_SQL, id="sql-input", soft_wrap=True, tab_behavior="indent", language="sql")
                with Horizontal(id="sql-bar"):
                    yield Button("Run (F5)", id="sql-run", variant="primary")
                    yield Static(HINT, id="sql-hint")
            yield SchemaTree(id="sql-schema")
        yield Static("", id="sql-status")
        yield ResultTable(id="sql-result")

    @property
    def sql(self) -> str:
        return self.query_one("#sql-input", TextArea).text

    @sql.setter
    def sql(self, value: str) -> None:
        self.query_one("#sql-input", TextArea).text = value

    def action_run(self) -> None:
        self.running = True
        self.set_status(Text("running… (Esc cancels)", style="yellow"))
        self.history.add(self.sql)
        self.post_message(RunSql(self.sql))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.running if action == "cancel" else True  # Esc means something else while nothing runs

    def action_cancel(self) -> None:
        if self.running:
            self.running = False
            self.post_message(CancelSql())
            self.set_status(Text("cancelled", style="yellow"))

    def action_history(self, direction: int) -> None:
        sql = self.history.older() if direction < 0 else self.history.newer()
        if sql is not None:
            self.sql = sql

    def action_export(self, fmt: str) -> None:
        self.post_message(ExportSql(fmt))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "sql-run":
            event.stop()
            self.action_run()

    @on(SchemaPicked)
    def _insert(self, event: SchemaPicked) -> None:
        event.stop()
        editor = self.query_one("#sql-input", TextArea)
        editor.insert(event.name)
        editor.focus()

    def set_status(self, text: Text | str) -> None:
        self.query_one("#sql-status", Static).update(text)

    def show_result(self, result: QueryResult) -> None:
        self.running = False
        self.query_one(ResultTable).show_result(result)
        note = f"{len(result.rows)} rows" + (" (truncated)" if result.truncated else "")
        self.set_status(Text(note, style="green"))

    def show_error(self, message: str) -> None:
        """The error replaces the previous result: a stale table under an error reads as the answer."""
        self.running = False
        self.query_one(ResultTable).clear_result()
        self.set_status(Text(message, style="bold red"))
