"""Messages the TUI's workers and widgets post upwards ("attributes down, messages up")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.message import Message

from core.store.query import QueryResult
from forgetui.tui.data import CallDetail, CallRow, RolloutRow, StoreInfo
from forgetui.tui.run_data import RolloutDetail, RunDetail, RunInfo, RunSource

if TYPE_CHECKING:
    from core.eval.summary import RunSummary


class StoresLoaded(Message):
    """A fresh list of stores under FORGETUI_HOME."""

    def __init__(self, stores: list[StoreInfo]) -> None:
        super().__init__()
        self.stores = stores


class StoreSelected(Message):
    """A store became the one the Calls, Rollouts and SQL tabs work on; `chosen`: the user picked it in the list."""

    def __init__(self, path: Path, chosen: bool = False) -> None:
        super().__init__()
        self.path = path
        self.chosen = chosen


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

    def __init__(self, sql: str, result: QueryResult | None = None, error: str | None = None, *, seq: int = 0) -> None:
        super().__init__()
        self.sql = sql
        self.result = result
        self.error = error
        self.seq = seq  # which run of the console it answers (a cancelled or superseded one is dropped)


class LoadFailed(Message):
    """A background read failed; `what` says which one."""

    def __init__(self, what: str, error: str) -> None:
        super().__init__()
        self.what = what
        self.error = error


class RolloutsLoaded(Message):
    """The rollouts of a store, for the Rollouts tab."""

    def __init__(self, path: Path, rollouts: list[RolloutRow]) -> None:
        super().__init__()
        self.path = path
        self.rollouts = rollouts


# ---------------------------------------------------------------------- the live run (posted by the run worker)
class RunStarted(Message):
    """The engine planned the run: its id, store and number of rollouts (finished ones of a resume included)."""

    def __init__(self, run_id: str, store: Path, total: int) -> None:
        super().__init__()
        self.run_id = run_id
        self.store = store
        self.total = total


class RolloutFinished(Message):
    """The engine reports a rollout in a terminal status."""

    def __init__(self, row: RolloutRow) -> None:
        super().__init__()
        self.row = row


class RunPolled(Message):
    """The run's rollouts and call count as its store has them now."""

    def __init__(self, run_id: str, rollouts: list[RolloutRow], n_calls: int | None) -> None:
        super().__init__()
        self.run_id = run_id
        self.rollouts = rollouts
        self.n_calls = n_calls


class RunFinished(Message):
    """The run ended normally; its summary (pass@k, pass^k, ...)."""

    def __init__(self, summary: RunSummary) -> None:
        super().__init__()
        self.summary = summary


class RunInterrupted(Message):
    """The run was stopped on request; its sandboxes are gone and it is marked interrupted."""


class RunFailed(Message):
    """The run stopped on an error (config, sandbox, ...)."""

    def __init__(self, error: str, code: int = 1) -> None:
        super().__init__()
        self.error = error
        self.code = code


# ---------------------------------------------------------------------- runs, a run, a rollout (drill-down)
class RunsLoaded(Message):
    """Every run under FORGETUI_HOME ."""

    def __init__(self, runs: list[RunInfo]) -> None:
        super().__init__()
        self.runs = runs


class RunOpened(Message):
    """The user pressed Enter on a run."""

    def __init__(self, info: RunInfo) -> None:
        super().__init__()
        self.info = info


class RunLoaded(Message):
    """A run in full for the Run screen."""

    def __init__(self, detail: RunDetail) -> None:
        super().__init__()
        self.detail = detail


class RolloutOpened(Message):
    """The user pressed Enter on a rollout: its run folder (or store) and id."""

    def __init__(self, source: RunSource, rollout_id: str) -> None:
        super().__init__()
        self.source = source
        self.rollout_id = rollout_id


class RolloutLoaded(Message):
    """A rollout in full for the Rollout screen, its conversation and verifier texts already rendered."""

    def __init__(self, detail: RolloutDetail, conversation: Text, verifier: Text) -> None:
        super().__init__()
        self.detail = detail
        self.conversation = conversation
        self.verifier = verifier


class BehaviourLoaded(Message):
    """A run's behaviour table (header, rows) as `forgetui analyze` prints it."""

    def __init__(self, header: list[str], rows: list[list[str]]) -> None:
        super().__init__()
        self.header = header
        self.rows = rows
