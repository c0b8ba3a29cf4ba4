"""SFT on a teacher's trajectories: the passing rollouts of earlier runs → masked-NLL fine-tuning of the policy.

The teacher is whatever backend recorded `train.from_runs` (a scripted policy, a big model through
`litellm:`, an earlier student). Each teacher run's passing rollouts (reward ≥ `train.min_reward`)
become examples in one of two ways, chosen per run (`example_path` says which):

* **token-exact** — the run's calls carry prompt/completion token ids and logprobs (a token
  backend: builtin, scripted, vllm) *and* the teacher's tokenizer is the student's (same model
  folder, or the same vocabulary, special tokens and chat template). The samples are exactly
  `samples_for_run`'s: the recorded ids, loss mask 1 on the tokens the teacher sampled.
* **re-tokenized** — otherwise (text-only passthrough calls, or a different tokenizer): every ok
  call's recorded request is parsed by its wire protocol (chat, responses, messages, gemini) into
  canonical messages + tools, the response into the assistant message it carried, and both are
  rendered with the STUDENT's chat template; loss mask 1 on the assistant turn's tokens (through
  its end-of-turn token). Calls whose re-rendered prompt extends an earlier one merge into one
  sample, as recorded calls do.

Training: `train.epochs` passes over the examples, shuffled per epoch (seeded), one optimizer step
per `train.micro_batch_size` examples (`LocalTrainer.sft_step`: token-mean NLL over loss-mask-1
tokens). No rollout runs. The run's store gets the examples (`samples`, advantage 1 = weight),
one `train_steps` row per optimizer step, and checkpoints go to `checkpoints/step-NNNNN` like the
GRPO loop's (`builtin:PATH` loads them; `--resume` continues after the last one).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from core.backends.spec import spec_or_none
from core.config import (
    InProcessSettings,
    RunConfig,
    RunTrainingSettings,
    SftSettings,
    TrainerStateSettings,
    UpdateSettings,
    dump_toml,
)
from core.errors import ConfigError, ModelError, TrainingDataError
from core.eval.summary import RunSummary
from core.models.resolve import load_tokenizer, resolve_model
from core.paths import runs_dir
from core.rollout.orphans import remove_pid_file, write_pid_file
from core.rollout.recorded import answer_message, json_value, recorded_calls, request_chat
from core.session.setup import new_run_id
from core.status import RunStatus
from core.store.writer import Store
from core.tokens.template import encode, render_chat
from core.train.checkpoints import last_checkpoint, write_checkpoint
from core.train.local import LocalTrainer, trainer_settings
from core.train.samples import TRAINABLE_STATUSES, build_samples, samples_for_run, write_samples
from core.train.tracking import MetricsMirror, train_step_rows
from core.train.trainers import RunHooks
from core.train.types import Sample

log = logging.getLogger(__name__)

TOKEN_EXACT = "token-exact"
RETOKENIZED = "re-tokenized"


# ----------------------------------------------------------------------------- teacher runs
@dataclass
class TeacherRun:
    """One earlier run: its id, its store file and its recorded config."""

    run_id: str
    store: Path
    config: dict[str, Any] = field(default_factory=dict)


def connect(store: Path) -> duckdb.DuckDBPyConnection:
    """The store opened read-only; ConfigError when a live run or proxy still holds it."""
    try:
        return duckdb.connect(str(store), read_only=True)
    except duckdb.Error as exc:
        if "lock" in str(exc).lower():
            raise ConfigError(
                f"store {store} is still being written by another process (a run or proxy): let it finish first"
            ) from None
        raise ConfigError(f"cannot read store {store}: {exc}") from None


def teacher_runs(names: Sequence[str]) -> list[TeacherRun]:
    """Each name: a run id under FORGETUI_HOME/runs, or the path of a store.duckdb (every run it holds)."""
    if not names:
        raise ConfigError(
            "train.trainer = sft needs train.from_runs: the run ids (or store.duckdb paths) whose passing rollouts to learn from"
        )
    out: list[TeacherRun] = []
    for name in names:
        path = Path(name).expanduser()
        if path.is_file():
            store, wanted = path, None
        elif (runs_dir() / name / "store.duckdb").is_file():
            store, wanted = runs_dir() / name / "store.duckdb", name
        elif path.is_dir() and (path / "store.duckdb").is_file():
            store, wanted = path / "store.duckdb", None
        else:
            raise ConfigError(
                f"train.from_runs: no run {name!r} (no {runs_dir() / name / 'store.duckdb'}) and no store file at that path"
            )
        con = connect(store)
        try:
            rows = con.execute("SELECT run_id, config FROM runs ORDER BY created_at").fetchall()
        except duckdb.Error as exc:
            raise ConfigError(f"{store} is not a forgetui store: {exc}") from None
        finally:
            con.close()
        found = [TeacherRun(r, store.resolve(), json_value(c)) for r, c in rows if wanted is None or r == wanted]
        if not found:
            raise ConfigError(f"train.from_runs: store {store} holds no run {wanted or ''}".rstrip())
        out += found
    return out


def passing_rollouts(con: duckdb.DuckDBPyConnection, run_id: str, min_reward: float) -> list[str]:
    """Finished rollouts of the run whose reward reached `min_reward`."""
    rows = con.execute(
        "SELECT rollout_id FROM rollouts WHERE run_id = ? AND list_contains(?, status) AND reward >= ? ORDER BY rollout_id",
        [run_id, list(TRAINABLE_STATUSES), min_reward],
    ).fetchall()
    return [r[0] for r in rows]


# ----------------------------------------------------------------------------- tokenizers
def teacher_tokenizer_name(config: dict[str, Any]) -> str | None:
    """The model whose tokenizer made a run's token ids (from runs.config: policy.backend, policy.tokenizer); None if unknown."""
    policy = config.get("policy") or {}
    spec = spec_or_none(policy.get("backend"))
    return spec.tokenizer_model(policy.get("tokenizer")) if spec is not None else policy.get("tokenizer")


