"""A learning run's stages as they happen: one JSON line per event, appended while the run goes on, read by the TUI.

`benchmarks/learning_curve.py` writes `FORGETUI_HOME/learning/<started>-<harness>.jsonl` (the TUI's
Learning screen lists that folder). Events, each with `event` and `t` (epoch seconds):

- `start`: harness, model, seed, recipe, eval splits, the plan;
- `phase`: a stage starting (`state` running) or ending (done, with `seconds` and a `detail` line);
- `stage`: a held-out pass rate (`stage` base | sft | grpo, `split`, pass_rate, ci, passed, scored, seconds);
- `grpo_step`: one GRPO step's metrics (train reward, samples trained, groups with signal, refills, times);
- `select`: a GRPO checkpoint scored on the `eval` split (step, pass_rate, ci, best so far);
- `done`: the paired gains and the total time; `failed`: why the run stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.paths import sub

SUFFIX = ".jsonl"


def learning_dir(home: Path | None = None) -> Path:
    """Where learning runs keep their event logs (under FORGETUI_HOME, or `home`)."""
    if home is None:
        return sub("learning")
    return home / "learning"


def new_log_path(harness: str, home: Path | None = None) -> Path:
    """A fresh event log's path for a run of `harness` starting now."""
    folder = learning_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{harness}{SUFFIX}"


def logs(home: Path | None = None) -> list[Path]:
    """Every learning run's event log, newest first."""
    folder = learning_dir(home)
    return sorted(folder.glob(f"*{SUFFIX}"), reverse=True) if folder.is_dir() else []


class EventLog:
    """Appends events to a JSON-lines file, one line each, flushed at once (a reader sees each as it is written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, event: dict[str, Any]) -> None:
        line = json.dumps({"t": time.time(), **event}, default=str)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def read_new(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Events written after byte `offset` (whole lines only: a line still being written waits), and the new offset."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for raw in data[:end].splitlines():
        try:
            events.append(json.loads(raw))
        except ValueError:
            continue  # a torn or foreign line: skip it, keep reading
    return events, offset + end


@dataclass
class LearningState:
    """What the events so far say: the run, the stage running now, every pass rate, GRPO's steps and the selection."""

    start: dict[str, Any] = field(default_factory=dict)
    running: str | None = None
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    selection: list[dict[str, Any]] = field(default_factory=list)
    early_stop: dict[str, Any] | None = None  # GRPO stopped before its last step: the step, the best one kept
    done: dict[str, Any] | None = None
    failed: str | None = None

    def add(self, event: dict[str, Any]) -> None:
        """Fold one event in."""
        kind = event.get("event")
        if kind == "start":
            self.start = event
        elif kind == "phase":
            name = str(event.get("phase"))
            self.phases[name] = event
            self.running = name if event.get("state") == "running" else (None if self.running == name else self.running)
        elif kind == "stage":
            self.stages.append(event)
        elif kind == "grpo_step":
            self.steps.append(event)
        elif kind == "select":
            self.selection.append(event)
        elif kind == "early_stop":
            self.early_stop = event
        elif kind == "done":
            self.done, self.running = event, None
        elif kind == "failed":
            self.failed, self.running = str(event.get("error", "failed")), None

    @property
    def status(self) -> str:
        """One word or phrase: done, failed: …, running STAGE, or waiting."""
        if self.failed is not None:
            return f"failed: {self.failed}"
        if self.done is not None:
            return "done"
        return f"running {self.running}" if self.running else "waiting"


def load_state(path: Path) -> tuple[LearningState, int]:
    """Every event in `path` folded into a state, and the offset to read on from."""
    state = LearningState()
    events, offset = read_new(path, 0)
    for event in events:
        state.add(event)
    return state, offset
