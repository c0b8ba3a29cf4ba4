"""The one status vocabulary: a rollout's status (pending → starting → running → verifying → done | failed | timeout |
infra_error), what a finished one counts as (its outcome), and the same sets as SQL for queries on the store.

Every consumer (run summaries, eval reports, samples, behaviour views, the TUI) imports these instead of restating
them; `core.rollout.transitions` holds the state machine's legal moves."""

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



class RunStatus(StrEnum):
    """A run's status (the store's `runs.status`): running until it ends done, failed or interrupted."""

    RUNNING = "running"
    DONE = "done"  # every rollout ran (and, when training, every step)
    FAILED = "failed"  # it stopped on an error: the store's meta `failure:<run_id>` says why
    INTERRUPTED = "interrupted"  # cancelled or Ctrl-C: `forgetui run --resume` finishes it


TERMINAL = frozenset({Status.DONE, Status.FAILED, Status.TIMEOUT, Status.INFRA_ERROR})
TERMINAL_VALUES = frozenset(str(s) for s in TERMINAL)  # as the store holds them
VERIFIED = (Status.DONE, Status.FAILED)  # the verifier scored the workspace: `passed` means what it says
SCORED = (*VERIFIED, Status.TIMEOUT)  # counted in scores and behaviour (a timeout scores 0; infra errors are no score)
IN_SANDBOX = (Status.STARTING, Status.RUNNING, Status.VERIFYING)  # a sandbox is working on it now


def sql_list(statuses: tuple[Status, ...] | frozenset[Status]) -> str:
    """A status set as a SQL list literal, for `status IN ...` (sorted, so the text is stable)."""
    return "(" + ", ".join(f"'{s}'" for s in sorted(str(x) for x in statuses)) + ")"


TERMINAL_SQL = sql_list(TERMINAL)
SCORED_SQL = sql_list(SCORED)
VERIFIED_SQL = sql_list(VERIFIED)
PASSED_SQL = f"(status IN {VERIFIED_SQL} AND coalesce(passed, false))"  # a rollout row that passed, as `outcome_of` decides

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


# `outcome_of` as a SQL expression over a rollouts row (status, passed): the same rule wherever the store is read
OUTCOME_SQL = (
    f"CASE WHEN status = '{Status.INFRA_ERROR}' THEN '{Outcome.INFRA_ERROR}' WHEN status = '{Status.TIMEOUT}' THEN '{Outcome.TIMEOUT}' "
    f"WHEN {PASSED_SQL} THEN '{Outcome.PASSED}' WHEN status = '{Status.DONE}' THEN '{Outcome.BELOW_THRESHOLD}' "
    f"WHEN status = '{Status.FAILED}' THEN '{Outcome.HARNESS_FAILED}' END"
)


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
