"""A run: evaluate a config's tasks, or hand them to the config's trainer (core.train.trainers); summarized from the store."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from core.config import RunConfig
from core.eval.summary import RunSummary, summarize, write_eval_report
from core.rollout.engine import RolloutEvent
from core.session import RunSession
from core.status import RunStatus
from core.train.trainers import RunHooks, trainer_for

log = logging.getLogger(__name__)


async def execute_run(
    config: RunConfig,
    *,
    resume: str | None = None,
    on_event: Callable[[RolloutEvent], None] | None = None,
    on_start: Callable[[str, int], None] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    ks: list[int] | None = None,
    trainer_options: Mapping[str, Any] | None = None,
) -> RunSummary:
    """Run (or resume) a config: every rollout of an eval, or training by the config's trainer; summarized from the store.

    `on_step` gets each training step's metrics (the `train_steps` row) as it is written; `trainer_options` go to
    the trainer (veRL's cluster options).
    """
    hooks = RunHooks(on_event=on_event, on_start=on_start, on_step=on_step)
    trainer = trainer_for(config, trainer_options)
    if trainer.trains(config):
        trainer.check(config)  # refused before anything runs
        return await trainer.train(config, resume=resume, hooks=hooks, ks=ks)
    return await evaluate(config, resume=resume, hooks=hooks, ks=ks)


async def evaluate(config: RunConfig, *, resume: str | None, hooks: RunHooks, ks: list[int] | None) -> RunSummary:
    """Every rollout of the config's tasks (the rest of them on resume), scored and summarized with its eval report."""
    async with RunSession(config, run_id=resume, resume=resume is not None, on_event=hooks.on_event) as session:
        items, done = session.plan(session.tasks(), step=0)
        if hooks.on_start is not None:
            hooks.on_start(session.run_id, len(items) + done)
        await session.run_rollouts(items)
        assert session.store is not None
        summary = summarize(session.store, session.run_id, session.store_path, ks or list(range(1, config.run.n_samples + 1)))
        summary.extra["max_concurrent_sandboxes"] = session.max_concurrent_sandboxes
        problems = {k: v for k, v in session.store.problem_counts().items() if v}
        if problems:  # rows kept as bytes or errors rather than lost: say so where the user looks
            summary.extra["store_problems"] = problems
            log.warning("the store kept %s row(s) it could not store as given (query store_problems)", problems)
        summary.extra.update(write_eval_report(session.store, session.run_id, session.run_dir, summary, config.policy.backend, model=session.model_name))
        session.finish(RunStatus.DONE)
        return summary
