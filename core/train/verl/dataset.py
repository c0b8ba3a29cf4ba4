"""The veRL dataset of a run config: one parquet row per task, in veRL's columns (train and val files)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from core.config import RunConfig
from core.env import Task, is_held_out
from core.registry import load_env
from core.session.setup import select_tasks

log = logging.getLogger(__name__)

AGENT_NAME = "forgetui"
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name")


def task_row(task: Task, index: int, split: str, env_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """One row: the instruction as the chat prompt; extra_info names the env, the task and the env options."""
    return {
        "data_source": f"forgetui/{env_name}",
        "prompt": [{"role": "user", "content": task.instruction}],
        "ability": "agent",
        "reward_model": {"style": "rule", "ground_truth": task.id},  # the env's verifier scores it; veRL's reward fn does not
        "extra_info": {
            "index": index,
            "split": split,
            "env": env_name,
            "task_id": task.id,
            "env_options": json.dumps(options, sort_keys=True),
        },
        "agent_name": AGENT_NAME,
    }


def split_tasks(config: RunConfig) -> tuple[list[Task], list[Task], dict[str, Any]]:
    """(train tasks, val tasks, the val env's options): the config's tasks, and its env's eval split when it has one."""
    env_kw = {"path": config.env.path} if config.env.path else {}
    options = dict(config.env.options)
    env = load_env(config.env.name, **env_kw, **options)
    tasks = select_tasks(env, config.env.tasks, config.env.limit)
    train = [t for t in tasks if not is_held_out(t)]
    val = [t for t in tasks if is_held_out(t)]
    val_options = options
    if not val and options.get("split") not in (None, "eval"):
        val_options = {**options, "split": "eval"}
        try:
            val = select_tasks(load_env(config.env.name, **env_kw, **val_options), config.env.tasks, config.env.limit)
        except Exception as exc:  # noqa: BLE001 - an env without an eval split: validate on the train tasks
            log.info("env %s has no eval split (%s)", config.env.name, exc)
            val = []
    if not val:
        log.warning("no held-out tasks for validation: validating on the training tasks")
        val, val_options = list(train), options
    return train, val, val_options


def write_dataset(config: RunConfig, out_dir: Path) -> tuple[Path, Path, int, int]:
    """train.parquet and val.parquet under `out_dir`; returns their paths and row counts."""
    import pandas as pd

    train, val, val_options = split_tasks(config)
    if not train:
        raise ValueError(f"env {config.env.name!r} selects no training task")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.parquet", out_dir / "val.parquet"
    for path, tasks, split, options in ((paths[0], train, "train", config.env.options), (paths[1], val, "val", val_options)):
        rows = [task_row(t, i, split, config.env.name, dict(options)) for i, t in enumerate(tasks)]
        pd.DataFrame(rows, columns=list(COLUMNS)).to_parquet(path, index=False)
    return paths[0], paths[1], len(train), len(val)
