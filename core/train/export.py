"""A run's recorded data as files other trainers read: `jsonl` samples, `sft` chat conversations, `verl` parquet.

* ``jsonl`` — one line per training sample (rollout branch): token_ids, loss_mask, logprobs,
  reward, advantage, ids. From the run's `samples` table when it has rows (a training run: the
  advantages it used), else built from the calls (`samples_for_run`; token backends only).
* ``sft`` — one line per passing rollout branch: ``{"messages": [...], "tools": [...]}`` in OpenAI
  chat format (the branch's final call's request messages + its assistant answer), plus
  ``token_ids`` / ``loss_mask`` where the calls recorded token ids.
* ``verl`` — a parquet file veRL's RL dataset (`verl.utils.dataset.rl_dataset.RLHFDataset`) reads:
  one row per task of the run with ``data_source``, ``prompt`` (chat messages: the task's
  instruction), ``ability``, ``reward_model`` {style, ground_truth}, ``extra_info`` {index, split,
  env, task_id, ...} and ``agent_name``, so an agent loop can start the task in its environment.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from core.config import RunConfig
from core.errors import ConfigError, TrainingDataError
from core.registry import load_env
from core.rollout.recorded import conversations, recorded_calls, request_chat
from core.store.bodies import select_calls
from core.train.samples import samples_for_run
from core.train.sft import TeacherRun, connect, passing_rollouts, teacher_runs

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "sft", "verl")
SUFFIX = {"jsonl": "samples.jsonl", "sft": "sft.jsonl", "verl": "verl.parquet"}
AGENT_NAME = "forgetui"  # the veRL agent loop that runs a task through forgetui's harness and proxy


@dataclass
class Exported:
    """What an export wrote."""

    format: str
    path: str
    rows: int
    run_id: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _one_run(name: str) -> TeacherRun:
    """The run a name designates (a run id, or a store holding exactly one run)."""
    runs = teacher_runs([name])
    if len(runs) > 1:
        raise ConfigError(
            f"{name} holds {len(runs)} runs ({', '.join(r.run_id for r in runs[:5])}): name one by its run id"
        )
    return runs[0]


def _plain(value: Any) -> Any:
    """A sample's numpy token columns (as `samples_for_run` builds them) as JSON lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    count = 0
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=_plain) + "\n")
            count += 1
    return count


# ----------------------------------------------------------------------------- jsonl
SAMPLE_FIELDS = (
    "sample_id",
    "run_id",
    "rollout_id",
    "task_id",
    "branch",
    "step",
    "token_ids",
    "loss_mask",
    "logprobs",
    "reward",
    "advantage",
    "prompt_tokens",
    "call_ids",
)


def sample_rows(
    con: duckdb.DuckDBPyConnection, run_id: str, min_reward: float | None
) -> list[dict[str, Any]]:
    """The run's samples: its `samples` rows, or built from its calls when it stored none."""
    cols = ", ".join(SAMPLE_FIELDS)
    cur = con.execute(f"SELECT {cols} FROM samples WHERE run_id = ? ORDER BY step, sample_id", [run_id])
    rows = [dict(zip(SAMPLE_FIELDS, r, strict=True)) for r in cur.fetchall()]
    if not rows:
        try:
            rows = [{k: getattr(s, k) for k in SAMPLE_FIELDS} for s in samples_for_run(con, run_id)]
        except TrainingDataError as exc:
            raise TrainingDataError(
                f"{exc}. `forgetui export RUN --format sft` writes such a run's conversations as text"
            ) from None
    if min_reward is not None:
        rows = [r for r in rows if (r["reward"] or 0.0) >= min_reward]
    return rows


# ----------------------------------------------------------------------------- sft
def sft_rows(con: duckdb.DuckDBPyConnection, run_id: str, min_reward: float) -> Iterator[dict[str, Any]]:
    """OpenAI-chat conversations of the passing rollout branches, with token ids and masks where recorded."""
    passing = passing_rollouts(con, run_id, min_reward)
    if not passing:
        return
    by_last_call: dict[str, Any] = {}
    try:
        by_last_call = {
            s.call_ids[-1]: s for s in samples_for_run(con, run_id, rollout_ids=passing) if s.call_ids
        }
    except TrainingDataError:
        log.info("run %s recorded no token ids: its conversations are exported as text only", run_id)
    rewards = dict(
        con.execute("SELECT rollout_id, reward FROM rollouts WHERE run_id = ?", [run_id]).fetchall()
    )
    for rollout_id, calls in recorded_calls(con, run_id, passing).items():
        for conv in conversations(calls):
            row: dict[str, Any] = {
                "messages": conv["messages"],
                "tools": conv["tools"],
                "run_id": run_id,
                "rollout_id": rollout_id,
                "task_id": calls[0]["task_id"],
                "reward": rewards.get(rollout_id),
                "call_id": conv["call_id"],
            }
            sample = by_last_call.get(conv["call_id"])
            if sample is not None:
                row.update(token_ids=sample.token_ids, loss_mask=sample.loss_mask)
            yield row


