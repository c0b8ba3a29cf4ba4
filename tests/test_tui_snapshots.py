"""SVG snapshots (pytest-textual-snapshot) of each screen at 80×24 and 160×48, on a fixed store.

Update after an intended change: `.venv/bin/pytest tests/test_tui_snapshots.py --snapshot-update`, then look at
the SVGs under tests/__snapshots__/test_tui_snapshots/ (and the report a failing run writes) before committing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest
from textual.widgets import DataTable, Static

from core.models.resolve import load_tokenizer, resolve_model
from core.models.tiny import ensure_tiny_model
from forgetui.tui import run_data
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.widgets.behaviour_table import BehaviourTable
from forgetui.tui.widgets.result_table import ResultTable
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.sql_console import SqlConsole
from forgetui.tui.widgets.token_view import TokenView
from forgetui.tui.widgets.train_curves import TrainCurves
from tests.tui_stores import T0, build_run

SESSION_HOME = Path(os.environ["FORGETUI_HOME"])
HOME = Path("/tmp/forgetui-tui-snapshots")  # a fixed path: it shows in the header
SIZES = {"80x24": (80, 24), "160x48": (160, 48)}


@pytest.fixture(scope="module")
def snapshot_home() -> Path:
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True)
    (HOME / "models").symlink_to(ensure_tiny_model(SESSION_HOME / "models").parent, target_is_directory=True)
    tokenizer = load_tokenizer(resolve_model("tiny"))
    for run_id, steps in (("eval-run", 0), ("train-run", 4)):
        path = build_run(HOME, run_id, tasks=3, samples=2, steps=steps, tokenizer=tokenizer)
        with duckdb.connect(str(path)) as con:  # fixed times: the Runs table shows them
            con.execute("UPDATE runs SET created_at = ?", [T0])
            con.execute("UPDATE train_steps SET created_at = ?", [T0])
    for n, path in enumerate(sorted(HOME.glob("runs/*/store.duckdb"))):
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    return HOME


@pytest.fixture
def app(snapshot_home: Path, monkeypatch: pytest.MonkeyPatch) -> ForgetuiApp:
    monkeypatch.setenv("FORGETUI_HOME", str(snapshot_home))
    return ForgetuiApp(refresh_s=3600, stores_refresh_s=3600)


async def until(pilot, cond) -> None:
    """Until `cond()` holds, then until the screen has settled (tables size their columns on a later refresh)."""
    for _ in range(500):
        if cond():
            await pilot.pause(0.3)
            await pilot.wait_for_scheduled_animations()
            await pilot.pause(0.2)
            return
        await pilot.pause(0.02)
    raise AssertionError("the TUI never loaded its data")


@pytest.mark.parametrize("size", SIZES)
def test_runs(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def loaded(pilot) -> None:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2 and app.store is not None)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=loaded)


@pytest.mark.parametrize("size", SIZES)
def test_run_screen(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def opened(pilot) -> None:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2)
        await app.push_screen(RunScreen(run_data.RunSource(HOME / "runs" / "train-run"), refresh_s=3600))
        await until(pilot, lambda: app.screen.query_one(RolloutLines).row_count == 24)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", ["tab-curves", "tab-behaviour"])
def test_run_screen_tabs(snap_compare, app: ForgetuiApp, size: str, tab: str) -> None:
    async def opened(pilot) -> None:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2)
        await app.push_screen(RunScreen(run_data.RunSource(HOME / "runs" / "train-run"), refresh_s=3600))
        await until(pilot, lambda: app.screen.query_one(RolloutLines).row_count == 24)
        app.screen.query_one("#run-tabs").active = tab
        if tab == "tab-behaviour":
            await until(pilot, lambda: app.screen.query_one(BehaviourTable).row_count > 0)
        else:
            await until(pilot, lambda: app.screen.query_one(TrainCurves).border_subtitle == "4 steps")

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_new_run_form(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def opened(pilot) -> None:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2)
        app.push_screen(NewRunScreen(HOME / "tui" / "configs"))
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen))

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_delete_dialog(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def asked(pilot) -> None:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2)
        app.push_screen(Confirm("Delete run eval-run and everything it recorded?"))
        await until(pilot, lambda: isinstance(app.screen, Confirm))

    assert snap_compare(app, terminal_size=SIZES[size], run_before=asked)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", ["tab-conv", "tab-tokens", "tab-verifier", "tab-raw"])
def test_rollout_screen(snap_compare, app: ForgetuiApp, size: str, tab: str) -> None:
    async def opened(pilot) -> None:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2)
        await app.push_screen(RolloutScreen(run_data.RunSource(HOME / "runs" / "eval-run"), "eval-run/task-0/0"))
        await until(pilot, lambda: app.screen.query_one(TokenView).sample is not None)
        app.screen.query_one("#rollout-tabs").active = tab
        if tab == "tab-tokens":
            app.screen.query_one(TokenView).focus()
            await pilot.press("n")

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_sql_console(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def queried(pilot) -> None:
        await until(pilot, lambda: app.store is not None)
        await pilot.press("e")
        console = app.query_one(SqlConsole)
        console.sql = "SELECT task_id, status, reward, meta FROM rollouts ORDER BY rollout_id"
        await pilot.press("f5")
        await until(pilot, lambda: app.query_one(ResultTable).row_count > 0)
        app.query_one(ResultTable).focus()

    assert snap_compare(app, terminal_size=SIZES[size], run_before=queried)


def test_store_is_fixed(snapshot_home: Path) -> None:
    """The snapshots' store holds what they show (a changed builder must change them on purpose)."""
    assert run_data.load_run(run_data.RunSource(snapshot_home / "runs" / "train-run")).report["groups"][0]["samples"] == 20
    assert DataTable and Static  # imported for the helpers above
