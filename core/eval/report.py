"""Evaluation reports: pass@k, pass^k and mean score per env × harness × model, broken down by level/domain."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.eval.passk import pass_at_k, pass_hat_k
from core.status import Outcome, Tally, outcome_of

BREAKDOWN_KEYS = ("level", "domain", "family", "split", "category", "difficulty", "tags")


def breakdown_values(task_meta: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """(key, value) pairs a task counts under: its meta's breakdown keys, and those of a nested
    `metadata` table (harbor's task.toml); a list (tags) counts the task once under each item."""
    nested = task_meta.get("metadata") if isinstance(task_meta.get("metadata"), dict) else {}
    for key in BREAKDOWN_KEYS:
        value = task_meta.get(key, nested.get(key))
        if value is None:
            continue
        for item in dict.fromkeys(value) if isinstance(value, list | tuple) else (value,):
            yield key, str(item)


def pass_metrics(per_task: dict[str, list[bool]], scores: list[float], ks: Iterable[int]) -> dict[str, Any]:
    """Tasks, samples, mean score, and pass@k / pass^k averaged over the tasks with at least k samples."""
    out: dict[str, Any] = {"tasks": len(per_task), "samples": sum(len(v) for v in per_task.values())}
    out["mean_score"] = sum(scores) / len(scores) if scores else None
    out["pass_at_k"], out["pass_hat_k"] = {}, {}
    for k in ks:
        eligible = [v for v in per_task.values() if len(v) >= k]
        if eligible:
            out["pass_at_k"][str(k)] = sum(pass_at_k(len(v), sum(v), k) for v in eligible) / len(eligible)
            out["pass_hat_k"][str(k)] = sum(pass_hat_k(len(v), sum(v), k) for v in eligible) / len(eligible)
    return out


def build_report(rows: list[dict[str, Any]], ks: list[int], model: str) -> dict[str, Any]:
    """`rows`: rollouts (task_id, env, harness, status, reward, passed, meta). Infra errors are excluded and counted."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["env"], row["harness"])].append(row)
    report: dict[str, Any] = {"ks": ks, "groups": []}
    for (env, harness), members in sorted(groups.items()):
        counted = [r for r in members if outcome_of(r["status"], r["passed"]) not in (None, Outcome.INFRA_ERROR)]
        per_task: dict[str, list[bool]] = defaultdict(list)
        scores: list[float] = []
        by: dict[str, dict[str, tuple[dict[str, list[bool]], list[float]]]] = defaultdict(dict)
        for r in counted:
            ok = outcome_of(r["status"], r["passed"]) == Outcome.PASSED
            per_task[r["task_id"]].append(ok)
            scores.append(float(r["reward"] or 0.0))
            task_meta = ((r.get("meta") or {}).get("task_meta") or {}) if isinstance(r.get("meta"), dict) else {}
            for key, value in breakdown_values(task_meta):
                tasks, vals = by[key].setdefault(value, (defaultdict(list), []))
                tasks[r["task_id"]].append(ok)
                vals.append(float(r["reward"] or 0.0))
        tally = Tally()
        for r in members:
            tally.add(r["status"], r["passed"])
        group = {"env": env, "harness": harness, "model": model, **pass_metrics(per_task, scores, ks)}
        group["below_threshold"] = tally.below_threshold
        group["harness_failed"] = tally.harness_failed
        group["timeouts"] = tally.timeout
        group["infra_errors"] = tally.infra_error
        group["unfinished"] = len(members) - tally.finished
        group["breakdown"] = {key: {value: pass_metrics(t, v, ks) for value, (t, v) in sorted(values.items())} for key, values in by.items()}
        report["groups"].append(group)
    return report


def report_rows(store: Any, run_id: str) -> list[dict[str, Any]]:
    """The rollouts of a run as dicts (store: a writer `Store`), meta parsed."""
    store.flush()
    result = store.handle_query(f"SELECT task_id, env, harness, status, reward, passed, meta FROM rollouts WHERE run_id = '{run_id}'")
    rows = [dict(zip(result["columns"], r, strict=True)) for r in result["rows"]]
    for row in rows:
        if isinstance(row.get("meta"), str):
            row["meta"] = json.loads(row["meta"])
    return rows


def write_plot(report: dict[str, Any], path: Path) -> Path:
    """pass@k and pass^k against k, one line pair per env × harness group."""
    # a bare Figure on the Agg canvas: pyplot's backend machinery adds ~0.3 s to every run's end
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for group in report["groups"]:
        label = f"{group['env']} × {group['harness']}"
        ks = sorted(int(k) for k in group["pass_at_k"])
        if not ks:
            continue
        ax.plot(ks, [group["pass_at_k"][str(k)] for k in ks], marker="o", label=f"pass@k {label}")
        ax.plot(ks, [group["pass_hat_k"][str(k)] for k in ks], marker="s", linestyle="--", label=f"pass^k {label}")
    all_ks = sorted({int(k) for g in report["groups"] for k in g["pass_at_k"]})
    if all_ks:
        ax.set_xticks(all_ks)
    ax.set_xlabel("k")
    ax.set_ylabel("probability")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"model: {report['groups'][0]['model'] if report['groups'] else '-'}")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no scored rollouts", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    return path
