"""The Calls tab: the calls of the run in focus, the `/` filter, and the call the cursor rests on in full."""

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
from forgetui.tui.rows import CallDetail, CallRow
from forgetui.tui.source import RunSource
from forgetui.tui.widgets.call_inspector import CallInspector
from forgetui.tui.widgets.calls_table import CallsTable
from forgetui.tui.widgets.filter_bar import FilterBar
from forgetui.tui.widgets.line_table import LineTable

log = logging.getLogger(__name__)


class CallsPane(Vertical):
    """`source` comes from the screen (attributes down); `shown` says whether its tab is on screen, and only
    then are the calls read (each refresh reads up to a thousand)."""

    DEFAULT_CSS = """
    CallsPane { height: 1fr; }
    """

    class Loaded(Message):
        def __init__(self, source: RunSource, calls: list[CallRow], stamp: float) -> None:
            super().__init__()
            self.source = source
            self.calls = calls
            self.stamp = stamp

    class CallLoaded(Message):
        def __init__(self, detail: CallDetail) -> None:
            super().__init__()
            self.detail = detail

    class Failed(Message):
        def __init__(self, what: str, error: str) -> None:
            super().__init__()
            self.what = what
            self.error = error

    def __init__(self, refresh_s: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source: RunSource | None = None
        self.shown = False
        self.refresh_s = refresh_s
        self.call_id: str | None = None
        self._stamp: float | None = None

    def compose(self) -> ComposeResult:
        yield FilterBar("calls-table")
        yield CallsTable(id="calls-table")
        yield CallInspector(id="inspector")

    def on_mount(self) -> None:
        self.set_interval(self.refresh_s, self._tick)

    def show(self, source: RunSource | None, shown: bool) -> None:
        """Follow `source` (the run in focus); read it now when the tab is shown and the source changed."""
        changed = source != self.source
        self.source, self.shown = source, shown
        if changed:
            self._stamp, self.call_id = None, None
            table = self.query_one(CallsTable)
            table.follow = False  # follow (f) is about one live run: another run starts at its first call
            table.set_rows([])
            self.query_one(CallInspector).show_message("select a call")
            self.query_one(CallsTable).border_title = f"Calls of {source.run_id}" if source else "Calls"
        if shown and source is not None and (changed or self._stamp is None):
            self.load_calls(source, force=True)

    def _tick(self) -> None:
        if self.shown and self.source is not None and not self._busy("calls"):
            self.load_calls(self.source)

    def _busy(self, group: str) -> bool:
        return any(w.group == group and w.is_running for w in self.workers)

    @work(thread=True, exclusive=True, group="calls", exit_on_error=False)
    def load_calls(self, source: RunSource, force: bool = False) -> None:
        """The source's last calls, unless its files are unchanged since the last read (and it is not live)."""
        try:
            stamp = source.stamp()
            if not force and stamp == self._stamp and not source.live():
                return
            self.post_message(self.Loaded(source, source.calls(), stamp))
        except ForgetuiError as exc:
            self.post_message(self.Failed("calls", str(exc)))
        except Exception as exc:
            log.exception("loading the calls of %s failed", source.store)
            self.post_message(self.Failed("calls", f"{type(exc).__name__}: {exc}"))

    @work(thread=True, exclusive=True, group="call", exit_on_error=False)
    def load_call(self, source: RunSource, call_id: str) -> None:
        try:
            self.post_message(self.CallLoaded(source.call(call_id)))
        except ForgetuiError as exc:
            self.post_message(self.Failed("call", str(exc)))
        except Exception as exc:
            log.exception("loading call %s failed", call_id)
            self.post_message(self.Failed("call", f"{type(exc).__name__}: {exc}"))

    @on(Loaded)
    @dropped_once_closed
    def _loaded(self, message: Loaded) -> None:
        if message.source == self.source:
            self._stamp = message.stamp
            self.query_one(CallsTable).show_calls(message.calls)

    @on(CallsTable.CallChosen)
    def _chosen(self, message: CallsTable.CallChosen) -> None:
        message.stop()
        if self.source is not None and message.call_id != self.call_id:
            self.call_id = message.call_id
            self.load_call(self.source, message.call_id)

    @on(CallLoaded)
    @dropped_once_closed
    def _call_loaded(self, message: CallLoaded) -> None:
        if message.detail.call_id == self.call_id:
            self.query_one(CallInspector).show_call(message.detail)

    @on(LineTable.Selected, "#calls-table")
    def _open(self, event: LineTable.Selected) -> None:
        """Enter on a call: its rollout, on its own screen (conversation, decoded tokens, verifier)."""
        event.stop()
        if self.source is not None and event.row.rollout_id:
            self.post_message(OpenRollout(self.source, event.row.rollout_id))

    @on(Failed)
    @dropped_once_closed
    def _failed(self, message: Failed) -> None:
        if message.what == "call":
            self.query_one(CallInspector).show_message(message.error, style="bold red")
        else:
            self.query_one(CallsTable).empty_text = message.error
            self.query_one(CallsTable).refresh()
