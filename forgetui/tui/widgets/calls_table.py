"""The calls of the selected store, one row per call; updated in place so the cursor stays put."""

from __future__ import annotations

from pathlib import Path

from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import DataTable

from forgetui.tui.data import CALL_COLUMNS, CallRow
from forgetui.tui.messages import CallSelected, RolloutOpened
from forgetui.tui.run_data import store_source
from forgetui.tui.widgets.gradual import add_gradually

SETTLE_S = 0.15  # the cursor must rest this long before the inspector loads the call


class CallsTable(DataTable):
    """A row per call (row key = call_id); the cursor resting on a row posts CallSelected (debounced:
    holding the arrow key through 50 rows loads one call, not 50)."""

    BORDER_TITLE = "Calls"
    BINDINGS = [Binding("f", "toggle_follow", "Follow")]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self.store: Path | None = None
        self._cells: dict[str, tuple[str, ...]] = {}
        self._settle: Timer | None = None
        self.follow = False  # keep the cursor on the newest call as a live store grows
        self._rollout_of: dict[str, str] = {}

    def on_mount(self) -> None:
        for name in CALL_COLUMNS:
            self.add_column(name, key=name)

    def show_calls(self, store: Path, calls: list[CallRow]) -> None:
        """Show `calls` of `store`: new rows are added, changed cells updated, vanished rows removed."""
        if store != self.store:
            self.clear()
            self._cells.clear()
            self.store = store
        wanted = {c.call_id: c.cells() for c in calls}
        self._rollout_of = {c.call_id: c.rollout_id for c in calls}
        for gone in [k for k in self._cells if k not in wanted]:
            if gone in self.rows:
                self.remove_row(gone)
            del self._cells[gone]
        new = []
        for call_id, cells in wanted.items():
            old = self._cells.get(call_id)
            if old is None:
                new.append(call_id)
            elif old != cells and call_id in self.rows:
                for col, (a, b) in zip(CALL_COLUMNS, zip(old, cells, strict=True), strict=True):
                    if a != b:
                        self.update_cell(call_id, col, b)
            self._cells[call_id] = cells
        add_gradually(self, new, self._cells.get)
        if self.follow and new:
            self.call_after_refresh(self._to_newest, new[-1])
        self.border_subtitle = f"{len(calls)} calls" + (" · following" if self.follow else "")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter: the call's rollout, on its own screen (conversation, decoded tokens, verifier)."""
        event.stop()
        rollout = self._rollout_of.get(str(event.row_key.value))
        if rollout and self.store is not None:
            self.post_message(RolloutOpened(store_source(self.store), rollout))

    def _to_newest(self, call_id: str) -> None:
        if self.follow and call_id in self.rows:
            self.move_cursor(row=self.get_row_index(call_id), animate=False)
        elif self.follow and call_id in self._cells:  # still being added: try after the next refresh
            self.call_after_refresh(self._to_newest, call_id)

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.notify("following the newest call" if self.follow else "follow off", title="calls")
        if self.follow and self._cells:
            self._to_newest(list(self._cells)[-1])

    def clear_calls(self) -> None:
        self.clear()
        self._cells.clear()
        self.store = None
        self.border_subtitle = ""

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if self._settle is not None:
            self._settle.stop()
        if event.row_key.value is not None:
            call_id = str(event.row_key.value)
            self._settle = self.set_timer(SETTLE_S, lambda: self.post_message(CallSelected(call_id)))
