"""A run: evaluate a config's tasks (or train on them: core.train.loop) and summarize it from the store."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import RunConfig
from core.eval_report import pass_metrics
from core.rollout.engine import RolloutEvent
from core.rollout.status import Outcome, Tally
from core.run_setup import build_image, load_run_config, pick_runtime
from core.secrets import redact_text
from core.session import RunSession
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
    status: str = "done"
    below_threshold: int = 0  # `failed` split: the harness finished under the threshold ...
    harness_failed: int = 0  # ... or the harness itself failed
    extra: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None  # the eval report (also written to eval.json), not part of the JSON summary

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("extra", "report")}
        out.update(self.extra)
        return out


async def execute_run(
    config: RunConfig,
    *,
    resume: str | None = None,
    on_event: Callable[[RolloutEvent], None] | None = None,
    on_start: Callable[[str, int], None] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    ks: list[int] | None = None,
) -> RunSummary:
    """Run (or resume) a config: every rollout of an eval, or `train.steps` training steps; summarized from the store.

    `on_step` gets each training step's metrics (the `train_steps` row) as it is written.
    """
    if config.train.steps or config.train.trainer == "sft":  # SFT runs no rollouts: it learns from earlier runs
        from core.train.loop import train_run

        return await train_run(config, resume=resume, on_event=on_event, on_start=on_start, on_step=on_step, ks=ks)
    async with RunSession(config, run_id=resume, resume=resume is not None, on_event=on_event) as session:
        items, done = session.plan(session.tasks(), step=0)
        if on_start is not None:
            on_start(session.run_id, len(items) + done)
        await session.run_rollouts(items)
        assert session.store is not None
        summary = summarize(session.store, session.run_id, session.store_path, ks or list(range(1, config.run.n_samples + 1)))
        summary.extra["max_concurrent_sandboxes"] = session.max_concurrent_sandboxes
        problems = {k: v for k, v in session.store.problem_counts().items() if v}
        if problems:  # rows kept as bytes or errors rather than lost: say so where the user looks
            summary.extra["store_problems"] = problems
            log.warning("the store kept %s row(s) it could not store as given (query store_problems)", problems)
        summary.extra.update(write_eval_report(session.store, session.run_id, session.run_dir, summary, config, model=session.model_name))
        session.finish("done")
        return summary


def write_eval_report(store: Store, run_id: str, run_dir: Path, summary: RunSummary, config: RunConfig, *, model: str | None = None) -> dict[str, Any]:
    """eval.json (per env × harness × model, with level/domain breakdowns) and eval.png in the run folder."""
    from core.eval_report import build_report, report_rows, write_plot

    ks = [int(k) for k in summary.pass_at_k] or [1]
    report = build_report(report_rows(store, run_id), ks, model=model or redact_text(config.policy.backend))
    report["run_id"] = run_id
    summary.report = report
    out = {"eval_json": str(run_dir / "eval.json")}
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2))
    try:
        out["eval_plot"] = str(write_plot(report, run_dir / "eval.png"))
    except Exception:  # noqa: BLE001 - a missing plot must not fail the run
        log.warning("could not draw the eval plot", exc_info=True)
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


__all__ = ["RunSummary", "build_image", "execute_run", "load_run_config", "pick_runtime", "summarize"]
