"""Success metrics over repeated attempts: unbiased pass@k, pass^k, and per-run summaries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def _check(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or k < 0:
        raise ValueError(f"n, c and k must be non-negative (got n={n}, c={c}, k={k})")
    if c > n:
        raise ValueError(f"more successes than attempts (c={c} > n={n})")
    if k > n:
        raise ValueError(f"k={k} needs at least k attempts per task, got n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): P(at least one of k attempts drawn from n passes).

    ``1 - C(n-c, k) / C(n, k)`` computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (no huge binomials).
    """
    _check(n, c, k)
    if k == 0:
        return 0.0
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: P(all k attempts drawn from n pass) = ``C(c, k) / C(n, k)``."""
    _check(n, c, k)
    if c < k:
        return 0.0
    prod = 1.0
    for i in range(k):
        prod *= (c - i) / (n - i)
    return prod


def mean(values: Iterable[float]) -> float | None:
    """The arithmetic mean, or None for no values."""
    items = [float(v) for v in values]
    return sum(items) / len(items) if items else None


def summarize(per_task: Mapping[str, Sequence[bool]], ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """Average pass@k and pass^k over the tasks with at least k attempts.

    Returns ``{"tasks", "attempts", "mean" (per-task success rate, averaged), "ks" (computable),
    "skipped_ks" (no task has k attempts), "per_k": {k: {"pass@k", "pass^k", "tasks"}}}``.
    """
    rates = [sum(map(bool, r)) / len(r) for r in per_task.values() if len(r) > 0]
    out: dict[str, Any] = {
        "tasks": len(per_task),
        "attempts": sum(len(r) for r in per_task.values()),
        "mean": mean(rates),
        "ks": [],
        "skipped_ks": [],
        "per_k": {},
    }
    for k in sorted(set(ks)):
        if k < 1:
            raise ValueError(f"k must be at least 1 (got {k})")
        eligible = [(len(r), sum(map(bool, r))) for r in per_task.values() if len(r) >= k]
        if not eligible:
            out["skipped_ks"].append(k)
            continue
        out["ks"].append(k)
        out["per_k"][k] = {
            "pass@k": mean(pass_at_k(n, c, k) for n, c in eligible),
            "pass^k": mean(pass_hat_k(n, c, k) for n, c in eligible),
            "tasks": len(eligible),
        }
    return out
