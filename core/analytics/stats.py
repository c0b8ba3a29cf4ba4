"""Confidence intervals by bootstrap: a mean's, and a paired difference's (tasks resampled together)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

RESAMPLES = 2000
LEVEL = 0.95
MIN_N = 2  # fewer values than this: no interval, just the estimate


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap interval (None where n is too small for one)."""

    value: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0

    def to_dict(self) -> dict[str, float | int | None]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _interval(stats: list[float], level: float) -> tuple[float, float]:
    stats.sort()
    tail = (1.0 - level) / 2.0
    lo = stats[int(tail * (len(stats) - 1))]
    hi = stats[int(round((1.0 - tail) * (len(stats) - 1)))]
    return lo, hi


def bootstrap_mean(values: Sequence[float | None], *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> Estimate:
    """The mean of the non-null values with a percentile bootstrap interval (seeded: the same data, the same CI)."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return Estimate(None, n=0)
    point = _mean(xs)
    if len(xs) < MIN_N:
        return Estimate(point, n=len(xs))
    rng = random.Random(seed)
    k = len(xs)
    stats = [_mean([xs[rng.randrange(k)] for _ in range(k)]) for _ in range(resamples)]
    lo, hi = _interval(stats, level)
    return Estimate(point, lo, hi, k)


def paired_bootstrap(
    a: dict[str, list[float]],
    b: dict[str, list[float]],
    statistic: Callable[[list[float]], float | None],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> dict[str, Estimate]:
    """`statistic` per task in A and in B, averaged over the tasks both have; the tasks are resampled as pairs.

    Returns estimates for "a", "b" and "delta" (B − A), each over the same resampled task sets.
    """
    pairs = []
    for task in sorted(set(a) & set(b)):
        sa, sb = statistic(a[task]), statistic(b[task])
        if sa is not None and sb is not None:
            pairs.append((sa, sb))
    if not pairs:
        return {k: Estimate(None) for k in ("a", "b", "delta")}
    n = len(pairs)
    point = {"a": _mean([p[0] for p in pairs]), "b": _mean([p[1] for p in pairs])}
    point["delta"] = point["b"] - point["a"]
    if n < MIN_N:
        return {k: Estimate(v, n=n) for k, v in point.items()}
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {"a": [], "b": [], "delta": []}
    for _ in range(resamples):
        pick = [pairs[rng.randrange(n)] for _ in range(n)]
        ma, mb = _mean([p[0] for p in pick]), _mean([p[1] for p in pick])
        draws["a"].append(ma)
        draws["b"].append(mb)
        draws["delta"].append(mb - ma)
    return {k: Estimate(point[k], *_interval(draws[k], level), n) for k in point}
