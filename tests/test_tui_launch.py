"""Launching from the TUI: the new-run form (the config checked as `forgetui run` loads it, errors under their
fields, every character typed fast in its field), a failed launch saying why on its Run screen and in the Runs
list, a run started as its own headless process (scripted policy, real Docker sandboxes) watched to the end,
one left running when the TUI quits, re-attached by a new TUI from its store and stopped from there; delete
and gc ask first."""

from __future__ import annotations

import json
import os
import unicodedata
from functools import partial
from pathlib import Path

import pytest
from textual import events
from textual.keys import _character_to_key, _get_unicode_name_from_key
from textual.widgets import Input, Static

from core.config import load_config
from core.models.tiny import ensure_tiny_model
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.run_form import KEYS
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.runs_table import RunsTable
from tests.tui_helpers import text_of
from tests.tui_helpers import until as until_shown
from tests.tui_stores import build_run

SESSION_HOME = Path(os.environ["FORGETUI_HOME"])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(ensure_tiny_model(SESSION_HOME / "models").parent, target_is_directory=True)
    monkeypatch.setenv("FORGETUI_HOME", str(home))
    return home


until = partial(until_shown, tries=600, step=0.1)  # a launch starts a process: up to a minute


async def fill(pilot, screen: NewRunScreen, values: dict[str, str]) -> None:
    for key, value in values.items():
        screen.query_one(f"#in-{key.replace('.', '-')}", Input).value = value
    await pilot.pause()


def key_event(key: str) -> events.Key:
    """The Key event a terminal sends for `key` (a key name, or one character), as Textual's pilot builds it."""
    try:
        char: str | None = unicodedata.lookup(_get_unicode_name_from_key(key))
    except KeyError:
        char = key if len(key) == 1 else None
    return events.Key(key, char)


async def open_form(app: ForgetuiApp, pilot, home: Path, answers: list[Path | None]) -> NewRunScreen:
    """The New run form; what it answers (the saved config, or None) goes to `answers`."""
    await pilot.pause()
    app.push_screen(NewRunScreen(home / "tui" / "configs"), answers.append)
    await until(pilot, lambda: isinstance(app.screen, NewRunScreen) and app.screen.query("#in-env-name"), "the form")
    return app.screen


def field(screen: NewRunScreen, key: str) -> Input:
    return screen.query_one(f"#in-{key.replace('.', '-')}", Input)


def error_of(screen: NewRunScreen, key: str) -> str:
    return text_of(screen.query_one(f"#err-{key.replace('.', '-')}", Static))


