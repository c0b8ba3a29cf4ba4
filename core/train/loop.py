"""The local trainer's loop: per step, rollouts through the real proxy → samples → advantages → update → new weights.

    for step in steps:
        rollouts of the step's tasks (run.n_samples each: a GRPO group), recorded by the proxy
        samples from the store; advantages by veRL's estimator; one optimizer step
        samples + train_steps rows; the new weights go into the built-in backend; checkpoint

Generation is paused during the update simply because a step's rollouts are all finished before
it starts (synchronous, on-policy). A crash leaves the store and the last checkpoint consistent:
`--resume` restarts after the last checkpoint, skips rollouts already finished, rebuilds their
samples from the store and writes only the rows that are missing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from core.backends.base import TokenBackend
from core.backends.spec import build_token_backend
from core.config import (
    GroupSettings,
    InProcessSettings,
    LocalGrpoSettings,
    PolicyLossSettings,
    RunConfig,
    RunTrainingSettings,
    TrainerStateSettings,
    UpdateSettings,
)
from core.env import Task, is_held_out
from core.errors import ConfigError
from core.eval.summary import RunSummary, summarize
from core.paths import runs_dir
from core.proxy.factory import token_policy
from core.session import RunSession, store_rows
from core.status import RunStatus, Tally
from core.train import vllm_sync
from core.train.advantages import compute_advantages, discount_calls, resolve_estimator
from core.train.batches import TaskSchedule
from core.train.checkpoints import last_checkpoint, write_checkpoint
from core.train.dynamic_sampling import informative_groups, plan_refill
from core.train.local import LocalTrainer, trainer_settings
from core.train.lora_push import check_push, push_weights
from core.train.preflight import preflight_session
from core.train.samples import diagnostics, samples_for_run, write_samples
from core.train.tracking import MetricsMirror, train_step_rows
from core.train.trainers import RunHooks
from core.train.types import Sample
from core.train.vision import sample_images

log = logging.getLogger(__name__)

def check_trainable(config: RunConfig) -> None:
    """Refuse, before any rollout starts, a policy the local trainer cannot train (as its backend kind declares)."""
    spec = config.policy.spec
    kind = spec.declared
    if kind.trainable == "no":
        raise ConfigError(f"policy.backend {spec.shown!r}: {kind.why_not_trainable or 'this backend has no weights to train'}")
    # an "adapters" kind (vLLM) also takes full weights, reloaded from a folder: whether its server can is asked once it is built (check_push)


def check_train_tasks(tasks: list[Task]) -> None:
    """Training on held-out tasks would make every eval of them meaningless."""
    held_out = [t for t in tasks if is_held_out(t)]
    if held_out:
        splits = " and ".join(sorted({str(t.meta["split"]) for t in held_out}))
        raise ConfigError(f"{len(held_out)} of the selected tasks are in the {splits} split ({', '.join(t.id for t in held_out[:3])}…): "
                          "train on env.options.split = \"train\"")


SAMPLER_COUNTERS = ("prefill_s", "decode_s", "prefill_tokens", "reused_tokens", "decode_tokens", "drafted_tokens", "accepted_tokens")


def backend_stats(backend: TokenBackend) -> dict[str, float]:
    """The sampling backend's running counters (the built-in backend's prefill and decode time), or none."""
    stats = getattr(backend, "stats", None)
    return stats() if callable(stats) else {}


class LocalTraining:
    """The loop's state: the session, the backend that samples, the trainer that learns, the metrics mirror."""

    def __init__(self, session: RunSession, backend: TokenBackend, trainer: Any) -> None:
        self.session = session
        self.backend = backend
        self.trainer = trainer
        self.config = session.config
        self.mirror = MetricsMirror(session.run_dir / "tensorboard", session.run_id, self.config.model_dump())

    @property
    def store(self) -> Any:
        assert self.session.store is not None
        return self.session.store

    def _existing(self, sql: str, step: int) -> bool:
        return bool(store_rows(self.store, sql, [self.session.run_id, step]))

    async def run_step(self, schedule: TaskSchedule, step: int) -> dict[str, Any]:
        """Rollouts, samples, advantages, one update and the new weights for one step; returns its metrics."""
        session, train = self.session, self.config.train
        batch: list[Task] = []
        more, extra = schedule.batch(step), -1  # the first batch, then dynamic sampling's refills
        target = len(more)  # DAPO: as many groups with signal as the batch has tasks
        sampler = backend_stats(self.backend)
        started = time.perf_counter()
        while more:
            batch += more
            extra += 1
            await session.run_rollouts(session.plan(more, step)[0])
            samples = samples_for_run(self.store, session.run_id, step=step)
            stats = compute_advantages(samples, train.estimator, norm_by_std=train.norm_adv_by_std)
            discount_calls(samples, train.call_discount)
            wanted = plan_refill(stats, target, cap=2 * target).tasks  # sized by the share of groups with signal so far
            refill = self.config.run.n_samples > 1 and extra < train.max_extra_batches and wanted > 0
            more = schedule.refill(step, batch, wanted) if refill else []
        rollout_s = time.perf_counter() - started
        sampler = {k: v - sampler.get(k, 0.0) for k, v in backend_stats(self.backend).items() if k in SAMPLER_COUNTERS}
        started = time.perf_counter()
        if self.trainer.vision is not None:  # a vision-language policy: each sample's pixels, from `blobs`
            await asyncio.to_thread(self._load_images, samples)
        metrics = await asyncio.to_thread(self.trainer.step, samples) if samples else {}
        update_s = time.perf_counter() - started
        started = time.perf_counter()
        await asyncio.to_thread(push_weights, self.trainer, self.backend, self.session.run_dir, step)
        sync_s = time.perf_counter() - started  # the new weights into the sampler (a server's reload or adapter load included)
        metrics = self._step_metrics(step, samples, stats.as_dict(), metrics, rollout_s, update_s)
        metrics["sync_s"] = sync_s
        metrics["extra_batches"] = extra
        metrics["informative_groups"] = informative_groups(stats)  # groups with signal (DAPO's target: the batch's tasks)
        metrics.update(sampler)  # the rollouts' generation split into prefill and decode (built-in backend)
        self._record(step, samples, metrics)
        return metrics

    def _load_images(self, samples: list[Sample]) -> None:
        """Attach each sample's images (bytes from the store's blobs, in prompt order) for the trainer's forward."""
        cursor = self.store.cursor()
        for sample in samples:
            sample.images = sample_images(cursor, sample)

    def _step_metrics(self, step: int, samples: list[Sample], adv: dict[str, Any], update: dict[str, Any], rollout_s: float, update_s: float) -> dict[str, Any]:
        rows = store_rows(self.store, "SELECT status, passed FROM rollouts WHERE run_id = ? AND step = ?", [self.session.run_id, step])
        tally = Tally()  # the project's one outcome rule, as in the run summary
        for status, passed in rows:
            tally.add(status, passed)
        sampled = sum(s.trainable_tokens for s in samples)
        out: dict[str, Any] = {
            **{k: v for k, v in diagnostics(samples).as_dict().items() if isinstance(v, int | float)},
            "loss": float(update.get("loss", 0.0)),
            "reward_mean": adv["mean_reward"],
            "reward_std": adv["std_reward"],
            "pass_rate": tally.passed / tally.scored if tally.scored else 0.0,
            "rollouts": len(rows),
            "infra_errors": tally.infra_error,
            "groups": adv["groups"],
            "zero_variance_groups": adv["zero_variance_groups"],
            "samples": len(samples),
            "samples_trained": sum(1 for s in samples if s.advantage != 0.0),
            "branches": len(samples) - len({s.rollout_id for s in samples}),
            "tokens": sampled,
            "rollout_s": rollout_s,
            "update_s": update_s,
            "tokens_per_s": sampled / rollout_s if rollout_s > 0 else 0.0,
            "weights_version": self.trainer.updates,
        }
        for key, value in update.items():
            if key not in out and isinstance(value, int | float):
                out[key] = float(value)
        out["step"] = step
        return out

    def _record(self, step: int, samples: list[Sample], metrics: dict[str, Any]) -> None:
        """Samples and the train_steps row, each written once even when a resumed run redoes the step."""
        run_id = self.session.run_id
        if not self._existing("SELECT 1 FROM samples WHERE run_id = ? AND step = ? LIMIT 1", step):
            write_samples(self.store, samples)
        if not self._existing("SELECT 1 FROM train_steps WHERE run_id = ? AND step = ?", step):
            rest = {k: v for k, v in metrics.items() if k not in ("step", "loss", "reward_mean")}
            self.store.insert_train_step({"run_id": run_id, "step": step, "loss": metrics["loss"], "reward_mean": metrics["reward_mean"], "metrics": rest})
        self.store.flush()
        self.mirror.write(train_step_rows(self.store.cursor(), run_id, [step]))

    def checkpoint(self, step: int) -> Path:
        return write_checkpoint(self.trainer, self.session.run_dir, step, self.config.train.keep_states)