def _fingerprint(tokenizer: Any) -> tuple[Any, ...]:
    """What must agree for token ids to mean the same: vocabulary, special tokens, chat template."""
    return (
        tokenizer.get_vocab(),
        tokenizer.eos_token,
        tokenizer.bos_token,
        tokenizer.chat_template,
        tuple(tokenizer.all_special_tokens),
    )


def same_tokenizer(teacher: str | None, student: Any, student_name: str) -> bool:
    """Whether ids recorded with the teacher's tokenizer are the student's ids for the same text."""
    if teacher is None:
        return False
    try:
        if str(resolve_model(teacher)) == str(resolve_model(student_name)):
            return True
        return _fingerprint(load_tokenizer(resolve_model(teacher))) == _fingerprint(student)
    except (ModelError, OSError, ValueError) as exc:
        log.info("cannot load the teacher's tokenizer %r (%s): re-tokenizing its calls", teacher, exc)
        return False


def _completion_text(tokenizer: Any, prompt: str, full: str) -> str | None:
    """The assistant turn's text as the model samples it (through its end-of-turn token), or None if `full` does not extend `prompt`."""
    if not full.startswith(prompt):
        return None
    text = full[len(prompt) :]
    eos = tokenizer.eos_token or ""
    if eos and eos in text:
        text = text[
            : text.rfind(eos) + len(eos)
        ]  # what follows the end of turn is template glue, not sampled
    return text


def retokenized_call(tokenizer: Any, row: dict[str, Any]) -> dict[str, Any] | None:
    """A `calls` row rebuilt on the student's template: prompt ids, completion ids, zero logprobs (None if it does not render)."""
    messages, tools = request_chat(row["api"], row["request"], row.get("model"))
    answer = answer_message(row["api"], row["response"])
    prompt = render_chat(tokenizer, messages, tools, add_generation_prompt=True)
    full = render_chat(tokenizer, [*messages, answer], tools, add_generation_prompt=False)
    text = _completion_text(tokenizer, prompt, full)
    if text is None:
        log.warning(
            "call %s: the student's template renders the answered conversation differently from its prompt; call skipped",
            row["call_id"],
        )
        return None
    completion = encode(tokenizer, text)
    return {
        "call_id": row["call_id"],
        "prompt_token_ids": encode(tokenizer, prompt),
        "completion_token_ids": completion,
        "completion_logprobs": [0.0] * len(completion),
        "weights_version": row.get("weights_version"),
        "extends_parent": None,
    }


