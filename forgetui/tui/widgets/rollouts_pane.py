"""The Rollouts tab: the rollouts of the run in focus, with the `/` filter; Enter opens one."""

from __future__ import annotations

import logging
from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message

from core.errors import ForgetuiError
from forgetui.tui.closing import dropped_once_closed
from forgetui.tui.messages import OpenRollout
from forgetui.tui.rows import RolloutRow
from forgetui.tui.source import RunSource
from forgetui.tui.widgets.filter_bar import FilterBar
from forgetui.tui.widgets.line_table import LineTable
from forgetui.tui.widgets.rollout_lines import RolloutLines

log = logging.getLogger(__name__)


class RolloutsPane(Vertical):
    """`source` and `run_id` come from the screen; read only while the tab is shown."""

    DEFAULT_CSS = """
    RolloutsPane { height: 1fr; }
    """

    class Loaded(Message):
        def __init__(self, source: RunSource, run_id: str, rows: list[RolloutRow], stamp: float) -> None:
            super().__init__()
            self.source = source
            self.run_id = run_id
            self.rows = rows
            self.stamp = stamp

    class Failed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self, refresh_s: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source: RunSource | None = None
        self.run_id: str | None = None
        self.shown = False
        self.refresh_s = refresh_s
        self._stamp: float | None = None

    def compose(self) -> ComposeResult:
        yield FilterBar("rollouts-table")
        yield RolloutLines(id="rollouts-table")

    def on_mount(self) -> None:
        self.set_interval(self.refresh_s, self._tick)

    def show(self, source: RunSource | None, run_id: str | None, shown: bool) -> None:
        changed = (source, run_id) != (self.source, self.run_id)
        self.source, self.run_id, self.shown = source, run_id, shown
        table = self.query_one(RolloutLines)
        if changed:
            self._stamp = None
            table.set_rows([])
            table.border_title = f"Rollouts of {run_id}" if run_id else "Rollouts"
        if shown and source is not None and run_id and (changed or self._stamp is None):
            self.load(source, run_id, force=True)

    def _tick(self) -> None:
        if self.shown and self.source is not None and self.run_id and not any(w.is_running for w in self.workers):
            self.load(self.source, self.run_id)

    @work(thread=True, exclusive=True, group="rollouts", exit_on_error=False)
    def load(self, source: RunSource, run_id: str, force: bool = False) -> None:
        try:
            stamp = source.stamp()
            if not force and stamp == self._stamp and not source.live():
                return
            self.post_message(self.Loaded(source, run_id, source.rollouts(run_id), stamp))
        except ForgetuiError as exc:
            self.post_message(self.Failed(str(exc)))
        except Exception as exc:
            log.exception("loading the rollouts of %s failed", run_id)
            self.post_message(self.Failed(f"{type(exc).__name__}: {exc}"))

    @on(Loaded)
    @dropped_once_closed
    def _loaded(self, message: Loaded) -> None:
        if (message.source, message.run_id) == (self.source, self.run_id):
            self._stamp = message.stamp
            self.query_one(RolloutLines).show_lines(message.rows)

    @on(Failed)
    @dropped_once_closed
    def _failed(self, message: Failed) -> None:
        table = self.query_one(RolloutLines)
        table.empty_text = message.error
        table.refresh()

    @on(LineTable.Selected, "#rollouts-table")
    def _open(self, event: LineTable.Selected) -> None:
        event.stop()
        if self.source is not None:
            self.post_message(OpenRollout(self.source, event.row.rollout_id))
