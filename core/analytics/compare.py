"""Two runs side by side: per task pass rate and reward, flipped tasks, pass@k / pass^k and behaviour deltas.

Every interval is a paired bootstrap over the tasks both runs ran (a task's A and B values are
resampled together), so a difference reads as "B − A on the same tasks".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.analytics.metrics import METRICS, metric_values, rollout_rows
from core.analytics.stats import paired_bootstrap
from core.eval.passk import pass_at_k, pass_hat_k

FLIP_AT = 0.5  # a task counts as solved by a run when at least half its rollouts passed


def _task_key(row: dict[str, Any]) -> str:
    return f"{row['env']}:{row['task_id']}"


def _by_task(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(_task_key(row), []).append(row)
    return out


def _side(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    passed = sum(1 for r in rows if r["passed"])
    return {"n": n, "passed": passed, "pass_rate": passed / n if n else None, "reward": sum(float(r["reward"] or 0.0) for r in rows) / n if n else None}


def _pass_stat(kind: str, k: int):  # noqa: ANN202 - a statistic for paired_bootstrap
    fn = pass_at_k if kind == "pass@k" else pass_hat_k

    def stat(outcomes: list[float]) -> float | None:
        return fn(len(outcomes), int(sum(outcomes)), k) if len(outcomes) >= k else None

    return stat


def _mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def compare_runs(run_a: str | Path, run_b: str | Path, ks: list[int] | None = None, *, seed: int = 0) -> dict[str, Any]:
    """The comparison of run B against run A (A is the baseline), as plain data."""
    a, b = _by_task(rollout_rows([run_a])), _by_task(rollout_rows([run_b]))
    common = sorted(set(a) & set(b))
    tasks = []
    for key in common:
        sa, sb = _side(a[key]), _side(b[key])
        solved_a, solved_b = sa["pass_rate"] >= FLIP_AT, sb["pass_rate"] >= FLIP_AT
        flip = None if solved_a == solved_b else ("fixed" if solved_b else "broken")
        tasks.append({"task": key, "a": sa, "b": sb, "delta_pass_rate": sb["pass_rate"] - sa["pass_rate"], "delta_reward": sb["reward"] - sa["reward"], "flip": flip})
    passed_a = {k: [1.0 if r["passed"] else 0.0 for r in a[k]] for k in common}
    passed_b = {k: [1.0 if r["passed"] else 0.0 for r in b[k]] for k in common}
    max_k = min((min(len(passed_a[k]), len(passed_b[k])) for k in common), default=0)
    pass_k = []
    for k in ks or list(range(1, max_k + 1)):
        for kind in ("pass@k", "pass^k"):
            est = paired_bootstrap(passed_a, passed_b, _pass_stat(kind, k), seed=seed)
            pass_k.append({"metric": kind.replace("k", str(k)), "k": k, **{side: e.to_dict() for side, e in est.items()}})
    deltas = []
    for metric in METRICS:
        va = {k: metric_values(a[k], metric) for k in common}
        vb = {k: metric_values(b[k], metric) for k in common}
        est = paired_bootstrap(va, vb, _mean_or_none, seed=seed)
        deltas.append({"metric": metric.key, "label": metric.label, **{side: e.to_dict() for side, e in est.items()}})
    return {
        "run_a": str(run_a),
        "run_b": str(run_b),
        "tasks": tasks,
        "flipped": [t for t in tasks if t["flip"]],
        "only_a": sorted(set(a) - set(b)),
        "only_b": sorted(set(b) - set(a)),
        "pass_k": pass_k,
        "metrics": deltas,
    }