def retokenized_samples(
    con: duckdb.DuckDBPyConnection, run_id: str, rollout_ids: Sequence[str], tokenizer: Any
) -> list[Sample]:
    """Samples of the rollouts rebuilt from their recorded text on `tokenizer`'s chat template."""
    samples: list[Sample] = []
    for rows in recorded_calls(con, run_id, rollout_ids).values():
        rollout = {k: rows[0][k] for k in ("rollout_id", "run_id", "task_id", "step", "reward", "status")}
        calls = [c for c in (retokenized_call(tokenizer, r) for r in rows) if c is not None]
        samples += build_samples(rollout, calls)
    return samples


# ----------------------------------------------------------------------------- examples
@dataclass
class TeacherExamples:
    """What one teacher run gave: its passing rollouts, the path taken, the samples."""

    run_id: str
    store: str
    rollouts: int
    path: str
    samples: list[Sample]

    def info(self) -> dict[str, Any]:
        """A JSON-ready summary (no token ids)."""
        return {
            "run_id": self.run_id,
            "store": self.store,
            "rollouts": self.rollouts,
            "path": self.path,
            "examples": len(self.samples),
            "tokens": sum(s.trainable_tokens for s in self.samples),
        }


def example_path(
    run: TeacherRun,
    con: duckdb.DuckDBPyConnection,
    rollout_ids: Sequence[str],
    tokenizer: Any,
    student_name: str,
) -> tuple[str, list[Sample]]:
    """Token-exact samples when the teacher's tokenizer is the student's and every call has ids + logprobs; else re-tokenized."""
    teacher = teacher_tokenizer_name(run.config)
    if same_tokenizer(teacher, tokenizer, student_name):
        try:
            return TOKEN_EXACT, samples_for_run(con, run.run_id, rollout_ids=rollout_ids)
        except TrainingDataError as exc:
            log.info("run %s: %s; re-tokenizing its calls", run.run_id, exc)
    else:
        log.info(
            "run %s: teacher tokenizer %r is not the student's %r; re-tokenizing its calls",
            run.run_id,
            teacher,
            student_name,
        )
    return RETOKENIZED, retokenized_samples(con, run.run_id, rollout_ids, tokenizer)


def teacher_examples(
    runs: Sequence[TeacherRun], min_reward: float, tokenizer: Any, student_name: str
) -> list[TeacherExamples]:
    """Every teacher run's passing rollouts as SFT samples; ConfigError when there is nothing to learn from."""
    out: list[TeacherExamples] = []
    for run in runs:
        con = connect(run.store)
        try:
            passing = passing_rollouts(con, run.run_id, min_reward)
            path, samples = (
                example_path(run, con, passing, tokenizer, student_name) if passing else ("none", [])
            )
        finally:
            con.close()
        samples = [s for s in samples if s.trainable_tokens > 0]
        for s in samples:
            s.advantage = 1.0  # SFT: every example weighs the same
        out.append(TeacherExamples(run.run_id, str(run.store), len(passing), path, samples))
        log.info(
            "teacher run %s: %d passing rollouts → %d examples (%s)",
            run.run_id,
            len(passing),
            len(samples),
            path,
        )
    if not any(t.samples for t in out):
        runs = ", ".join(t.run_id for t in out)
        raise ConfigError(
            f"no rollout of {runs} reached train.min_reward = {min_reward} with an answer to learn from: lower train.min_reward or name runs that passed"
        )
    return out


# ----------------------------------------------------------------------------- the run
def student_model(config: RunConfig) -> str:
    """The model to fine-tune: `builtin:MODEL` or a local model folder."""
    spec = config.policy.spec
    if spec.declared.trainable != "weights":
        raise ConfigError(
            f"train.trainer = sft fine-tunes policy.backend; {spec.shown!r} has no weights here: use builtin:MODEL or a local model folder (the teacher goes in train.from_runs)"
        )
    return spec.target