async def test_new_run_form_shows_errors_inline_and_saves_valid_toml(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    answers: list[Path | None] = []
    async with app.run_test(size=(120, 48)) as pilot:
        form = await open_form(app, pilot, home, answers)
        await fill(pilot, form, {"run.n_samples": "0", "runtime.kind": "bogus", "env.name": "toy"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: error_of(form, "run.n_samples"), "the errors shown")
        assert "greater than or equal to 1" in error_of(form, "run.n_samples")
        assert "auto" in error_of(form, "runtime.kind")  # pydantic lists the choices
        assert error_of(form, "env.name") == ""
        assert isinstance(app.screen, NewRunScreen) and not answers
        await fill(pilot, form, {"run.n_samples": "3", "runtime.kind": "local", "env.tasks": '["hello"]', "train.trainer": "local",
                                 "train.steps": "2", "train.lora_rank": "8", "train.tasks_per_step": "1"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: answers, "the form closed")
    config = load_config(answers[0])
    assert (config.run.n_samples, config.runtime.kind, config.env.tasks) == (3, "local", ["hello"])
    assert (config.train.steps, config.train.lora_rank, config.train.tasks_per_step) == (2, 8, 1)


async def test_the_form_refuses_names_a_run_would_fail_on(home: Path, tmp_path: Path) -> None:
    """An env, harness or backend that does not exist is an error under its field before anything launches (a
    typo such as `toyy` used to launch, fail, and show only `failed`); so is a base file that is not TOML."""
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    answers: list[Path | None] = []
    async with app.run_test(size=(120, 48)) as pilot:
        form = await open_form(app, pilot, home, answers)
        await fill(pilot, form, {"env.name": "toyy", "harness.name": "reactt", "policy.backend": "scripted:no-such.json",
                                 "train.trainer": "ppo"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: error_of(form, "env.name"), "the name errors")
        assert "no env named 'toyy'" in error_of(form, "env.name") and "toy" in error_of(form, "env.name")
        assert "no harness named 'reactt'" in error_of(form, "harness.name")
        assert "no file at no-such.json" in error_of(form, "policy.backend")
        assert "no trainer named 'ppo'" in error_of(form, "train.trainer") and "sft" in error_of(form, "train.trainer")
        assert form.query_one("#in-env-name").has_focus  # the first field in error
        await fill(pilot, form, {"env.name": "toy", "harness.name": "react", "policy.backend": "vllm", "train.trainer": ""})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "backend spec" in error_of(form, "policy.backend"), "the backend spec error")
        assert error_of(form, "env.name") == "" and error_of(form, "harness.name") == ""
        bad = tmp_path / "bad.toml"
        bad.write_text("[env\nname = 1")
        await fill(pilot, form, {"policy.backend": "", "base": str(bad)})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "not valid TOML" in error_of(form, "base"), "the base file's error")
        assert not answers and not list((home / "tui" / "launched").glob("*.json"))  # nothing launched


async def test_the_form_checks_adapter_options_as_a_run_would(home: Path, tmp_path: Path) -> None:
    """The base config's harness and env options are checked against the adapters' typed Options
    (core.registry.check_options, building nothing) before anything launches: a bad value names its option under
    the harness field, an option the env does not take under the env field; the same options for the adapter they
    fit are accepted."""
    base = tmp_path / "base.toml"
    base.write_text('[env]\nname = "toy"\n[env.options]\npath = "/x"\n'
                    '[harness]\nname = "react"\n[harness.options]\nmax_steps = "many"\n')
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    answers: list[Path | None] = []
    async with app.run_test(size=(120, 48)) as pilot:
        form = await open_form(app, pilot, home, answers)
        await fill(pilot, form, {"base": str(base), "runtime.kind": "local"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: error_of(form, "harness.name"), "the option errors")
        assert "harness.options.max_steps" in error_of(form, "harness.name") and "integer" in error_of(form, "harness.name")
        assert "env 'toy' has no option 'path'" in error_of(form, "env.name") and "seed" in error_of(form, "env.name")
        assert not answers
        base.write_text('[env]\nname = "toy"\n[env.options]\nseed = 3\n[harness]\nname = "react"\n[harness.options]\nmax_steps = 4\n')
        await pilot.press("ctrl+s")
        await until(pilot, lambda: answers, "the form closed")
    config = load_config(answers[0])
    assert (config.env.options, config.harness.options) == ({"seed": 3}, {"max_steps": 4})


async def test_typed_fast_and_pasted_every_field_holds_its_own_text(home: Path) -> None:
    """Keys delivered all at once (tmux, a paste, a quick typist) land in the field they were typed in: the first
    field has the focus when the form opens, and Tab moves it before the next keys are delivered."""
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.home_screen.query_one("#empty-home").display, "the empty home")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen) and app.screen.query("#in-env-name"), "the form")
        form = app.screen
        assert form.focused is field(form, "env.name")  # the first field has the focus as the form opens
        typed = {"env.name": "toy", "env.tasks": '["hello", "rename"]', "env.limit": "2", "harness.name": "react",
                 "policy.backend": "builtin:tiny"}
        keys: list[str] = []
        for n, value in enumerate(typed.values()):
            keys += [_character_to_key(c) if not c.isalnum() else c for c in value]
            if n < len(typed) - 1:
                keys.append("tab")
        for key in keys:  # every key queued before the first is handled, as a terminal delivers a burst
            app._driver.send_message(key_event(key))
        await until(pilot, lambda: field(form, "policy.backend").value == "builtin:tiny", "the last field typed", tries=100)
        assert {key: field(form, key).value for key in typed} == typed
        assert all(field(form, key).value == "" for key in KEYS if key not in typed)
        field(form, "run.n_samples").focus()
        await pilot.pause()
        app._driver.send_message(events.Paste("run.n_samples=4\ntrain.steps = 2\nrun.concurrency=8\n"))
        await until(pilot, lambda: field(form, "train.steps").value == "2", "the pasted lines in their fields")
        assert (field(form, "run.n_samples").value, field(form, "run.concurrency").value) == ("4", "8")
        field(form, "harness.name").value = ""
        field(form, "harness.name").focus()
        await pilot.pause()
        app._driver.send_message(events.Paste("mini-swe-agent"))  # a plain value lands whole in the focused field
        await until(pilot, lambda: field(form, "harness.name").value == "mini-swe-agent", "the pasted value")
        assert field(form, "env.name").value == "toy"


