"""The Learning screen at 80×24: a learning run's stages and GRPO steps appear as its event log grows."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from forgetui.learning_events import EventLog
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.screens.learning import LearningScreen
from tests.tui_helpers import text_of, until


def stage(name: str, rate: float, passed: int, lo: float, hi: float, split: str = "eval-phrasing") -> dict:
    return {"event": "stage", "stage": name, "split": split, "pass_rate": rate, "ci": [lo, hi], "passed": passed, "scored": 100,
            "tasks": 25, "seconds": 120.0}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    older = EventLog(tmp_path / "learning" / "20261204-080000-pi.jsonl")
    older({"event": "start", "harness": "pi", "model": "smollm2-135m", "seed": 1})
    older(stage("base", 0.0, 0, 0.0, 0.0))
    return tmp_path


async def test_the_learning_screen_shows_stages_and_grpo_steps_as_they_arrive(home: Path) -> None:
    log = EventLog(home / "learning" / "20261205-193000-react.jsonl")
    log({"event": "start", "harness": "react", "model": "smollm2-135m", "seed": 7, "splits": ["eval-phrasing"]})
    log({**stage("base", 0.0, 0, 0.0, 0.0), "timeouts": 32})
    log({"event": "phase", "phase": "teacher", "state": "running"})
    app = ForgetuiApp(home, refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        (command,) = [c for c in app.get_system_commands(app.screen) if c.title == "Learning runs"]
        app.call_later(command.callback)  # the palette's entry (Ctrl+P → "Learning runs"), run as the palette runs it
        await until(pilot, lambda: isinstance(app.screen, LearningScreen), "the Learning screen")
        screen = app.screen
        screen.poll_s = 0.05
        stages, steps = screen.query_one("#learning-stages", DataTable), screen.query_one("#learning-steps", DataTable)
        await until(pilot, lambda: stages.row_count == 1, "the base stage")
        assert stages.get_row_at(0) == ["base", "eval-phrasing", "0.000", "[0.00, 0.00]", "0/100", "32", "120"]  # 32 timed out
        title, status = screen.query_one("#learning-title", Static), screen.query_one("#learning-status", Static)
        assert "react" in text_of(title) and "seed 7" in text_of(title) and "running teacher" in text_of(status)

        # the run goes on: SFT's eval, two GRPO steps, the GRPO eval, the gains
        log({"event": "phase", "phase": "teacher", "state": "done", "seconds": 30.0})
        log(stage("sft", 0.46, 46, 0.31, 0.61))
        for n, reward in ((0, 0.42), (1, 0.55)):
            log({"event": "grpo_step", "step": n, "reward_mean": reward, "samples": 32, "samples_trained": 24, "groups": 8,
                 "informative_groups": 6, "extra_batches": 1, "rollout_s": 56.0, "update_s": 28.0})
        await screen.run_action("reload")  # polled every second anyway; reload reads the log from its start
        await until(pilot, lambda: steps.row_count == 2 and stages.row_count == 3, "the teacher, SFT's eval and two GRPO steps")
        assert stages.get_row_at(1) == ["teacher", "train", "", "", "", "", "30"] and stages.get_row_at(2)[:3] == ["sft", "eval-phrasing", "0.460"]
        assert steps.get_row_at(1) == ["1", "0.550", "24/32", "6/8", "1", "84"]
        log({"event": "early_stop", "step": 7, "best_step": 3})
        log({"event": "phase", "phase": "GRPO", "state": "done", "seconds": 1024.0})
        log(stage("grpo", 0.62, 62, 0.47, 0.76))
        log({"event": "done", "total_s": 1578.0, "gains": {"eval-phrasing": {
            "sft - base": {"gain": 0.46, "ci": [0.31, 0.61], "tasks": 25, "up": 16, "down": 0},
            "grpo - sft": {"gain": 0.16, "ci": [0.04, 0.29], "tasks": 25, "up": 11, "down": 4}}}})
        screen.poll()
        await pilot.pause()
        assert stages.row_count == 5 and stages.get_row_at(4)[:4] == ["grpo", "eval-phrasing", "0.620", "[0.47, 0.76]"]
        assert stages.get_row_at(3) == ["GRPO", "train", "", "", "", "", "1024"]
        line = text_of(status)
        assert line.startswith("done in 26.3 min") and "grpo − sft +0.16 [+0.04, +0.29]" in line
        assert "GRPO stopped early after step 7 (kept step 3)" in line
        for widget in (title, stages, steps, status):  # everything on an 80×24 terminal
            assert widget.region.height > 0 and widget.region.bottom <= 24 and widget.region.right <= 80

        await pilot.press("left_square_bracket")  # the older run
        await until(pilot, lambda: "pi" in text_of(title), "the older run")
        assert stages.row_count == 1 and steps.row_count == 0 and "seed 1" in text_of(title)
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: "react" in text_of(title), "back to the newest")
        assert stages.row_count == 5
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, LearningScreen), "back home")


async def test_with_no_learning_run_the_screen_says_how_to_start_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    app = ForgetuiApp(tmp_path, refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.push_screen(LearningScreen(tmp_path))
        await pilot.pause()
        assert "no learning run yet" in text_of(app.screen.query_one("#learning-title", Static))
        assert "--recipe examples/learn/react.toml" in text_of(app.screen.query_one("#learning-status", Static))


def test_an_early_stop_that_kept_the_start_says_so() -> None:
    from forgetui.learning_events import LearningState
    from forgetui.tui.screens.learning import gains_line

    state = LearningState(done={"total_s": 600.0, "gains": {}}, early_stop={"event": "early_stop", "step": 7, "best_step": -1})
    assert "GRPO stopped early after step 7 (kept SFT)" in gains_line(state)
    state.early_stop = {"event": "early_stop", "step": 7, "best_step": 3}
    assert "(kept step 3)" in gains_line(state)