def check_sft(config: RunConfig) -> None:
    """Refuse, before anything loads, an SFT config that cannot train."""
    if not config.train.from_runs:
        raise ConfigError(
            "train.trainer = sft needs train.from_runs: the run ids (or store.duckdb paths) whose passing rollouts to learn from"
        )
    student_model(config)


def schedule(
    samples: Sequence[Sample], epochs: int, per_step: int, seed: int
) -> list[tuple[int, list[Sample]]]:
    """(epoch, examples) per optimizer step: each epoch a seeded shuffle, cut into `per_step` examples."""
    steps: list[tuple[int, list[Sample]]] = []
    for epoch in range(epochs):
        order = list(samples)
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        steps += [(epoch, order[i : i + per_step]) for i in range(0, len(order), per_step)]
    return steps


def _fit_context(samples: list[Sample], limit: int | None) -> list[Sample]:
    """Examples that fit the student's context (longer ones are dropped, with a warning)."""
    if not limit:
        return samples
    kept = [s for s in samples if len(s.token_ids) <= limit]
    if len(kept) < len(samples):
        log.warning(
            "%d examples are longer than the student's context (%d tokens) and are left out",
            len(samples) - len(kept),
            limit,
        )
    if not kept:
        raise ConfigError(
            f"every teacher example is longer than the student's context ({limit} tokens): use a student with a longer context"
        )
    return kept


class SftTraining:
    """An SFT run's state: the store, the trainer, the schedule; records steps and checkpoints."""

    def __init__(self, run_id: str, run_dir: Path, store: Any, trainer: Any, config: RunConfig) -> None:
        self.run_id, self.run_dir, self.store, self.trainer, self.config = (
            run_id,
            run_dir,
            store,
            trainer,
            config,
        )
        self.mirror = MetricsMirror(run_dir / "tensorboard", run_id, config.model_dump())

    def _has(self, sql: str, params: list[Any]) -> bool:
        self.store.flush()
        return self.store.cursor().execute(sql, params).fetchone() is not None

    def write_examples(self, samples: list[Sample]) -> None:
        """The examples as this run's `samples` rows (once, also on resume)."""
        if not self._has("SELECT 1 FROM samples WHERE run_id = ? LIMIT 1", [self.run_id]):
            for s in samples:
                s.run_id, s.step = self.run_id, 0
            write_samples(self.store, samples)

    def step(self, step: int, epoch: int, batch: list[Sample]) -> dict[str, Any]:
        """One optimizer step; its train_steps row (written once)."""
        metrics = self.trainer.sft_step(batch)
        metrics.update({"epoch": epoch, "examples": len(batch)})
        if not self._has("SELECT 1 FROM train_steps WHERE run_id = ? AND step = ?", [self.run_id, step]):
            rest = {k: v for k, v in metrics.items() if k != "loss"}
            self.store.insert_train_step(
                {
                    "run_id": self.run_id,
                    "step": step,
                    "loss": metrics["loss"],
                    "reward_mean": None,
                    "metrics": rest,
                }
            )
        self.store.flush()
        self.mirror.write(train_step_rows(self.store.cursor(), self.run_id, [step]))
        return metrics

    def checkpoint(self, step: int) -> Path:
        return write_checkpoint(self.trainer, self.run_dir, step, self.config.train.keep_states)


def _train(
    training: SftTraining, steps: list[tuple[int, list[Sample]]], save_every: int
) -> tuple[list[float], Path]:
    """The optimizer steps not yet taken (a resumed trainer knows how many were), then the final checkpoint."""
    losses: list[float] = []
    for step in range(training.trainer.updates, len(steps)):
        epoch, batch = steps[step]
        metrics = training.step(step, epoch, batch)
        losses.append(float(metrics["loss"]))
        log.info(
            "sft step %d (epoch %d): loss %.4f over %d tokens",
            step,
            epoch,
            metrics["loss"],
            int(metrics["tokens"]),
        )
        if save_every and (step + 1) % save_every == 0 and step + 1 < len(steps):
            training.checkpoint(step)
    return losses, training.checkpoint(len(steps) - 1)


