"""Messages the TUI's workers and widgets post upwards ("attributes down, messages up")."""

from __future__ import annotations

from pathlib import Path

from textual.message import Message

from core.store.query import QueryResult
from forgetui.tui.data import CallDetail, CallRow, StoreInfo


class StoresLoaded(Message):
    """A fresh list of stores under FORGETUI_HOME."""

    def __init__(self, stores: list[StoreInfo]) -> None:
        super().__init__()
        self.stores = stores


class StoreSelected(Message):
    """The user picked a store in the list."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path


class CallsLoaded(Message):
    """The calls of a store (the whole current window of rows)."""

    def __init__(self, path: Path, calls: list[CallRow]) -> None:
        super().__init__()
        self.path = path
        self.calls = calls


class CallSelected(Message):
    """The user moved to a call in the calls table."""

    def __init__(self, call_id: str) -> None:
        super().__init__()
        self.call_id = call_id


class CallLoaded(Message):
    """One call in full, for the inspector."""

    def __init__(self, detail: CallDetail) -> None:
        super().__init__()
        self.detail = detail


class RunSql(Message):
    """The SQL console asks for a query to run on the selected store."""

    def __init__(self, sql: str) -> None:
        super().__init__()
        self.sql = sql


class SqlFinished(Message):
    """A console query finished: a result, or the error to show."""

    def __init__(self, sql: str, result: QueryResult | None = None, error: str | None = None) -> None:
        super().__init__()
        self.sql = sql
        self.result = result
        self.error = error


class LoadFailed(Message):
    """A background read failed; `what` says which one."""

    def __init__(self, what: str, error: str) -> None:
        super().__init__()
        self.what = what
        self.error = error
