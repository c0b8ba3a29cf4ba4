"""The Learning screen: a learning run's stages (base, teacher, SFT, GRPO steps, selection, evals) as they arrive.

It reads the event log `benchmarks/learning_curve.py` appends to (`FORGETUI_HOME/learning/*.jsonl`,
`forgetui.learning_events`), newest run first, and polls it: each held-out pass rate with its 95%
interval over tasks, each GRPO step's train reward and groups with signal, the stage running now and,
at the end, the paired gains. `[` and `]` step to older and newer runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Static

from forgetui.learning_events import LearningState, logs, read_new
from forgetui.tui.widgets.key_footer import KeyFooter

STAGE_COLUMNS = ("stage", "split", "pass", "95% CI", "n", "timed out", "s")
STEP_COLUMNS = ("step", "reward", "trained", "signal", "refills", "s")


def stage_row(event: dict[str, Any]) -> tuple[str, ...]:
    """One held-out pass rate as a table row."""
    lo, hi = event.get("ci") or (0.0, 0.0)
    seconds = event.get("seconds")
    return (str(event.get("stage", "?")), str(event.get("split", "?")), f"{float(event.get('pass_rate', 0.0)):.3f}",
            f"[{lo:.2f}, {hi:.2f}]", f"{event.get('passed', '?')}/{event.get('scored', '?')}", str(event.get("timeouts") or ""),
            "" if seconds is None else f"{float(seconds):.0f}")


def is_training_phase_done(event: dict[str, Any]) -> bool:
    """A teacher, SFT or GRPO stage that finished (evals have their own rows: their pass rates)."""
    return event.get("event") == "phase" and event.get("state") == "done" and " eval · " not in str(event.get("phase", ""))


def phase_row(event: dict[str, Any]) -> tuple[str, ...]:
    """A finished training stage as a row: its name and seconds, on the train split, no pass rate of its own."""
    seconds = event.get("seconds")
    return (str(event.get("phase", "?")), "train", "", "", "", "", "" if seconds is None else f"{float(seconds):.0f}")


def step_row(event: dict[str, Any]) -> tuple[str, ...]:
    """One GRPO step as a table row: train reward, samples trained of all, groups with signal, refill batches, seconds."""
    def num(key: str, fmt: str = "{:.0f}") -> str:
        value = event.get(key)
        return "" if value is None else fmt.format(float(value))

    seconds = sum(float(event.get(k) or 0.0) for k in ("rollout_s", "update_s"))
    return (num("step"), num("reward_mean", "{:.3f}"), f"{num('samples_trained')}/{num('samples')}",
            f"{num('informative_groups')}/{num('groups')}", num("extra_batches"), f"{seconds:.0f}" if seconds else "")


def gains_line(state: LearningState) -> str:
    """The paired gains once the run is done, else what runs now."""
    if state.failed is not None:
        return f"stopped: {state.failed}"
    if state.done is None:
        return f"{state.status} …" if state.running else state.status
    parts = []
    for split, gains in (state.done.get("gains") or {}).items():
        for label, g in gains.items():
            lo, hi = g.get("ci", (0.0, 0.0))
            parts.append(f"{label.replace(' - ', ' − ')} {g['gain']:+.2f} [{lo:+.2f}, {hi:+.2f}] ({split})")
    stopped = state.early_stop
    best = None if stopped is None else stopped.get("best_step")
    kept = "SFT" if best == -1 else f"step {best}"  # -1: forgetui.learning.START_STEP
    early = "" if stopped is None else f"GRPO stopped early after step {stopped.get('step')} (kept {kept}) · "
    return f"done in {float(state.done.get('total_s', 0.0)) / 60:.1f} min · " + early + " · ".join(parts)


class LearningScreen(Screen[None]):
    """A learning run's stages and GRPO steps, refreshed while its event log grows."""

    DEFAULT_CSS = """
    LearningScreen #learning-title { height: 1; background: $boost; }
    LearningScreen #learning-stages { height: auto; max-height: 10; }
    LearningScreen #learning-steps { height: 1fr; }
    LearningScreen #learning-status { height: auto; max-height: 3; }
    """
    BINDINGS = [Binding("escape", "app.pop_screen", "Back", key_display="esc"), Binding("left_square_bracket", "older", "Older", key_display="["),
                Binding("right_square_bracket", "newer", "Newer", key_display="]"), Binding("r", "reload", "Reload")]

    def __init__(self, home: Path | None = None, *, path: Path | None = None, poll_s: float = 1.0) -> None:
        super().__init__()
        self.home = home
        self.poll_s = poll_s
        self.path = path
        self.state = LearningState()
        self.read_offset = 0

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("", id="learning-title", markup=False)
            yield DataTable(id="learning-stages", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="learning-steps", cursor_type="row", zebra_stripes=True)
            yield Static("", id="learning-status", markup=False)
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#learning-stages", DataTable).add_columns(*STAGE_COLUMNS)
        self.query_one("#learning-steps", DataTable).add_columns(*STEP_COLUMNS)
        if self.path is None:
            found = logs(self.home)
            self.path = found[0] if found else None
        self.action_reload()
        self.set_interval(self.poll_s, self.poll)

    def runs(self) -> list[Path]:
        return logs(self.home)

    def action_reload(self) -> None:
        """Read the log from its start."""
        self.state, self.read_offset = LearningState(), 0
        for table in ("#learning-stages", "#learning-steps"):
            self.query_one(table, DataTable).clear()
        self.poll()

    def _step(self, by: int) -> None:
        found = self.runs()
        if not found:
            return
        i = found.index(self.path) if self.path in found else 0
        self.path = found[max(0, min(len(found) - 1, i + by))]
        self.action_reload()

    def action_older(self) -> None:
        self._step(1)

    def action_newer(self) -> None:
        self._step(-1)

    def poll(self) -> None:
        """Fold in the events written since the last look and show them."""
        if self.path is not None:
            events, self.read_offset = read_new(self.path, self.read_offset)
            stages, steps = self.query_one("#learning-stages", DataTable), self.query_one("#learning-steps", DataTable)
            for event in events:
                self.state.add(event)
                if event.get("event") == "stage":
                    stages.add_row(*stage_row(event))
                elif is_training_phase_done(event):
                    stages.add_row(*phase_row(event))
                elif event.get("event") == "grpo_step":
                    steps.add_row(*step_row(event))
        self._show()

    def _show(self) -> None:
        title = self.query_one("#learning-title", Static)
        status = self.query_one("#learning-status", Static)
        if self.path is None:
            title.update("Learning · no learning run yet")
            status.update("benchmarks/learning_curve.py --recipe examples/learn/react.toml writes one here as it runs")
            return
        start = self.state.start
        began = float(start.get("t", time.time()))
        when = (time.strftime("started %H:%M", time.localtime(began)) if self.state.done or self.state.failed
                else f"{(time.time() - began) / 60:.0f} min so far")
        title.update(f"Learning · {start.get('harness', '?')} · {start.get('model', '?')} · seed {start.get('seed', '?')} · "
                     f"{when} · {self.path.name}")
        status.update(gains_line(self.state))
