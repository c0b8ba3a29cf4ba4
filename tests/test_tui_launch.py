"""Launching from the TUI: the new-run form (pydantic errors inline), a run started as its own headless process
(scripted policy, real Docker sandboxes) watched to the end, one left running when the TUI quits, re-attached
by a new TUI from its store and stopped from there; delete asks first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from textual.widgets import Input, Static

from core.config import load_config
from core.models.tiny import ensure_tiny_model
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.runs_table import RunsTable
from tests.tui_stores import build_run

SESSION_HOME = Path(os.environ["FORGETUI_HOME"])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(ensure_tiny_model(SESSION_HOME / "models").parent, target_is_directory=True)
    monkeypatch.setenv("FORGETUI_HOME", str(home))
    return home


def text_of(widget: Static) -> str:
    content = widget.content
    return getattr(content, "plain", None) or str(content)


async def until(pilot, cond, what: str, tries: int = 600, step: float = 0.1) -> None:
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(step)
    raise AssertionError(f"the TUI never reached: {what}")


async def fill(pilot, screen: NewRunScreen, values: dict[str, str]) -> None:
    for key, value in values.items():
        screen.query_one(f"#in-{key.replace('.', '-')}", Input).value = value
    await pilot.pause()


async def test_new_run_form_shows_errors_inline_and_saves_valid_toml(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    answers: list[Path | None] = []
    async with app.run_test(size=(120, 48)) as pilot:
        await pilot.pause()
        app.push_screen(NewRunScreen(home / "tui" / "configs"), answers.append)
        await pilot.pause()
        form = app.screen
        await fill(pilot, form, {"run.n_samples": "0", "runtime.kind": "bogus", "env.name": "toy", "train.trainer": "ppo"})
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert "greater than or equal to 1" in text_of(form.query_one("#err-run-n_samples", Static))
        assert "auto" in text_of(form.query_one("#err-runtime-kind", Static))  # pydantic lists the choices
        assert "sft" in text_of(form.query_one("#err-train-trainer", Static))
        assert text_of(form.query_one("#err-env-name", Static)) == ""
        assert isinstance(app.screen, NewRunScreen) and not answers
        await fill(pilot, form, {"run.n_samples": "3", "runtime.kind": "local", "env.tasks": '["hello"]', "train.trainer": "local",
                                 "train.steps": "2", "train.lora_rank": "8", "train.tasks_per_step": "1"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: answers, "the form closed")
    config = load_config(answers[0])
    assert (config.run.n_samples, config.runtime.kind, config.env.tasks) == (3, "local", ["hello"])
    assert (config.train.steps, config.train.lora_rank, config.train.tasks_per_step) == (2, 8, 1)


async def test_delete_asks_and_removes_the_folder(home: Path) -> None:
    build_run(home, "old-run", tasks=1, samples=1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 1, "the run listed")
        runs.focus()
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        await pilot.press("escape")  # no: nothing happens
        await pilot.pause()
        assert (home / "runs" / "old-run").is_dir()
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question again")
        await pilot.press("enter")  # the first button: Delete
        await until(pilot, lambda: not (home / "runs" / "old-run").exists(), "the folder removed")
        await until(pilot, lambda: runs.row_count == 0, "the run gone from the list")


def run_rows(app: ForgetuiApp) -> dict[str, str]:
    return {r.run_id: r.shown_status for r in app.query_one(RunsTable).runs}


@pytest.mark.slow
async def test_launch_watch_quit_reattach_and_stop(home: Path, base_image: str, script_file) -> None:
    """Two runs launched from the form as `forgetui run --no-ui` processes with real Docker sandboxes."""
    quick = script_file([{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "done"}])
    slow = quick.with_name("slow.json")
    slow.write_text(json.dumps({"turns": [{"tool": "shell", "command": "sleep 120"}, {"text": "done"}]}))
    form_values = {"env.name": "toy", "env.tasks": '["hello"]', "harness.name": "react", "runtime.kind": "docker",
                   "run.n_samples": "1", "run.timeout_s": "300"}

    app = ForgetuiApp(refresh_s=0.5, stores_refresh_s=0.5)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form")
        await fill(pilot, app.screen, {**form_values, "policy.backend": f"scripted:{quick}"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(app.launched) == 1, "the first run launched")
        await until(pilot, lambda: "done" in run_rows(app).values(), "the first run done", tries=1800)
        (done,) = app.query_one(RunsTable).runs
        assert (done.done, done.total, done.pass_rate) == (1, 1, 1.0)
        assert app.launched[0].process.wait(60) == 0

        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen), "the form again")
        await fill(pilot, app.screen, {**form_values, "policy.backend": f"scripted:{slow}"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(app.launched) == 2, "the second run launched")
        await until(pilot, lambda: "running" in run_rows(app).values(), "the second run running", tries=1800)
        second = app.launched[1]
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "asked about the running run")
        await pilot.press("enter")  # Keep running and quit
    assert second.alive(), "the launched run must outlive the TUI"

    app = ForgetuiApp(refresh_s=0.5, stores_refresh_s=0.5)
    async with app.run_test(size=(160, 48)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: "running" in run_rows(app).values(), "the running run re-attached")
        running = next(i for i, r in enumerate(runs.shown) if r.shown_status == "running")
        assert runs.shown[running].live
        runs.focus()
        runs.move_cursor(row=running)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "its Run screen")
        lines = app.screen.query_one(RolloutLines)
        await until(pilot, lambda: lines.row_count == 1, "its rollout")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RunScreen), "home")
        runs.focus()
        await pilot.press("x")
        await until(pilot, lambda: not second.alive(), "the run process ended", tries=1200)
        await until(pilot, lambda: "interrupted" in run_rows(app).values(), "the run marked interrupted")
