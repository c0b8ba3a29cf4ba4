"""A run going on inside the TUI (`forgetui run CONFIG` on a terminal): its state, merged from the engine's events
and polls of its store; `now` is any monotonic clock."""

from __future__ import annotations

import collections
from dataclasses import replace
from enum import StrEnum
from pathlib import Path

from core.status import Outcome, Tally
from forgetui.tui.rows import RolloutRow


class LiveState(StrEnum):
    """Where the run inside the TUI is: the TUI's own lifecycle of it (the store's `runs.status` says the rest)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


ACTIVE = frozenset({LiveState.STARTING, LiveState.RUNNING})


RATE_WINDOW_S = 30.0  # calls/s over this much of the recent past: the store commits calls in batches


class CallRate:
    """Calls/s from successive counts of a run's calls, over the last RATE_WINDOW_S: two polls a second apart
    may see the same count while calls are written in batches (between polls: 0.00 calls/s while they climb)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.seen: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, now: float, n_calls: int) -> float | None:
        """Record a count; the rate over the window (None until two counts a moment apart)."""
        if self.seen and n_calls < self.seen[-1][1]:  # fewer calls (another store, a reset): start over
            self.seen.clear()
        self.seen.append((now, n_calls))
        while len(self.seen) > 2 and now - self.seen[1][0] >= self.window_s:
            self.seen.popleft()
        (t0, n0), (t1, n1) = self.seen[0], self.seen[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None


class RunProgress:
    """The live dashboard's numbers: rows by rollout, rewards in finish order, calls/s."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.store: Path | None = None
        self.total = 0
        self.rows: dict[str, RolloutRow] = {}
        self.rewards: list[float] = []  # reward of each finished (scored) rollout, in finish order
        self.finished_here: set[str] = set()  # rollouts the engine reported finished since the run started
        self.started: float | None = None
        self.n_calls: int | None = None
        self.calls_per_s: float | None = None
        self._rate = CallRate()
        self._counted: set[str] = set()

    def start(self, run_id: str, store: Path, total: int, now: float) -> None:
        self.run_id, self.store, self.total, self.started = run_id, Path(store), total, now

    def _merge(self, new: RolloutRow) -> RolloutRow:
        old = self.rows.get(new.rollout_id)
        if old is not None and old.terminal and not new.terminal:  # a poll older than the event: keep the result
            new = replace(old, attempt=new.attempt if new.attempt is not None else old.attempt)
        elif old is not None:
            new = replace(new, attempt=new.attempt if new.attempt is not None else old.attempt,
                          sample_index=new.sample_index if new.sample_index is not None else old.sample_index)
        self.rows[new.rollout_id] = new
        if new.terminal and new.rollout_id not in self._counted:
            self._counted.add(new.rollout_id)
            if new.outcome != Outcome.INFRA_ERROR:  # infra errors are not scores
                self.rewards.append(float(new.reward or 0.0))
        return new

    def apply_event(self, row: RolloutRow) -> RolloutRow:
        """A rollout reached a terminal status (from the engine)."""
        self.finished_here.add(row.rollout_id)
        return self._merge(row)

    def apply_rows(self, rows: list[RolloutRow]) -> None:
        """The run's rows as the store has them now (on resume, some finished in an earlier session)."""
        for row in rows:
            self._merge(row)
        self.total = max(self.total, len(self.rows))

    def apply_calls(self, n_calls: int, now: float) -> None:
        """A fresh count of the run's calls: calls/s over the last RATE_WINDOW_S."""
        self.calls_per_s = self._rate.add(now, n_calls)
        self.n_calls = n_calls

    def tally(self) -> Tally:
        """Finished rollouts by outcome (core's words: passed, below threshold, harness failed, timeout, infra error)."""
        tally = Tally()
        for row in self.rows.values():
            tally.add(row.status, row.passed)
        return tally

    def reward_curve(self) -> list[float]:
        """Mean reward of the finished rollouts after each one finished."""
        out, total = [], 0.0
        for i, r in enumerate(self.rewards, 1):
            total += r
            out.append(total / i)
        return out

    def rollouts_per_min(self, now: float) -> float | None:
        if self.started is None or now <= self.started:
            return None
        return len(self.finished_here) / ((now - self.started) / 60.0)

    def sorted_rows(self) -> list[RolloutRow]:
        return sorted(self.rows.values(), key=lambda r: (r.task_id, r.sample_index or 0, r.rollout_id))
