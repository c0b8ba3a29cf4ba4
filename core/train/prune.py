"""What `forgetui gc --checkpoints` frees in the runs folder: older trainer states, finished runs' pushed weights."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from core.rollout.orphans import PID_FILE
from core.train.checkpoints import prune_trainer_states
from core.train.vllm_sync import WEIGHTS


def run_keep_states(run_dir: Path) -> int:
    """The `train.keep_states` a run was started with (its config.toml), else the default 1."""
    try:
        train = tomllib.loads((run_dir / "config.toml").read_text()).get("train", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return 1
    value = train.get("keep_states", 1) if isinstance(train, dict) else 1
    return value if isinstance(value, int) and value >= 1 else 1


def prune_runs(root: Path) -> int:
    """Every run's older trainer states and its pushed weights once it has stopped; bytes freed.

    States by each run's own `train.keep_states` (safe while it trains: the newest stays whole); runs/<id>/weights
    only once the run's pid file is gone (its server has loaded them; its final checkpoint holds the same weights).
    """
    freed = 0
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        freed += prune_trainer_states(run_dir, run_keep_states(run_dir))
        pushed = run_dir / WEIGHTS
        if pushed.is_dir() and not (run_dir / PID_FILE).exists():
            size = sum(f.stat().st_size for f in pushed.rglob("*") if f.is_file())
            shutil.rmtree(pushed, ignore_errors=True)
            freed += size
    return freed
