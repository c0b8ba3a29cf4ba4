"""A modal with one result cell in full: JSON pretty-printed, lists one item per line; Esc closes, y copies."""

from __future__ import annotations

import json
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static, TextArea

from forgetui.tui.widgets.key_footer import KeyFooter


def cell_full_text(value: Any) -> tuple[str, str | None]:
    """(text, language): JSON text and lists/dicts indented as JSON; anything else as is."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value, None
        if isinstance(parsed, (dict, list)):
            return json.dumps(parsed, indent=2, ensure_ascii=False), "json"
        return value, None
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, indent=2, ensure_ascii=False, default=str), "json"
    return "NULL" if value is None else str(value), None


class CellViewer(ModalScreen[None]):
    BINDINGS = [Binding("escape", "dismiss", "Close", key_display="esc/q"), Binding("q", "dismiss", "Close", show=False),
                Binding("y", "copy", "Copy")]

    def __init__(self, column: str, value: Any) -> None:
        super().__init__()
        self.column = column
        self.text, self.language = cell_full_text(value)

    def compose(self) -> ComposeResult:
        with Vertical(id="cell-box"):
            yield Static(f"{self.column} · {len(self.text)} characters · Esc closes · y copies", id="cell-title")
            yield TextArea(self.text, language=self.language, read_only=True, id="cell-text")
        yield KeyFooter()

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.notify("copied")
