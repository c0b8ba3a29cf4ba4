"""The rollout status machine: pending → starting → running → verifying → done | failed | timeout | infra_error."""

from __future__ import annotations

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

_NEXT: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.STARTING, Status.INFRA_ERROR}),
    Status.STARTING: frozenset({Status.RUNNING, Status.PENDING, Status.INFRA_ERROR}),
    Status.RUNNING: frozenset({Status.VERIFYING, Status.TIMEOUT, Status.PENDING, Status.INFRA_ERROR}),
    Status.VERIFYING: frozenset({Status.DONE, Status.FAILED, Status.PENDING, Status.INFRA_ERROR}),
}


def can_move(current: Status, new: Status) -> bool:
    """Whether `current → new` is a legal step (PENDING again means: retry or interrupted)."""
    return new in _NEXT.get(current, frozenset())
