"""SVG snapshots (pytest-textual-snapshot) of each screen at 80×24 and 160×48, on a fixed store.

Update after an intended change: `.venv/bin/pytest tests/test_tui_snapshots.py --snapshot-update`, then look at
the SVGs under tests/__snapshots__/test_tui_snapshots/ (and the report a failing run writes) before committing."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import duckdb
import pytest

from core.models.resolve import load_tokenizer, resolve_model
from core.models.tiny import ensure_tiny_model
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.launcher import launched_dir, write_record
from forgetui.tui.screens.compare_screen import CompareScreen
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.source import RunSource
from forgetui.tui.widgets.behaviour_table import BehaviourTable
from forgetui.tui.widgets.result_table import ResultTable
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.sql_console import SqlConsole
from forgetui.tui.widgets.token_view import TokenView
from forgetui.tui.widgets.train_curves import TrainCurves
from tests.tui_helpers import until as until_shown
from tests.tui_stores import T0, build_run

SESSION_HOME = Path(os.environ["FORGETUI_HOME"])
HOME = Path("/tmp/forgetui-tui-snapshots")  # fixed paths: they show on screen
EMPTY_HOME = Path("/tmp/forgetui-tui-snapshots-empty")
SIZES = {"80x24": (80, 24), "160x48": (160, 48)}
WHY = "no env named 'toyy' (known: claw-bench, desktop, harbor, miniwob, toy); a third-party one registers the entry point group 'forgetui.envs'"


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
    # a run launched from the TUI that failed as it started (its env misspelled), older than the others
    path = build_run(HOME, "failed-run", tasks=0, status="failed")
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE runs SET created_at = ?", [T0 - dt.timedelta(days=1)])
    launched_dir(HOME).mkdir(parents=True)
    write_record(launched_dir(HOME) / "20251231-120000-000000.json", {
        "args": ["run", "new.toml", "--no-ui"], "log": str(launched_dir(HOME) / "20251231-120000-000000.log"),
        "started_at": T0.timestamp() - 86400, "pid": 1, "run_id": "failed-run", "exit_code": 2, "errors": [WHY]})
    for n, path in enumerate(sorted(HOME.glob("runs/*/store.duckdb"))):
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    return HOME


@pytest.fixture
def app(snapshot_home: Path, monkeypatch: pytest.MonkeyPatch) -> ForgetuiApp:
    monkeypatch.setenv("FORGETUI_HOME", str(snapshot_home))
    return ForgetuiApp(refresh_s=3600, stores_refresh_s=3600)


def runs_listed(app: ForgetuiApp) -> bool:
    return app.query_one(RunsTable).row_count == 3


async def until(pilot, cond) -> None:
    """Until `cond()` holds, then until the screen has settled (tables size their columns on a later refresh)."""
    await until_shown(pilot, cond, "the TUI loaded its data", tries=500)
    await pilot.pause(0.3)
    for editor in pilot.app.screen.query("Input, TextArea"):  # a blinking cursor would be on or off by chance
        editor.cursor_blink = False
    await pilot.wait_for_scheduled_animations()
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES)
def test_runs(snap_compare, app: ForgetuiApp, size: str) -> None:
    """Scores first; the failed run's why column (and, on its row, the subtitle) at 160 columns."""
    async def loaded(pilot) -> None:
        await until(pilot, lambda: runs_listed(app))

    assert snap_compare(app, terminal_size=SIZES[size], run_before=loaded)


@pytest.mark.parametrize("size", SIZES)
def test_failed_run(snap_compare, app: ForgetuiApp, size: str) -> None:
    """A run that failed as it started says why on its Run screen."""
    async def opened(pilot) -> None:
        await until(pilot, lambda: runs_listed(app))
        await app.push_screen(RunScreen(RunSource(HOME / "runs" / "failed-run"), refresh_s=3600))
        await until(pilot, lambda: app.screen.detail is not None)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_compare(snap_compare, app: ForgetuiApp, size: str) -> None:
    """c on run A, then c on run B: flips, pass@k / pass^k and behaviour with B − A and intervals, per task."""
    async def compared(pilot) -> None:
        await until(pilot, lambda: runs_listed(app))
        await pilot.press("c", "down", "c")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.result is not None)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=compared)


