"""The SQL console's editor: Textual's TextArea with SQL highlighting, and Ctrl+A selecting all (as editors do;
TextArea's own Ctrl+A moves to the line's start, which Home does too)."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.widgets import TextArea


class SqlEditor(TextArea):
    BINDINGS = [Binding("ctrl+a", "select_all", "Select all", show=False),
                Binding("escape", "leave", "Leave editor")]  # (TextArea's own Esc handling does the same)

    def action_leave(self) -> None:
        self.screen.focus_next()

    def __init__(self, text: str = "", **kwargs: Any) -> None:
        super().__init__(text, soft_wrap=True, tab_behavior="indent", language="sql", **kwargs)