async def _prepare(config: RunConfig) -> tuple[list[TeacherExamples], LocalTrainer, list[Sample]]:
    """The teachers' examples on the student's tokenizer, the trainer over the student, the examples that fit its context."""
    train = config.train
    student = student_model(config)
    runs = teacher_runs(train.from_runs)
    tokenizer = await asyncio.to_thread(lambda: load_tokenizer(resolve_model(student)))
    teachers = await asyncio.to_thread(teacher_examples, runs, train.min_reward, tokenizer, student)
    trainer = await asyncio.to_thread(lambda: LocalTrainer(student, tokenizer=tokenizer, **{**trainer_settings(train), "temperature": 1.0}))
    limit = getattr(trainer.model.config, "max_position_embeddings", None)
    return teachers, trainer, _fit_context([s for t in teachers for s in t.samples], limit)


def _summary(run_id: str, run_dir: Path, config: RunConfig, teachers: list[TeacherExamples], samples: list[Sample], steps: int, losses: list[float], final: Path) -> RunSummary:
    """An SFT run's summary: no rollouts; what it learned from and how its loss went in `extra`."""
    extra = {
        "trainer": "sft",
        "examples": len(samples),
        "tokens": sum(s.trainable_tokens for s in samples),
        "train_steps": steps,
        "epochs": config.train.epochs,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "checkpoint": str(final),
        "teachers": [t.info() for t in teachers],
        "tensorboard": str(run_dir / "tensorboard"),
    }
    return RunSummary(
        run_id=run_id, rollouts=0, passed=0, failed=0, timeouts=0, infra_errors=0, mean_reward=None,
        pass_at_k={}, pass_hat_k={}, store=str(run_dir / "store.duckdb"), extra=extra,
    )


class SftTrainerRun:
    """`train.trainer = "sft"`: fine-tune `policy.backend` on the passing rollouts of `train.from_runs`; no rollout runs."""

    name = "sft"
    runs_rollouts = False
    settings = (RunTrainingSettings, UpdateSettings, InProcessSettings, TrainerStateSettings, SftSettings)

    def trains(self, config: RunConfig) -> bool:
        return True  # `train.steps` does not apply: `train.epochs` passes over the examples

    def check(self, config: RunConfig) -> None:
        check_sft(config)

    async def train(self, config: RunConfig, *, resume: str | None, hooks: RunHooks, ks: list[int] | None) -> RunSummary:
        train = config.train
        if resume is not None and not (runs_dir() / resume).is_dir():
            raise ConfigError(f"no run {resume!r} to resume")
        teachers, trainer, samples = await _prepare(config)
        steps = schedule(samples, train.epochs, train.micro_batch_size, train.seed if train.seed is not None else config.run.seed)
        run_id = resume or new_run_id()
        run_dir = runs_dir() / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(dump_toml(config))
        found = last_checkpoint(run_dir) if resume else None
        if found is not None:
            await asyncio.to_thread(trainer.load_checkpoint, found[1])
        store = Store.open(run_dir / "store.duckdb")
        write_pid_file(run_dir)
        status = RunStatus.FAILED
        try:
            store.insert_run(run_id, config.model_dump(), status=RunStatus.RUNNING)
            training = SftTraining(run_id, run_dir, store, trainer, config)
            if hooks.on_start is not None:
                hooks.on_start(run_id, 0)
            training.write_examples(samples)
            try:
                losses, final = await asyncio.to_thread(_train, training, steps, train.save_every)
            finally:
                training.mirror.close()
            status = RunStatus.DONE
        except (asyncio.CancelledError, KeyboardInterrupt):
            status = RunStatus.INTERRUPTED
            raise
        finally:
            store.update_run_status(run_id, status)
            store.close()
            remove_pid_file(run_dir)
        return _summary(run_id, run_dir, config, teachers, samples, len(steps), losses, final)
