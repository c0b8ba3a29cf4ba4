"""Messages widgets post upward when they want another screen: the app decides what opens (Textual's "attributes
down, messages up"), so no widget imports a screen."""

from __future__ import annotations

from typing import Any

from textual.message import Message


class OpenRollout(Message):
    """Open one rollout of a run on its own screen (conversation, tokens, verifier)."""

    def __init__(self, source: Any, rollout_id: str) -> None:
        super().__init__()
        self.source = source  # the RunSource the rollout belongs to
        self.rollout_id = rollout_id


class OpenCell(Message):
    """Show one result cell whole (a long value, JSON pretty-printed)."""

    def __init__(self, column: str, value: Any) -> None:
        super().__init__()
        self.column = column
        self.value = value
