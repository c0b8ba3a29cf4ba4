"""The `/` filter over a table: hidden until asked for; typing filters the table (any column, every word);
Enter goes back to the table with the filter kept, Esc clears it."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.widgets import Input

from forgetui.tui.widgets.line_table import LineTable


class FilterBar(Input):
    """Filters the LineTable with id `table` (a sibling, or anywhere on the screen)."""

    BINDINGS = [Binding("escape", "clear", "Clear filter")]
    DEFAULT_CSS = """
    FilterBar { display: none; height: 3; }
    FilterBar.-shown { display: block; }
    """

    def __init__(self, table: str, placeholder: str = "filter (any column; Enter keeps it, Esc clears)", **kwargs: Any) -> None:
        super().__init__(placeholder=placeholder, **kwargs)
        self.table_id = table

    @property
    def table(self) -> LineTable:
        return self.screen.query_one(f"#{self.table_id}", LineTable)

    def open(self) -> None:
        self.add_class("-shown")
        self.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.table.set_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.value:
            self.remove_class("-shown")
        self.table.focus()

    def action_clear(self) -> None:
        self.value = ""
        self.table.set_filter("")
        self.remove_class("-shown")
        self.table.focus()
