"""One field of the new-run form: an Input whose paste of `key=value` lines (as `--set` takes them) fills the
form's fields instead of landing in this one."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import Input


def assignments(text: str) -> list[tuple[str, str]] | None:
    """`key=value` per line (blank lines skipped), or None when `text` is not that (a plain value)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    pairs = []
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep or not key.strip() or " " in key.strip() or "." not in key:
            return None
        pairs.append((key.strip(), value.strip()))
    return pairs or None


class FormField(Input):
    """A pasted value lands here whole; pasted `key=value` lines go to their fields (FormField.Pasted)."""

    class Pasted(Message):
        def __init__(self, pairs: list[tuple[str, str]]) -> None:
            super().__init__()
            self.pairs = pairs

    def _on_paste(self, event: events.Paste) -> None:
        """Runs before Input's own handler (Textual calls each class's in turn), which a plain value then reaches."""
        pairs = assignments(event.text)
        if pairs is not None:
            event.stop()
            event.prevent_default()
            self.post_message(self.Pasted(pairs))
