"""A scrolling pane of text (a conversation, a verifier's output) whose ←/→ are left to the screen, which
switches tabs with them; ↑/↓, PgUp/PgDn and Home/End scroll it."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll


class TextPane(VerticalScroll, inherit_bindings=False):
    BINDINGS = [
        Binding("up", "scroll_up", "Scroll up", show=False),
        Binding("down", "scroll_down", "Scroll down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "scroll_home", "Top", show=False),
        Binding("end", "scroll_end", "Bottom", show=False),
    ]
