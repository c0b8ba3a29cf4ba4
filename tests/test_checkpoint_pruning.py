"""Checkpoints keep their optimizer state only where a resume needs it: the newest `train.keep_states` of a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.train.checkpoints import (
    TRAINER_STATE,
    checkpoint_dir,
    is_pruned,
    last_checkpoint,
    prune_trainer_states,
    write_checkpoint,
)
from core.train.prune import prune_runs


def trainer():
    from core.train.local import LocalTrainer

    return LocalTrainer("tiny", device="cpu", lr=1e-3)


def states(run_dir: Path) -> dict[str, bool]:
    """Each checkpoint folder's name -> whether its trainer state was pruned."""
    return {p.name: is_pruned(p / TRAINER_STATE) for p in sorted((run_dir / "checkpoints").glob("step-*"))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, int]:
    """Three checkpoints written with keep = 2; the size of a whole trainer state."""
    run_dir = tmp_path_factory.mktemp("run")
    t = trainer()
    for step in range(3):
        write_checkpoint(t, run_dir, step, keep=2)
    return run_dir, (checkpoint_dir(run_dir, 2) / TRAINER_STATE).stat().st_size


def test_only_the_newest_keep_checkpoints_keep_their_trainer_state(saved) -> None:
    run_dir, whole = saved
    assert states(run_dir) == {"step-00000": True, "step-00001": False, "step-00002": False}
    pruned = (checkpoint_dir(run_dir, 0) / TRAINER_STATE).stat().st_size
    assert pruned < 2048 < whole  # the optimizer's moments are gone; a small marker stays
    assert last_checkpoint(run_dir) == (2, checkpoint_dir(run_dir, 2))
    # a pruned checkpoint keeps its weights: the same model files as the others
    assert {f.name for f in checkpoint_dir(run_dir, 0).iterdir()} == {f.name for f in checkpoint_dir(run_dir, 2).iterdir()}


def test_a_pruned_checkpoint_still_serves_but_refuses_a_resume_saying_why(saved) -> None:
    from core.train.local import LocalTrainer

    run_dir, _ = saved
    served = LocalTrainer(checkpoint_dir(run_dir, 0), device="cpu")  # its weights load as a model
    assert served.updates == 0
    with pytest.raises(ConfigError, match="pruned.*keep_states"):
        trainer().load_checkpoint(checkpoint_dir(run_dir, 0))
    resumed = trainer()
    resumed.load_checkpoint(checkpoint_dir(run_dir, 1))  # the kept ones resume
    assert resumed.optimizer.state_dict()["param_groups"]


def test_pruning_again_frees_nothing_and_never_touches_the_newest(saved) -> None:
    run_dir, _ = saved
    assert prune_trainer_states(run_dir, 2) == 0
    assert prune_trainer_states(run_dir, 0) > 0  # keep is at least 1: the newest always stays whole
    assert states(run_dir)["step-00002"] is False


def test_gc_frees_older_states_by_each_runs_setting_and_finished_runs_pushed_weights(tmp_path) -> None:
    home = tmp_path / "home"
    runs = home / "runs"
    t = trainer()
    for name, keep in (("finished", None), ("keeps-two", 2), ("running", None)):
        run_dir = runs / name
        run_dir.mkdir(parents=True)
        if keep is not None:
            (run_dir / "config.toml").write_text(f"[train]\nkeep_states = {keep}\n")
        for step in range(3):
            t.save_checkpoint(checkpoint_dir(run_dir, step))  # written as before this setting: every state whole
        (run_dir / "weights" / "step-00002").mkdir(parents=True)
        (run_dir / "weights" / "step-00002" / "model.safetensors").write_bytes(b"0" * 4096)
    (runs / "running" / "pid.json").write_text(json.dumps({"pid": os.getpid()}))
    (runs / "not-a-run.txt").write_text("")

    env = {**os.environ, "FORGETUI_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "forgetui.cli", "gc", "--runtime", "local", "--checkpoints"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "GB freed" in done.stderr
    assert states(runs / "finished") == {"step-00000": True, "step-00001": True, "step-00002": False}
    assert states(runs / "keeps-two") == {"step-00000": True, "step-00001": False, "step-00002": False}
    assert states(runs / "running") == {"step-00000": True, "step-00001": True, "step-00002": False}
    assert not (runs / "finished" / "weights").exists() and not (runs / "keeps-two" / "weights").exists()
    assert (runs / "running" / "weights" / "step-00002" / "model.safetensors").exists()  # a live run's server may still load it
    (runs / "running" / "pid.json").unlink()  # the run has finished
    assert prune_runs(runs) == 4096  # its pushed weights go now; every state was already pruned
