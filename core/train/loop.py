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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.backends.base import TokenBackend
from core.config import RunConfig, TrainConfig
from core.env import Task
from core.errors import ConfigError
from core.proxy.factory import make_token_backend, parse_spec, token_policy
from core.rollout.engine import RolloutEvent
from core.rollout.status import Tally
from core.session import RunSession, store_rows
from core.train import lora_push
from core.train.advantages import compute_advantages
from core.train.preflight import preflight_session
from core.train.samples import diagnostics, samples_for_run, write_samples
from core.train.tracking import MetricsMirror, train_step_rows
from core.train.types import Sample
from core.train.vision import sample_images

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"


def check_trainable(config: RunConfig) -> None:
    """Refuse, before any rollout starts, a config the local trainer cannot train."""
    train = config.train
    if train.trainer == "verl":
        raise ConfigError("train.trainer = verl runs on GPU clusters through veRL's own entry point; the local trainer is train.trainer = local")
    if train.trainer == "sft":
        from core.train.sft import check_sft

        return check_sft(config)
    kind, _, _ = parse_spec(config.policy.backend)
    if kind == "litellm":
        raise ConfigError(f"policy.backend {config.policy.backend!r} is a passthrough: it has no token ids or logprobs to train on; use builtin:MODEL")
    if kind == "scripted":
        raise ConfigError("policy.backend scripted:… replays fixed turns: it has no weights to train; use builtin:MODEL (a scripted policy is a teacher for SFT)")
    if kind == "vllm" and train.lora_rank <= 0:
        raise ConfigError("a vLLM policy trains LoRA adapters: set train.lora_rank (8 or 16, at most the server's --max-lora-rank)")


def check_train_tasks(tasks: list[Task]) -> None:
    """Training on held-out tasks would make every eval of them meaningless."""
    held_out = [t.id for t in tasks if (t.meta or {}).get("split") == "eval"]
    if held_out:
        raise ConfigError(f"{len(held_out)} of the selected tasks are in the eval split ({', '.join(held_out[:3])}…): train on env.options.split = \"train\"")


def tasks_for_step(tasks: list[Task], step: int, per_step: int | None) -> list[Task]:
    """The step's batch: `per_step` tasks, walking the task list round-robin (all tasks when None)."""
    if not per_step or per_step >= len(tasks):
        return list(tasks)
    start = (step * per_step) % len(tasks)
    return [tasks[(start + i) % len(tasks)] for i in range(per_step)]


def extra_tasks(tasks: list[Task], used: list[Task], n: int) -> list[Task]:
    """Up to `n` tasks not yet in this step's batch, in the env's order (dynamic sampling's refill)."""
    taken = {t.id for t in used}
    return [t for t in tasks if t.id not in taken][:n]


def _informative(stats: Any) -> int:
    """Groups whose rewards differ: the only ones that carry a gradient."""
    return stats.groups - stats.zero_variance_groups - stats.singleton_groups


def trainer_settings(train: TrainConfig) -> dict[str, Any]:
    """LocalTrainerConfig fields from the run config's [train] section."""
    return {
        "lr": train.lr,
        "max_grad_norm": train.max_grad_norm,
        "warmup_steps": train.warmup_steps,
        "micro_batch_size": train.micro_batch_size,
        "temperature": train.temperature,
        "policy_loss": train.policy_loss,
        "clip_ratio": train.clip_ratio,
        "loss_agg_mode": train.loss_agg_mode,
        "kl_coef": train.kl_coef,
        "kl_type": train.kl_type,
        "entropy_coef": train.entropy_coef,
        "lora_rank": train.lora_rank,
        "lora_alpha": train.lora_alpha,
        "dtype": train.dtype,
        "seed": train.seed,
    }


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:05d}"


def last_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint of a run, if any."""
    from core.train.local import TRAINER_STATE

    found = sorted(p for p in (run_dir / CHECKPOINTS).glob("step-*") if (p / TRAINER_STATE).exists())
    if not found:
        return None
    return int(found[-1].name.split("-")[1]), found[-1]


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

    async def run_step(self, tasks: list[Task], step: int) -> dict[str, Any]:
        """Rollouts, samples, advantages, one update and the new weights for one step; returns its metrics."""
        session, train = self.session, self.config.train
        batch: list[Task] = []
        more, extra = tasks_for_step(tasks, step, train.tasks_per_step), -1  # the first batch, then dynamic sampling's refills
        started = time.perf_counter()
        while more:
            batch += more
            extra += 1
            await session.run_rollouts(session.plan(more, step)[0])
            samples = samples_for_run(self.store, session.run_id, step=step)
            stats = compute_advantages(samples, train.estimator, norm_by_std=train.norm_adv_by_std)
            missing = len(batch) - _informative(stats)  # one informative group wanted per task run so far
            refill = self.config.run.n_samples > 1 and extra < train.max_extra_batches and missing > 0
            more = extra_tasks(tasks, batch, missing) if refill else []
        rollout_s = time.perf_counter() - started
        started = time.perf_counter()
        if getattr(self.trainer, "vision", None) is not None:  # a vision-language policy: each sample's pixels, from `blobs`
            await asyncio.to_thread(self._load_images, samples)
        metrics = await asyncio.to_thread(self.trainer.step, samples) if samples else {}
        update_s = time.perf_counter() - started
        await asyncio.to_thread(self._push_weights, step)
        metrics = self._step_metrics(step, samples, stats.as_dict(), metrics, rollout_s, update_s)
        metrics["extra_batches"] = extra
        self._record(step, samples, metrics)
        return metrics

    def _load_images(self, samples: list[Sample]) -> None:
        """Attach each sample's images (bytes from the store's blobs, in prompt order) for the trainer's forward."""
        cursor = self.store.cursor()
        for sample in samples:
            sample.images = sample_images(cursor, sample)

    def _push_weights(self, step: int) -> None:
        """The trainer's weights into the sampling backend (between steps: nothing is generating)."""
        if lora_push.takes_adapters(self.backend):
            lora_push.push_adapter(self.trainer, self.backend, self.session.run_dir, step)
            return
        reload = getattr(self.backend, "reload_weights", None)
        if reload is None:
            raise ConfigError(f"backend {self.backend.name} cannot take new weights")
        reload(self.trainer.state_dict_for_backend())
        self.backend.weights_version = self.trainer.updates  # type: ignore[attr-defined]

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
        return self.trainer.save_checkpoint(checkpoint_dir(self.session.run_dir, step))


