"""Checkpoint selection by a held-out signal: keep the GRPO checkpoint whose pass rate on a validation split is best.

The learning benchmark scores a checkpoint every few GRPO steps on the toy env's `eval` split (train's
templates, held-out parameters) and keeps the best; `eval-phrasing`, the split the result is reported
on, never takes part in choosing. With `patience`, scoring stops once that many scores in a row
failed to beat the best by `min_delta` (early stopping).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Candidate:
    """One scored checkpoint."""

    step: int
    path: str
    score: float


@dataclass
class BestCheckpoint:
    """The best checkpoint so far by score; a tie keeps the earlier one (less drift from the start for the same score)."""

    min_delta: float = 0.0
    patience: int | None = None
    seen: list[Candidate] = field(default_factory=list)
    best: Candidate | None = None
    since_best: int = 0

    def offer(self, step: int, path: str, score: float) -> bool:
        """Record a scored checkpoint; True when it is the new best."""
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"a pass rate is in [0, 1], not {score}")
        candidate = Candidate(step, path, score)
        self.seen.append(candidate)
        if self.best is None or score > self.best.score + self.min_delta:
            self.best, self.since_best = candidate, 0
            return True
        self.since_best += 1
        return False

    @property
    def stop(self) -> bool:
        """Whether `patience` scores in a row have not improved on the best."""
        return self.patience is not None and self.since_best >= self.patience

    def as_dict(self) -> dict[str, object]:
        """Every score and the choice, for the result's JSON."""
        return {"scores": [{"step": c.step, "path": c.path, "pass_rate": c.score} for c in self.seen],
                "best_step": None if self.best is None else self.best.step,
                "best_path": None if self.best is None else self.best.path}
