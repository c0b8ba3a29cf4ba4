"""The `/` search box of a rollout's screen: hidden until asked for; Enter finds the next match (again: the one
after), Esc closes it. The screen does the finding (in the conversation, the token text or the verifier's log)
and says on the box's border which match is shown."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class SearchBar(Input):
    """Posts Find(query) on each Enter and Closed on Esc."""

    class Find(Message):
        def __init__(self, query: str) -> None:
            super().__init__()
            self.query = query

    class Closed(Message):
        """Esc: the box hides; the screen drops its highlights."""

    BINDINGS = [Binding("escape", "close", "Close search")]
    DEFAULT_CSS = """
    SearchBar { display: none; }
    SearchBar.-shown { display: block; }
    """

    def __init__(self, placeholder: str = "search (Enter: next match, Esc: close)", **kwargs: Any) -> None:
        super().__init__(placeholder=placeholder, **kwargs)

    def open(self) -> None:
        self.add_class("-shown")
        self.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip():
            self.post_message(self.Find(event.value))

    def action_close(self) -> None:
        self.remove_class("-shown")
        self.border_title = ""
        self.post_message(self.Closed())
