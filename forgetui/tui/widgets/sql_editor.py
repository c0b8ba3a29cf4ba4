"""The SQL console's editor: Textual's TextArea with SQL highlighting, Ctrl+A selecting all (as editors do;
TextArea's own Ctrl+A moves to the line's start, which Home does too), and Tab completing table and column
names (after `table.`, that table's columns), as Harlequin does; Tab after a space still indents."""

from __future__ import annotations

import os
import re
from typing import Any

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from core.store.schema import BEHAVIOUR_VIEWS, TABLES, VIEWS

WORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*\.)?([A-Za-z_][A-Za-z0-9_]*)$")


def schema_names() -> dict[str, list[str]]:
    """Every table and view of a store → its columns (views: none known here)."""
    names: dict[str, list[str]] = {name: [column for column, _, _ in columns] for name, _, columns, _ in TABLES}
    for name, *_ in (*VIEWS, *BEHAVIOUR_VIEWS):
        names.setdefault(name, [])
    return names


def completions(before: str, names: dict[str, list[str]]) -> tuple[str, list[str]]:
    """For the text before the cursor: (what to insert, the candidates). After `table.`, that table's columns;
    else every table and column name. Nothing to insert and no candidates when no name starts so."""
    m = WORD.search(before)
    if m is None:
        return "", []
    table, word = (m.group(1) or "")[:-1], m.group(2)
    pool = names.get(table, []) if table else sorted({*names, *(c for cols in names.values() for c in cols)})
    found = sorted({n for n in pool if n.lower().startswith(word.lower()) and n.lower() != word.lower()})
    if not found:
        return "", []
    common = os.path.commonprefix([n.lower() for n in found])
    return found[0][len(word):len(common)] if len(found) > 1 else found[0][len(word):], found


class SqlEditor(TextArea):
    class Completions(Message):
        """Tab found several names: the console shows them."""

        def __init__(self, names: list[str]) -> None:
            super().__init__()
            self.names = names

    BINDINGS = [Binding("ctrl+a", "select_all", "Select all", show=False),
                Binding("escape", "leave", "Leave editor")]  # (TextArea's own Esc handling does the same)

    def __init__(self, text: str = "", **kwargs: Any) -> None:
        super().__init__(text, soft_wrap=True, tab_behavior="indent", language="sql", **kwargs)
        self.names = schema_names()

    def action_leave(self) -> None:
        self.screen.focus_next()

    async def _on_key(self, event: events.Key) -> None:
        """Tab right after a name's first letters completes it (runs before TextArea's own Tab, which indents)."""
        if event.key == "tab" and not self.selected_text:
            row, col = self.cursor_location
            before = self.document.get_line(row)[:col]
            insert, found = completions(before, self.names)
            if found:
                event.stop()
                event.prevent_default()
                if insert:
                    self.insert(insert)
                if len(found) > 1:
                    self.post_message(self.Completions(found))
