"""The rollout status machine: pending → starting → running → verifying → done | failed | timeout | infra_error."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    VERIFYING = "verifying"
    DONE = "done"  # the harness finished and the verifier scored it (passed or not)
    FAILED = "failed"  # the harness itself failed (non-zero exit); the verifier still scored it
    TIMEOUT = "timeout"  # the rollout hit its wall clock; reward 0
    INFRA_ERROR = "infra_error"  # image, sandbox or exec failure after every retry; excluded from scores


TERMINAL = frozenset({Status.DONE, Status.FAILED, Status.TIMEOUT, Status.INFRA_ERROR})
TERMINAL_VALUES = frozenset(str(s) for s in TERMINAL)  # as the store holds them

_NEXT: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.STARTING, Status.INFRA_ERROR}),
    Status.STARTING: frozenset({Status.RUNNING, Status.PENDING, Status.INFRA_ERROR}),
    Status.RUNNING: frozenset({Status.VERIFYING, Status.TIMEOUT, Status.PENDING, Status.INFRA_ERROR}),
    Status.VERIFYING: frozenset({Status.DONE, Status.FAILED, Status.PENDING, Status.INFRA_ERROR}),
}


def can_move(current: Status, new: Status) -> bool:
    """Whether `current → new` is a legal step (PENDING again means: retry or interrupted)."""
    return new in _NEXT.get(current, frozenset())


class Outcome(StrEnum):
    """What a finished rollout counts as, everywhere: run summary, eval report, progress, TUI."""

    PASSED = "passed"
    BELOW_THRESHOLD = "below_threshold"  # the harness finished; the verifier's score is under the task's threshold
    HARNESS_FAILED = "harness_failed"  # the harness itself failed (crashed, non-zero exit) and the workspace did not pass
    TIMEOUT = "timeout"
    INFRA_ERROR = "infra_error"


FAILED_OUTCOMES = frozenset({Outcome.BELOW_THRESHOLD, Outcome.HARNESS_FAILED})


def outcome_of(status: str | Status | None, passed: bool | None) -> Outcome | None:
    """The outcome of a rollout row; None while it is not finished.

    The verifier decides: a `failed` rollout (the harness exited non-zero) whose workspace the
    verifier passed counts as passed, as it does in pass@k. A rollout that did not pass is
    `below_threshold` when its harness finished (a partial score) and `harness_failed` when the
    harness crashed. A timeout is never passed; an infrastructure error is not a score at all.
    """
    if status == Status.INFRA_ERROR:
        return Outcome.INFRA_ERROR
    if status == Status.TIMEOUT:
        return Outcome.TIMEOUT
    if passed and status in (Status.DONE, Status.FAILED):
        return Outcome.PASSED
    if status == Status.DONE:
        return Outcome.BELOW_THRESHOLD
    if status == Status.FAILED:
        return Outcome.HARNESS_FAILED
    return None


@dataclass
class Tally:
    """Finished rollouts counted by outcome; `failed` is both kinds of not passing together."""

    passed: int = 0
    below_threshold: int = 0
    harness_failed: int = 0
    timeout: int = 0
    infra_error: int = 0

    def add(self, status: str | Status | None, passed: bool | None) -> Outcome | None:
        outcome = outcome_of(status, passed)
        if outcome is not None:
            setattr(self, str(outcome), getattr(self, str(outcome)) + 1)
        return outcome

    @property
    def failed(self) -> int:
        """Scored rollouts that did not pass (below the threshold, or the harness failed)."""
        return self.below_threshold + self.harness_failed

    @property
    def finished(self) -> int:
        return self.passed + self.failed + self.timeout + self.infra_error

    @property
    def scored(self) -> int:
        """Finished rollouts that count in scores (all but infrastructure errors)."""
        return self.passed + self.failed + self.timeout

    def nonzero(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if v}
