"""A run's outcome from its store: counts, mean reward, pass@k and pass^k, and the eval report files."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.eval.report import build_report, pass_metrics, report_rows, write_plot
from core.secrets import redact_text
from core.status import Outcome, RunStatus, Tally
from core.store.writer import Store

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_id: str
    rollouts: int
    passed: int
    failed: int
    timeouts: int
    infra_errors: int
    mean_reward: float | None
    pass_at_k: dict[str, float]
    pass_hat_k: dict[str, float]
    store: str
    status: str = RunStatus.DONE
    below_threshold: int = 0  # `failed` split: the harness finished under the threshold ...
    harness_failed: int = 0  # ... or the harness itself failed
    extra: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None  # the eval report (also written to eval.json), not part of the JSON summary

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("extra", "report")}
        out.update(self.extra)
        return out


def summarize(store: Store, run_id: str, store_path: Path, ks: list[int] | None = None, *, step: int | None = None) -> RunSummary:
    """Counts, mean reward, pass@k and pass^k from the store (infra errors excluded from the metrics)."""
    store.flush()
    sql = "SELECT task_id, status, reward, passed FROM rollouts WHERE run_id = ?" + (" AND step = ?" if step is not None else "")
    rows = store.cursor().execute(sql, [run_id] + ([step] if step is not None else [])).fetchall()
    per_task: dict[str, list[bool]] = {}
    rewards: list[float] = []
    tally = Tally()
    for task_id, status, reward, passed in rows:
        outcome = tally.add(status, passed)
        if outcome is None or outcome == Outcome.INFRA_ERROR:
            continue
        rewards.append(float(reward or 0.0))
        per_task.setdefault(task_id, []).append(outcome == Outcome.PASSED)
    max_n = max((len(v) for v in per_task.values()), default=0)
    metrics = pass_metrics(per_task, rewards, ks or range(1, max_n + 1))
    return RunSummary(
        run_id=run_id,
        rollouts=len(rows),
        mean_reward=metrics["mean_score"],
        pass_at_k=metrics["pass_at_k"],
        pass_hat_k=metrics["pass_hat_k"],
        store=str(store_path),
        passed=tally.passed,
        failed=tally.failed,
        below_threshold=tally.below_threshold,
        harness_failed=tally.harness_failed,
        timeouts=tally.timeout,
        infra_errors=tally.infra_error,
    )


def write_eval_report(store: Store, run_id: str, run_dir: Path, summary: RunSummary, policy_backend: str, *, model: str | None = None) -> dict[str, Any]:
    """eval.json (per env × harness × model, with level/domain breakdowns) and eval.png in the run folder."""
    ks = [int(k) for k in summary.pass_at_k] or [1]
    report = build_report(report_rows(store, run_id), ks, model=model or redact_text(policy_backend))
    report["run_id"] = run_id
    summary.report = report
    out = {"eval_json": str(run_dir / "eval.json")}
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2))
    try:
        out["eval_plot"] = str(write_plot(report, run_dir / "eval.png"))
    except Exception:  # noqa: BLE001 - a missing plot must not fail the run
        log.warning("could not draw the eval plot", exc_info=True)
    return out
