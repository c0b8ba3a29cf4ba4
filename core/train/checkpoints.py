"""Where a run's checkpoints live: runs/<id>/checkpoints/step-NNNNN, complete once the trainer state is written."""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.pt"  # written last into a checkpoint folder: its presence marks a complete one


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:05d}"


def last_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint of a run, if any."""
    found = sorted(p for p in (run_dir / CHECKPOINTS).glob("step-*") if (p / TRAINER_STATE).exists())
    if not found:
        return None
    return int(found[-1].name.split("-")[1]), found[-1]