@pytest.mark.parametrize("size", SIZES)
def test_empty_home(snap_compare, monkeypatch: pytest.MonkeyPatch, size: str) -> None:
    """No run yet: what to do (n, forgetui demo)."""
    shutil.rmtree(EMPTY_HOME, ignore_errors=True)
    EMPTY_HOME.mkdir(parents=True)
    monkeypatch.setenv("FORGETUI_HOME", str(EMPTY_HOME))
    app = ForgetuiApp(refresh_s=3600, stores_refresh_s=3600)

    async def shown(pilot) -> None:
        await until(pilot, lambda: app.query_one("#empty-home").display)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=shown)


@pytest.mark.parametrize("size", SIZES)
def test_run_screen(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def opened(pilot) -> None:
        await until(pilot, lambda: runs_listed(app))
        await app.push_screen(RunScreen(RunSource(HOME / "runs" / "train-run"), refresh_s=3600))
        await until(pilot, lambda: app.screen.query_one(RolloutLines).row_count == 24)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", ["tab-curves", "tab-behaviour"])
def test_run_screen_tabs(snap_compare, app: ForgetuiApp, size: str, tab: str) -> None:
    async def opened(pilot) -> None:
        await until(pilot, lambda: runs_listed(app))
        await app.push_screen(RunScreen(RunSource(HOME / "runs" / "train-run"), refresh_s=3600))
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
        await until(pilot, lambda: runs_listed(app))
        app.push_screen(NewRunScreen(HOME / "tui" / "configs"))
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen) and app.screen.query("#in-env-name"))

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_delete_dialog(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def asked(pilot) -> None:
        await until(pilot, lambda: runs_listed(app))
        runs = app.query_one(RunsTable)
        runs.cursor = next(i for i, r in enumerate(runs.shown) if r.run_id == "eval-run")
        await pilot.press("D")  # the real question: Keep has the focus
        await until(pilot, lambda: isinstance(app.screen, Confirm))

    assert snap_compare(app, terminal_size=SIZES[size], run_before=asked)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", ["tab-conv", "tab-tokens", "tab-verifier", "tab-raw"])
def test_rollout_screen(snap_compare, app: ForgetuiApp, size: str, tab: str) -> None:
    async def opened(pilot) -> None:
        await until(pilot, lambda: runs_listed(app))
        await app.push_screen(RolloutScreen(RunSource(HOME / "runs" / "eval-run"), "eval-run/task-0/0"))
        await until(pilot, lambda: app.screen.query_one(TokenView).sample is not None)
        app.screen.query_one("#rollout-tabs").active = tab
        if tab == "tab-tokens":
            app.screen.query_one(TokenView).focus()
            await pilot.press("n")

    assert snap_compare(app, terminal_size=SIZES[size], run_before=opened)


@pytest.mark.parametrize("size", SIZES)
def test_sql_console(snap_compare, app: ForgetuiApp, size: str) -> None:
    async def queried(pilot) -> None:
        await until(pilot, lambda: app.home_screen.in_focus is not None)
        await pilot.press("4")
        console = app.query_one(SqlConsole)
        console.sql = "SELECT task_id, status, reward, meta FROM rollouts ORDER BY rollout_id"
        await pilot.press("f5")
        await until(pilot, lambda: app.query_one(ResultTable).row_count > 0)
        app.query_one(ResultTable).focus()

    assert snap_compare(app, terminal_size=SIZES[size], run_before=queried)


def test_store_is_fixed(snapshot_home: Path) -> None:
    """The snapshots' store holds what they show (a changed builder must change them on purpose)."""
    assert RunSource(snapshot_home / "runs" / "train-run").run_detail().report["groups"][0]["samples"] == 20
    assert RunSource(snapshot_home / "runs" / "failed-run").run_detail().reason == WHY
