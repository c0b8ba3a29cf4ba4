"""A source's calls, one line each; the inspector loads the call the cursor rests on (debounced)."""

from __future__ import annotations

from typing import Any

from textual.binding import Binding
from textual.message import Message
from textual.timer import Timer

from forgetui.tui.rows import CALL_COLUMNS, CallRow
from forgetui.tui.widgets.line_table import Cell, Column, LineTable

SETTLE_S = 0.15  # the cursor must rest this long before the inspector loads the call
# headers are the SQL console's column names (the token columns count the ids: len(prompt_token_ids), ...);
# the rollout is its id without the run's prefix
WIDTHS = {"seq": Column("seq", 5), "rollout": Column("rollout", 32, shrink=True, min_width=16),
          "api": Column("api", 9), "model": Column("model", 24, shrink=True), "status": Column("status", 8),
          "prompt_token_ids": Column("prompt_token_ids", 16, short="prompt"),
          "completion_token_ids": Column("completion_token_ids", 20, short="compl"),
          "latency_ms": Column("latency_ms", 10, short="ms"), "branch": Column("branch", 6, short="br"),
          "extends_parent": Column("extends_parent", 14, short="ext")}


class CallsTable(LineTable):
    """Calls oldest first; a cursor resting on a row posts CallChosen (holding ↓ through 50 rows loads one call);
    `f` follows the newest call of a live store."""

    class CallChosen(Message):
        """The cursor rested on a call: the inspector shows it."""

        def __init__(self, call_id: str) -> None:
            super().__init__()
            self.call_id = call_id

    BINDINGS = [Binding("f", "toggle_follow", "Follow")]
    COLUMNS = tuple(WIDTHS[name] for name in CALL_COLUMNS)
    NOUN = "calls"
    EMPTY = "no calls recorded"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.follow = False  # keep the cursor on the newest call as a live store grows
        self._settle: Timer | None = None

    def row_key(self, row: CallRow) -> str:
        return row.call_id

    def cells_of(self, row: CallRow) -> list[Cell]:
        cells = row.cells()
        return [(cells[name], None) for name in CALL_COLUMNS]

    def show_calls(self, calls: list[CallRow]) -> None:
        grew = len(calls) > len(self.rows)
        self.set_rows(calls)
        if self.follow and grew:
            self.action_to_end()

    def subtitle(self) -> str:
        return super().subtitle() + (" · following" if self.follow else "") + " · Enter opens the rollout"

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.border_subtitle = self.subtitle()
        if self.follow:
            self.action_to_end()

    def on_line_table_highlighted(self, event: LineTable.Highlighted) -> None:
        if event.table is not self:
            return
        if self._settle is not None:
            self._settle.stop()
        if event.row is not None:
            call_id = event.row.call_id
            self._settle = self.set_timer(SETTLE_S, lambda: self.post_message(self.CallChosen(call_id)))