# ----------------------------------------------------------------------------- verl
def _instructions(config: dict[str, Any]) -> dict[str, Any]:
    """task id → Task of the run's environment (empty when the environment cannot be loaded here)."""
    try:
        env_cfg = RunConfig.model_validate(config).env
        env = load_env(env_cfg.name, **({"path": env_cfg.path} if env_cfg.path else {}), **env_cfg.options)
        return {t.id: t for t in env.tasks()}
    except Exception as exc:  # noqa: BLE001 - fall back to the recorded first user message
        log.warning(
            "cannot load the run's environment (%s): prompts come from the recorded first user messages", exc
        )
        return {}


def _first_user_message(con: duckdb.DuckDBPyConnection, run_id: str, task_id: str) -> str:
    """The first user message any recorded call of the task sent (the harness's wording of the instruction)."""
    rows = select_calls(
        con,
        "SELECT c.call_id, c.api, c.model, {request} FROM calls c JOIN rollouts r USING (rollout_id) "
        "WHERE r.run_id = ? AND r.task_id = ? ORDER BY c.started_at LIMIT 1",
        [run_id, task_id],
    )
    if not rows:
        return ""
    messages, _ = request_chat(rows[0]["api"], rows[0]["request"], rows[0]["model"])
    return next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")


def verl_rows(con: duckdb.DuckDBPyConnection, run: TeacherRun) -> list[dict[str, Any]]:
    """One veRL RL-dataset row per task the run worked on."""
    tasks = con.execute(
        "SELECT env, task_id, any_value(harness), any_value(task_hash), avg(reward), count(*) FROM rollouts WHERE run_id = ? GROUP BY env, task_id ORDER BY env, task_id",
        [run.run_id],
    ).fetchall()
    known = _instructions(run.config) if tasks else {}
    env_options = json.dumps(((run.config.get("env") or {}).get("options")) or {}, sort_keys=True)
    rows = []
    for index, (env, task_id, harness, task_hash, mean_reward, n) in enumerate(tasks):
        task = known.get(task_id)
        instruction = task.instruction if task is not None else _first_user_message(con, run.run_id, task_id)
        split = str((task.meta or {}).get("split", "train")) if task is not None else "train"
        rows.append({
            "data_source": f"forgetui/{env}",
            "prompt": [{"role": "user", "content": instruction}],
            "ability": "agent",
            "reward_model": {"style": "rule", "ground_truth": task_id},
            "extra_info": {"index": index, "split": split, "env": env, "task_id": task_id, "run_id": run.run_id, "harness": harness or "", "task_hash": task_hash or "", "env_options": env_options, "recorded_mean_reward": float(mean_reward or 0.0), "recorded_rollouts": int(n)},
            "agent_name": AGENT_NAME,
        })  # fmt: skip
    return rows


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> int:
    """Rows as a parquet file (pyarrow infers the nested columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ConfigError("the run has no rollouts: nothing to export")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return len(rows)


# ----------------------------------------------------------------------------- entry
def export_run(
    name: str, fmt: str, out: str | Path | None = None, min_reward: float | None = None
) -> Exported:
    """Write run `name` (a run id or store path) in `fmt`; default path: `<run folder>/export/<file>`."""
    if fmt not in FORMATS:
        raise ConfigError(f"export format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "verl" and min_reward is not None:
        raise ConfigError(
            "--min-reward does not apply to --format verl: it writes one row per task, not per rollout"
        )
    run = _one_run(name)
    path = Path(out).expanduser() if out else run.store.parent / "export" / SUFFIX[fmt]
    path.parent.mkdir(parents=True, exist_ok=True)
    con = connect(run.store)
    try:
        if fmt == "jsonl":
            count = _write_jsonl(path, iter(sample_rows(con, run.run_id, min_reward)))
        elif fmt == "sft":
            count = _write_jsonl(path, sft_rows(con, run.run_id, 1.0 if min_reward is None else min_reward))
        else:
            count = write_parquet(path, verl_rows(con, run))
    finally:
        con.close()
    if count == 0:
        log.warning("run %s: nothing matched; %s is empty", run.run_id, path)
    return Exported(fmt, str(path), count, run.run_id)