async def test_a_failed_launch_says_why(home: Path) -> None:
    """Launched from the form, a run that fails once it started (no task matches) says why: on its Run screen,
    under the Runs list while it is selected, and in its row's why column."""
    build_run(home, "older-run", tasks=1, samples=1)  # the run under the cursor before the launch
    app = ForgetuiApp(refresh_s=0.5, stores_refresh_s=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.selected is not None and runs.selected.run_id == "older-run", "the older run")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen) and app.screen.query("#in-env-name"), "the form")
        await fill(pilot, app.screen, {"env.name": "toy", "env.tasks": '["no-such-task"]', "harness.name": "oracle",
                                       "runtime.kind": "local"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(app.launched) == 1, "the run launched")
        await until(pilot, lambda: any(r.status == "failed" and r.reason for r in runs.rows), "the run failed", tries=900)
        (failed,) = [r for r in runs.rows if r.status == "failed"]
        assert "no task of env 'toy' matches ['no-such-task']" in failed.reason
        assert failed.cells()["why"].startswith("no task of env 'toy'")
        # the cursor went to the new run by itself, and the Calls, Rollouts and SQL tabs follow it
        await until(pilot, lambda: runs.selected is not None and runs.selected.run_id == failed.run_id, "the new run selected")
        await until(pilot, lambda: app.home_screen.in_focus is not None and app.home_screen.in_focus[1] == failed.run_id,
                    "the new run in focus")
        assert app.home_screen.sub_title == f"run {failed.run_id}"
        assert runs.border_subtitle.startswith("why: no task of env 'toy' matches")  # at 80 columns too
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "its Run screen")
        summary = app.screen.query_one("#run-summary-text", Static)
        await until(pilot, lambda: "why: no task of env 'toy' matches ['no-such-task']" in text_of(summary), "the reason")
        assert app.launched[0].process.wait(30) == 2


async def test_a_launch_refused_before_it_made_a_run_is_listed_with_why(home: Path) -> None:
    """`forgetui run --resume` of a run that is not there ends before any run folder exists: the Runs list still
    shows the launch, refused, with the CLI's words; Enter shows them with the output's path, and it can go."""
    from forgetui.tui import launcher

    started = launcher.launch(["run", "--resume", "no-such-run", "--no-ui"], home)
    assert started.process.wait(120) == 2
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 1, "the launch listed")
        (row,) = runs.rows
        assert (row.kind, row.status) == ("launch", "refused") and "no run 'no-such-run' to resume" in row.reason
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "its reason")
        assert str(started.log_path) in app.screen.question and "no run 'no-such-run'" in app.screen.question
        await pilot.press("right", "enter")  # Forget it
        await until(pilot, lambda: runs.row_count == 0, "the launch gone")
    assert not started.record_path.exists() and not started.log_path.exists()


async def test_delete_asks_and_removes_the_folder(home: Path) -> None:
    build_run(home, "old-run", tasks=1, samples=1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 1, "the run listed")
        assert runs.has_focus
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        await pilot.press("escape")  # no: nothing happens
        await pilot.pause()
        assert (home / "runs" / "old-run").is_dir()
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question again")
        assert app.focused.id == "no"  # the safe answer has the focus: D Enter deletes nothing
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, Confirm), "the question answered")
        await pilot.pause(0.3)
        assert (home / "runs" / "old-run").is_dir()
        await pilot.press("D")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question a third time")
        await pilot.press("left", "enter")  # Delete
        await until(pilot, lambda: not (home / "runs" / "old-run").exists(), "the folder removed")
        await until(pilot, lambda: runs.row_count == 0, "the run gone from the list")


def run_rows(app: ForgetuiApp) -> dict[str, str]:
    return {r.run_id: r.shown_status for r in app.query_one(RunsTable).rows if r.kind == "run"}


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
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen) and app.screen.query("#in-env-name"), "the form")
        await fill(pilot, app.screen, {**form_values, "policy.backend": f"scripted:{quick}"})
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(app.launched) == 1, "the first run launched")
        await until(pilot, lambda: "done" in run_rows(app).values(), "the first run done", tries=1800)
        (done,) = [r for r in app.query_one(RunsTable).rows if r.kind == "run"]
        assert (done.done, done.total, done.pass_rate) == (1, 1, 1.0)
        assert app.launched[0].process.wait(60) == 0

        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen) and app.screen.query("#in-env-name"), "the form again")
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
        runs.cursor = running
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "its Run screen")
        lines = app.screen.query_one(RolloutLines)
        await until(pilot, lambda: lines.row_count == 1, "its rollout")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RunScreen), "home")
        assert runs.has_focus and app.home_screen.check_action("stop", ()) is True
        await pilot.press("x")  # asks first; Cancel has the focus
        await until(pilot, lambda: isinstance(app.screen, Confirm), "asked before stopping")
        await pilot.press("left", "enter")  # Stop it
        await until(pilot, lambda: not second.alive(), "the run process ended", tries=1200)
        await until(pilot, lambda: "interrupted" in run_rows(app).values(), "the run marked interrupted")
