"""Behaviour metrics per group of rollouts, with bootstrap intervals: what `forgetui analyze` and the TUI show.

The per-rollout values come from the store's `rollout_behaviour` view (definitions inlined, so any
store answers); this module only groups them and puts an interval around each mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.analytics.stats import Estimate, bootstrap_mean
from core.errors import ConfigError, StoreError
from core.status import SCORED_SQL
from core.store.behaviour import with_views
from core.store.locate import stores_of
from core.store.query import run_query
from core.store.shard_query import run_query_shards

GROUPINGS: dict[str | None, tuple[str, ...]] = {
    None: ("run_id", "env", "harness", "model", "step"),
    "harness": ("env", "harness"),
    "model": ("env", "model"),
    "step": ("env", "step"),
}


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    column: str
    where: str | None = None  # a boolean column: only rows where it is true count (recovery: rollouts with an error)


METRICS: tuple[Metric, ...] = (
    Metric("pass_rate", "pass rate", "passed"),
    Metric("reward", "reward", "reward"),
    Metric("coverage", "tool class coverage", "coverage"),
    Metric("tool_calls", "tool calls", "tool_calls"),
    Metric("malformed_calls", "malformed calls", "malformed_calls"),
    Metric("verify_rate", "verified after last write", "verified"),
    Metric("tool_error_rate", "rollouts with a failed tool call", "had_tool_error"),
    Metric("recovery_rate", "passed despite a failed tool call", "passed", where="had_tool_error"),
    Metric("plan_completion", "plan completion", "plan_completion"),
    Metric("turns", "turns", "turns"),
    Metric("sampled_tokens", "sampled tokens", "sampled_tokens"),
    Metric("prompt_tokens", "prompt tokens", "prompt_tokens"),
    Metric("wall_s", "wall time (s)", "wall_s"),
    Metric("context_growth", "context growth / turn", "context_growth"),
    Metric("branches", "branches", "branches"),
)
METRIC_KEYS = tuple(m.key for m in METRICS)


def query(run: str | Path, sql: str, params_note: str = "") -> list[dict[str, Any]]:
    """Rows of a read-only query on a run (see `stores_of`) with the behaviour views inlined, as dicts."""
    stores = stores_of(run)
    try:
        result = run_query(stores[0], with_views(sql)) if len(stores) == 1 else run_query_shards(stores, with_views(sql))
    except StoreError as exc:
        raise StoreError(f"behaviour query on {run}{params_note} failed: {exc}") from exc
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def rollout_rows(runs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """`rollout_behaviour` rows of the scored rollouts of every run, in run order."""
    out: list[dict[str, Any]] = []
    for run in runs:
        out.extend(query(run, f"SELECT * FROM rollout_behaviour WHERE status IN {SCORED_SQL} ORDER BY rollout_id"))
    return out


def metric_values(rows: list[dict[str, Any]], metric: Metric) -> list[float]:
    """The metric's per-rollout values (booleans as 0/1; NULLs and filtered rows left out)."""
    out = []
    for row in rows:
        if metric.where is not None and not row.get(metric.where):
            continue
        value = row.get(metric.column)
        if value is None:
            continue
        out.append(float(value))
    return out


def summarize(rows: list[dict[str, Any]], seed: int = 0) -> dict[str, Estimate]:
    """Every metric's mean over `rows` with its bootstrap interval."""
    return {m.key: bootstrap_mean(metric_values(rows, m), seed=seed) for m in METRICS}


def group_rows(rows: list[dict[str, Any]], by: str | None = None) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Rows grouped by env × harness × model × step and run (default), or by env × `by`."""
    if by not in GROUPINGS:
        raise ConfigError(f"--by must be one of harness, model, step (or nothing), not {by!r}")
    keys = GROUPINGS[by]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


def behaviour_table(runs: Iterable[str | Path], by: str | None = None) -> list[dict[str, Any]]:
    """One row per group: its keys, `rollouts`, and per metric {value, low, high, n} (the TUI's run screen table)."""
    rows = rollout_rows(runs)
    keys = GROUPINGS[by] if by in GROUPINGS else ()
    out = []
    for key, members in group_rows(rows, by).items():
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row["rollouts"] = len(members)
        row.update({k: est.to_dict() for k, est in summarize(members).items()})
        out.append(row)
    return out


def tool_usage(runs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Calls per tool (the `tool_usage` view) of every run."""
    out: list[dict[str, Any]] = []
    for run in runs:
        out.extend(query(run, "SELECT * FROM tool_usage ORDER BY run_id, harness, calls DESC, tool"))
    return out


def display_rows(table: list[dict[str, Any]], by: str | None = None) -> tuple[list[str], list[list[str]]]:
    """`behaviour_table`'s rows as text, metrics down and groups across: (header, rows) for a table widget."""
    keys = GROUPINGS[by]
    header = ["metric (mean [95% CI])"] + [" · ".join(str(row[k]) for k in keys) + f" (n={row['rollouts']})" for row in table]
    return header, [[m.label] + [format_estimate(row[m.key]) for row in table] for m in METRICS]


def format_estimate(est: dict[str, Any] | Estimate, digits: int = 2) -> str:
    """`0.50 [0.25, 0.75]`, `0.50` without an interval, `-` without a value."""
    d = est.to_dict() if isinstance(est, Estimate) else est
    if d.get("value") is None:
        return "-"
    text = f"{d['value']:.{digits}f}"
    if d.get("low") is not None and d.get("high") is not None:
        text += f" [{d['low']:.{digits}f}, {d['high']:.{digits}f}]"
    return text
