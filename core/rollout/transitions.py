"""The rollout status machine: which moves between statuses are legal (the vocabulary itself is `core.status`)."""

from __future__ import annotations

from core.status import Status

_NEXT: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.STARTING, Status.INFRA_ERROR}),
    Status.STARTING: frozenset({Status.RUNNING, Status.PENDING, Status.INFRA_ERROR}),
    Status.RUNNING: frozenset({Status.VERIFYING, Status.TIMEOUT, Status.PENDING, Status.INFRA_ERROR}),
    Status.VERIFYING: frozenset({Status.DONE, Status.FAILED, Status.PENDING, Status.INFRA_ERROR}),
}


def can_move(current: Status, new: Status) -> bool:
    """Whether `current → new` is a legal step (PENDING again means: retry or interrupted)."""
    return new in _NEXT.get(current, frozenset())
