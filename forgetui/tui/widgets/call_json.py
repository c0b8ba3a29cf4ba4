"""The raw request and response JSON of one call, in a read-only editor (select and copy; `y` copies all)."""

from __future__ import annotations

import json
from typing import Any

from textual.binding import Binding
from textual.widgets import TextArea

from forgetui.tui.source import parse_json


def raw_json(call: dict[str, Any]) -> str:
    """A call's request and response bodies as indented JSON."""
    body = {"call_id": call.get("call_id"), "request": parse_json(call.get("request")),
            "response": parse_json(call.get("response"))}
    return json.dumps(body, indent=2, ensure_ascii=False, default=str)


class CallJson(TextArea):
    """Read-only JSON; `y` puts the whole text on the clipboard (OSC 52, through the terminal)."""

    BINDINGS = [Binding("y", "copy_all", "Copy JSON")]
    DEFAULT_CSS = """
    CallJson { width: 1fr; height: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", language="json", read_only=True, soft_wrap=False, **kwargs)

    def show_call(self, call: dict[str, Any]) -> None:
        self.load_text(raw_json(call))
        self.border_subtitle = str(call.get("call_id") or "")

    def action_copy_all(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.notify(f"copied {len(self.text)} characters of JSON")