async def load_for_training(config: RunConfig, run_dir: Path | None) -> tuple[TokenBackend, LocalTrainer, int]:
    """The sampling backend and the trainer (resumed from the run's last checkpoint if any); the first step to run."""
    spec = config.policy.spec
    backend = await asyncio.to_thread(build_token_backend, spec, tokenizer=config.policy.tokenizer)
    source = spec.weights_source(config.policy.tokenizer)  # a served model (vllm): its local copy
    trainer = await asyncio.to_thread(lambda: LocalTrainer(source, tokenizer=backend.tokenizer, **trainer_settings(config.train)))
    await asyncio.to_thread(check_push, trainer, backend)
    found = last_checkpoint(run_dir) if run_dir is not None else None
    if found is None:
        return backend, trainer, 0
    step, folder = found
    await asyncio.to_thread(trainer.load_checkpoint, folder)
    await asyncio.to_thread(push_weights, trainer, backend, folder.parents[1], step)
    log.info("resuming training after step %d from %s", step, folder)
    return backend, trainer, step + 1


class LocalTrainerRun:
    """`train.trainer = "local"`: GRPO on this machine, `train.steps` steps of rollouts through the real harness."""

    name = "local"
    runs_rollouts = True
    settings = (RunTrainingSettings, UpdateSettings, PolicyLossSettings, InProcessSettings, TrainerStateSettings, GroupSettings, LocalGrpoSettings)

    def trains(self, config: RunConfig) -> bool:
        return config.train.steps > 0

    def check(self, config: RunConfig) -> None:
        check_trainable(config)
        resolve_estimator(config.train.estimator, config.train.norm_adv_by_std)  # else a bad name fails after step 0's rollouts

    async def train(self, config: RunConfig, *, resume: str | None, hooks: RunHooks, ks: list[int] | None) -> RunSummary:
        """Train for `train.steps` steps (or resume a run); the summary covers every rollout, plus the training."""
        if resume is not None and not (runs_dir() / resume).is_dir():
            raise ConfigError(f"no run {resume!r} to resume")
        backend, trainer, first = await load_for_training(config, runs_dir() / resume if resume else None)
        # the proxy samples at the trainer's temperature whatever the harness asks: recorded and recomputed logprobs agree
        policy = token_policy(backend, config.policy.spec, parser=config.policy.parser, default_max_tokens=config.policy.max_tokens, temperature=config.train.temperature)
        async with RunSession(config, run_id=resume, resume=resume is not None, policy=policy, on_event=hooks.on_event) as session:
            # a server without token ids or logprobs is refused now, not after a step of rollouts it cannot train on
            await preflight_session(session, backend, config.policy.spec, temperature=config.train.temperature)
            tasks = session.tasks()
            check_train_tasks(tasks)
            train = config.train
            schedule = TaskSchedule(tuple(tasks), train.tasks_per_step, train.seed if train.seed is not None else config.run.seed, train.shuffle, train.stratify_by)
            loop = LocalTraining(session, backend, trainer)
            if hooks.on_start is not None:
                on_start_total = len(schedule.batch(0)) * config.run.n_samples * config.train.steps
                hooks.on_start(session.run_id, on_start_total)
            try:
                last = await self._steps(loop, schedule, first, hooks)
                final = await asyncio.to_thread(loop.checkpoint, config.train.steps - 1)
                vllm_sync.discard_pushed_weights(session.run_dir)
            finally:
                loop.mirror.close()
            assert session.store is not None
            summary = summarize(session.store, session.run_id, session.store_path, ks or list(range(1, config.run.n_samples + 1)))
            summary.extra.update({"train_steps": config.train.steps, "checkpoint": str(final), "last_step": last, "tensorboard": str(session.run_dir / "tensorboard")})
            session.finish(RunStatus.DONE)
            return summary

    async def _steps(self, loop: LocalTraining, schedule: TaskSchedule, first: int, hooks: RunHooks) -> dict[str, Any]:
        """Steps `first` .. `train.steps` - 1, with the periodic checkpoints; the last step's metrics."""
        train = loop.config.train
        last: dict[str, Any] = {}
        for step in range(first, train.steps):
            last = await loop.run_step(schedule, step)
            if hooks.on_step is not None:
                try:
                    hooks.on_step(last)
                except Exception:  # noqa: BLE001 - a progress display must not stop training
                    log.exception("step callback failed")
            log.info("step %d: %s", step, {k: round(v, 4) if isinstance(v, float) else v for k, v in last.items()})
            if train.save_every and (step + 1) % train.save_every == 0 and step + 1 < train.steps:
                await asyncio.to_thread(loop.checkpoint, step)
        return last