async def load_for_training(config: RunConfig, run_dir: Path | None) -> tuple[TokenBackend, Any, int]:
    """The sampling backend and the trainer (resumed from the run's last checkpoint if any); the first step to run."""
    from core.train.local import LocalTrainer

    spec = config.policy.backend
    kind, target, opts = parse_spec(spec)
    backend = await asyncio.to_thread(make_token_backend, spec, tokenizer=config.policy.tokenizer)
    source = (config.policy.tokenizer or opts.get("tokenizer")) if kind == "vllm" else target  # vllm: the served model's local copy
    trainer = await asyncio.to_thread(lambda: LocalTrainer(source, tokenizer=backend.tokenizer, **trainer_settings(config.train)))
    found = last_checkpoint(run_dir) if run_dir is not None else None
    if found is None:
        return backend, trainer, 0
    step, folder = found
    await asyncio.to_thread(trainer.load_checkpoint, folder)
    if lora_push.takes_adapters(backend):
        await asyncio.to_thread(lora_push.push_adapter, trainer, backend, folder.parents[1], step)
    else:
        await asyncio.to_thread(lambda: backend.reload_weights(trainer.state_dict_for_backend()))  # type: ignore[attr-defined]
        backend.weights_version = trainer.updates  # type: ignore[attr-defined]
    log.info("resuming training after step %d from %s", step, folder)
    return backend, trainer, step + 1


async def train_run(
    config: RunConfig,
    *,
    resume: str | None = None,
    on_event: Callable[[RolloutEvent], None] | None = None,
    on_start: Callable[[str, int], None] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    ks: list[int] | None = None,
) -> Any:
    """Train for `train.steps` steps (or resume a run); the summary covers every rollout, plus the training."""
    from core.paths import runs_dir
    from core.run import summarize

    if config.train.trainer == "sft":
        from core.train.sft import sft_run

        return await sft_run(config, resume=resume, on_event=on_event, on_start=on_start, ks=ks)
    check_trainable(config)
    if resume is not None and not (runs_dir() / resume).is_dir():
        raise ConfigError(f"no run {resume!r} to resume")
    backend, trainer, first = await load_for_training(config, runs_dir() / resume if resume else None)
    # the proxy samples at the trainer's temperature whatever the harness asks: recorded and recomputed logprobs agree
    policy = token_policy(backend, config.policy.backend, parser=config.policy.parser, default_max_tokens=config.policy.max_tokens, temperature=config.train.temperature)
    async with RunSession(config, run_id=resume, resume=resume is not None, policy=policy, on_event=on_event) as session:
        # a server without token ids or logprobs is refused now, not after a step of rollouts it cannot train on
        await preflight_session(session, backend, config.policy.backend, temperature=config.train.temperature)
        tasks = session.tasks()
        check_train_tasks(tasks)
        loop = LocalTraining(session, backend, trainer)
        per_step = len(tasks_for_step(tasks, 0, config.train.tasks_per_step)) * config.run.n_samples
        if on_start is not None:
            on_start(session.run_id, per_step * config.train.steps)
        last: dict[str, Any] = {}
        try:
            for step in range(first, config.train.steps):
                last = await loop.run_step(tasks, step)
                if on_step is not None:
                    try:
                        on_step(last)
                    except Exception:  # noqa: BLE001 - a progress display must not stop training
                        log.exception("step callback failed")
                log.info("step %d: %s", step, {k: round(v, 4) if isinstance(v, float) else v for k, v in last.items()})
                if config.train.save_every and (step + 1) % config.train.save_every == 0 and step + 1 < config.train.steps:
                    await asyncio.to_thread(loop.checkpoint, step)
            final = await asyncio.to_thread(loop.checkpoint, config.train.steps - 1)
        finally:
            loop.mirror.close()
        summary = summarize(session.store, session.run_id, session.store_path, ks or list(range(1, config.run.n_samples + 1)))  # type: ignore[arg-type]
        summary.extra.update({"train_steps": config.train.steps, "checkpoint": str(final), "last_step": last, "tensorboard": str(session.run_dir / "tensorboard")})
        session.finish("done")
        return summary
