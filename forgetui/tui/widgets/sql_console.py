"""A SQL console on the selected store: a query editor, a Run button, an error/status line and the result."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Static, TextArea

from core.store.query import QueryResult
from forgetui.tui.data import cell_text
from forgetui.tui.messages import RunSql

DEFAULT_SQL = "SELECT api, status, count(*) AS calls FROM calls GROUP BY ALL ORDER BY calls DESC"


class SqlConsole(Vertical):
    """Posts RunSql with the editor's text; the app answers through show_result / show_error."""

    BORDER_TITLE = "SQL"
    BINDINGS = [
        Binding("ctrl+enter", "run", "Run SQL", priority=True),
        Binding("ctrl+j", "run", "Run SQL", show=False, priority=True),
    ]

    def compose(self) -> ComposeResult:
        yield TextArea(DEFAULT_SQL, id="sql-input", soft_wrap=True, tab_behavior="indent")
        with Horizontal(id="sql-bar"):
            yield Button("Run", id="sql-run", variant="primary")
            yield Static("Ctrl+Enter runs the query (read-only: SELECT, WITH, DESCRIBE, SHOW, EXPLAIN)",
                         id="sql-hint")
        yield Static("", id="sql-status")
        yield DataTable(id="sql-result", zebra_stripes=True)

    @property
    def sql(self) -> str:
        return self.query_one("#sql-input", TextArea).text

    @sql.setter
    def sql(self, value: str) -> None:
        self.query_one("#sql-input", TextArea).text = value

    def action_run(self) -> None:
        self.set_status(Text("running…", style="yellow"))
        self.post_message(RunSql(self.sql))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "sql-run":
            event.stop()
            self.action_run()

    def set_status(self, text: Text | str) -> None:
        self.query_one("#sql-status", Static).update(text)

    def show_result(self, result: QueryResult) -> None:
        table = self.query_one("#sql-result", DataTable)
        table.clear(columns=True)
        # columns may repeat (SELECT 1, 1): keys must be unique
        for i, name in enumerate(result.columns):
            table.add_column(name, key=f"c{i}")
        for row in result.rows:
            table.add_row(*(Text(cell_text(v)) if v is not None else Text("NULL", style="dim") for v in row))
        note = f"{len(result.rows)} rows" + (" (truncated)" if result.truncated else "")
        self.set_status(Text(note, style="green"))

    def show_error(self, message: str) -> None:
        self.set_status(Text(message, style="bold red"))
