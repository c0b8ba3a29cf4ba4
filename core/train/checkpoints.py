"""Where a run's checkpoints live: runs/<id>/checkpoints/step-NNNNN, complete once the trainer state is written.

A trainer state holds what only a resume needs (the optimizer's moments, the schedule): twice the weights'
size in float32. A run keeps it in its newest `keep` checkpoints; older ones keep their weights (served,
scored, exported as before) and a small state that still marks them complete but says it was pruned.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.pt"  # written last into a checkpoint folder: its presence marks a complete one
PRUNED = "pruned"  # the key a pruned trainer state carries (True): its optimizer and schedule were removed

log = logging.getLogger(__name__)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:05d}"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """A run's complete checkpoint folders, oldest first."""
    return sorted(p for p in (run_dir / CHECKPOINTS).glob("step-*") if (p / TRAINER_STATE).exists())


def last_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint of a run, if any."""
    found = complete_checkpoints(run_dir)
    if not found:
        return None
    return int(found[-1].name.split("-")[1]), found[-1]


def write_checkpoint(trainer: Any, run_dir: Path, step: int, keep: int) -> Path:
    """The trainer's checkpoint after `step`; then the trainer states of all but the newest `keep` are pruned."""
    path = trainer.save_checkpoint(checkpoint_dir(run_dir, step))
    prune_trainer_states(run_dir, keep)
    return path


def prune_trainer_states(run_dir: Path, keep: int) -> int:
    """Replace the trainer state of every complete checkpoint but the newest `keep` by a pruned one; bytes freed.

    Safe while the run trains: a checkpoint's state is written whole before any older one is pruned, and the
    newest is never pruned, so a resume always finds one to start from.
    """
    import torch

    freed = 0
    for folder in complete_checkpoints(run_dir)[: -max(keep, 1)]:
        state_file = folder / TRAINER_STATE
        before = state_file.stat().st_size
        if before < 1 << 16 and is_pruned(state_file):
            continue
        tmp = folder / (TRAINER_STATE + ".tmp")
        torch.save({PRUNED: True, "step": int(folder.name.split("-")[1])}, tmp)
        tmp.replace(state_file)  # a crash leaves either the whole state or the pruned one: never none
        freed += before - state_file.stat().st_size
    if freed:
        log.info("pruned older trainer states of %s: %.1f MB freed", run_dir, freed / 1e6)
    return freed


def is_pruned(state_file: Path) -> bool:
    """Whether a trainer state file is a pruned one (weights kept, optimizer and schedule removed)."""
    import torch

    state = torch.load(state_file, map_location="cpu", weights_only=True)
    return bool(state.get(PRUNED))
