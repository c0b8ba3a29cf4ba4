"""The live run dashboard: a real run on the LOCAL runtime driven through the TUI, stopping it, and the Rollouts tab."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from functools import partial
from pathlib import Path

import pytest
from textual.widgets import Static

from core.config import load_config
from core.models.tiny import ensure_tiny_model
from core.status import Tally
from core.store.query import run_query
from core.store.writer import Store
from forgetui.tui.app import ForgetuiApp, ended_line
from forgetui.tui.progress import LiveState, RunProgress
from forgetui.tui.rows import RolloutRow, rollout_from_event
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.widgets.live_run import LiveRun
from forgetui.tui.widgets.reward_chart import RewardChart, block_chart
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.runs_table import RunsTable
from tests.tui_helpers import text_of, until
from tests.tui_stores import build_run

SESSION_HOME = Path(os.environ["FORGETUI_HOME"])  # conftest's shared home, where the tiny model is built once


@pytest.fixture
def run_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty FORGETUI_HOME that shares the session's built models (no rebuild per test)."""
    models = ensure_tiny_model(SESSION_HOME / "models").parent
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(models, target_is_directory=True)
    monkeypatch.setenv("FORGETUI_HOME", str(home))
    return home


def make_config(command: str, n_samples: int = 2):
    config = load_config(None, ["env.name=toy", 'env.tasks=["hello"]', "harness.name=tests.harness_fixtures:ShellHarness",
                                "runtime.kind=local", "policy.backend=builtin:tiny", f"run.n_samples={n_samples}"])
    config.harness.options = {"command": command}
    return config


wait_for = partial(until, tries=600, step=0.05)  # a run starts sandboxes: up to 30 s


def sandbox_pids(run_id: str) -> list[int]:
    """Processes started in a LOCAL sandbox of `run_id` (the runtime exports FORGETUI_SANDBOX_ROOT to them)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"FORGETUI_SANDBOX_ROOT=" in env and run_id.encode() in env:
            pids.append(int(proc.name))
    return pids


# ---------------------------------------------------------------------- the merged progress state (no textual)
def lines(table: RolloutLines) -> list[list[str]]:
    return [table.row_cells(i) for i in range(table.row_count)]


def test_progress_merges_events_and_polls() -> None:
    p = RunProgress()
    p.start("r1", Path("/x/store.duckdb"), 3, now=100.0)
    pending = [RolloutRow(f"r1/t/{i}", "r1", "t", i, status="pending", attempt=0) for i in range(3)]
    p.apply_rows(pending)
    assert p.tally() == Tally()
    ev = rollout_from_event("r1/t/1", "t", "done", 1.0, True, None)
    assert (ev.run_id, ev.task_id, ev.sample_index) == ("r1", "t", 1)
    p.apply_event(ev)
    p.apply_rows([RolloutRow("r1/t/1", "r1", "t", 1, status="verifying", attempt=1)])  # a poll older than the event
    assert p.rows["r1/t/1"].status == "done" and p.rows["r1/t/1"].attempt == 1 and p.rows["r1/t/1"].reward == 1.0
    p.apply_event(rollout_from_event("r1/t/0", "t", "done", 0.0, False, None))
    p.apply_event(rollout_from_event("r1/t/2", "t", "infra_error", None, None, "boom"))
    # core's outcomes: a `done` rollout that did not pass is below the threshold, not "failed"
    assert p.tally() == Tally(passed=1, below_threshold=1, infra_error=1)
    assert p.rows["r1/t/0"].outcome == "below_threshold"
    assert p.rewards == [1.0, 0.0]  # infra errors are no scores
    assert p.reward_curve() == [1.0, 0.5]
    assert p.rollouts_per_min(now=160.0) == pytest.approx(3.0)
    p.apply_calls(10, now=100.0)
    p.apply_calls(30, now=110.0)
    assert (p.n_calls, p.calls_per_s) == (30, pytest.approx(2.0))
    assert [r.sample_index for r in p.sorted_rows()] == [0, 1, 2]


def test_resumed_rows_count_but_not_as_throughput() -> None:
    p = RunProgress()
    p.start("r2", Path("/s"), 2, now=0.0)
    p.apply_rows([RolloutRow("r2/t/0", "r2", "t", 0, status="done", reward=1.0, passed=True, attempt=0),
                  RolloutRow("r2/t/1", "r2", "t", 1, status="pending", attempt=0)])
    assert p.tally().finished == 1 and p.rewards == [1.0]
    assert p.rollouts_per_min(now=60.0) == 0.0


def test_block_chart_and_cells() -> None:
    chart = block_chart([0.0, 0.5, 1.0], width=3, height=2).plain.split("\n")
    assert chart == ["  █", " ██"]
    assert len(block_chart([1.0] * 100, width=10, height=1).plain) == 10
    row = RolloutRow("r/t/0", "r", "t", 0, status="failed", reward=0.25, passed=False, attempt=2, error="x" * 500)
    cells = row.cells()
    assert (cells["outcome"], cells["task"], cells["reward"], cells["attempt"]) == ("harness_failed", "t", "0.25", "2")
    assert len(cells["error"]) == 160


# ---------------------------------------------------------------------- a real run in the TUI
async def test_live_run_to_the_summary(run_home: Path) -> None:
    app = ForgetuiApp(run_config=make_config("echo hi > hello.txt"), refresh_s=1.0, stores_refresh_s=2.0,
                      run_refresh_s=0.5)
    async with app.run_test(size=(180, 50)) as pilot:
        live = app.query_one(LiveRun)
        table = live.query_one("#live-rollouts", RolloutLines)
        counts = live.query_one("#live-counts", Static)
        await wait_for(pilot, lambda: live.state == LiveState.DONE and "2/2 finished" in text_of(counts)
                       and all(r[5] == "0" for r in lines(table)), "2/2 done with the final rows")
        run_id = live.progress.run_id
        store = run_home / "runs" / run_id / "store.duckdb"
        assert live.progress.store == store
        assert "passed 2" in text_of(counts) and "below threshold 0" in text_of(counts)
        assert sorted(r[:6] for r in lines(table)) == [["passed", "hello", "0", "0", "1", "0"],
                                                        ["passed", "hello", "1", "0", "1", "0"]]
        summary = text_of(live.query_one("#live-summary", Static))
        assert "2 rollouts: passed 2" in summary and "mean reward 1.000" in summary
        assert "pass@1 1.000" in summary and "pass@2 1.000" in summary and "pass^2 1.000" in summary
        header = text_of(live.query_one("#live-header", Static))
        assert run_id in header and "done" in header and str(store) in header
        assert live.progress.reward_curve() == [1.0, 1.0]
        assert "mean reward 1.000 over 2 rollouts" in text_of(app.query_one(RewardChart).query_one("#reward-label", Static))
        throughput = text_of(live.query_one("#live-throughput", Static))
        assert "rollouts/min" in throughput and "0 calls recorded" in throughput  # the shell harness asks no model
        assert live.progress.rollouts_per_min(live.progress.started + 60) == 2.0
        # the other tabs follow the run: its Rollouts tab shows the same rows
        assert app.home_screen.in_focus is not None and app.home_screen.in_focus[1] == run_id
        await pilot.press("3")
        browser = app.query_one("#rollouts-table", RolloutLines)
        await wait_for(pilot, lambda: browser.row_count == 2, "the Rollouts tab filled")
        assert browser.border_title == f"Rollouts of {run_id}"
        assert app.is_running  # the dashboard stays open until q
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app exited")
    assert app.return_value == 0
    assert run_query(store, "SELECT status FROM runs").rows == [["done"]]


async def test_q_asks_then_stops_the_run_and_removes_sandboxes(run_home: Path) -> None:
    build_run(run_home, "older-run", tasks=2, samples=1)  # an earlier run: neither `3` nor the title may show it
    app = ForgetuiApp(run_config=make_config("sleep 30"), refresh_s=1.0, stores_refresh_s=0.3, run_refresh_s=0.5,
                      exit_delay_s=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        live = app.query_one(LiveRun)
        await wait_for(pilot, lambda: live.progress.run_id is not None and len(sandbox_pids(live.progress.run_id)) >= 2,
                       "both sandboxes running `sleep 30`", tries=1200)
        run_id = live.progress.run_id
        await wait_for(pilot, lambda: "running" in {r[0] for r in lines(live.query_one(RolloutLines))},
                       "the dashboard shows running rollouts")
        runs = app.query_one(RunsTable)
        await wait_for(pilot, lambda: runs.row_count == 2 and runs.selected.run_id == run_id,
                       "the Runs list lists the live run, its cursor on it")
        await pilot.pause(0.7)  # a few more listings of the runs: the focus stays on this run
        assert app.home_screen.in_focus[1] == run_id and app.home_screen.sub_title == f"run {run_id}"
        await pilot.press("3")
        browser = app.query_one("#rollouts-table", RolloutLines)
        await wait_for(pilot, lambda: browser.row_count == 2, "the live run's rollouts on the Rollouts tab")
        assert browser.border_title == f"Rollouts of {run_id}"
        assert {r[1] for r in lines(browser)} == {"hello"}
        await pilot.press("1", "enter")  # the run's own screen: x stops it (after asking)
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.live, "its Run screen, live")
        assert app.screen.sub_title == f"run {run_id}" and app.screen.check_action("stop", ()) is True
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), "asked before stopping")
        assert app.focused.id == "no"
        await pilot.press("enter", "escape")
        await wait_for(pilot, lambda: app.screen is app.home_screen, "home")
        assert live.state == LiveState.RUNNING
        await pilot.press("0")
        await pilot.press("q")  # asks first; Enter answers the safe choice
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        assert app.focused.id == "cancel" and run_id in str(app.screen.question)
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert live.state == LiveState.RUNNING and app.is_running and len(sandbox_pids(run_id)) >= 2
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, Confirm), "the question again")
        await pilot.press("left", "enter")  # "Stop the run and quit"
        await wait_for(pilot, lambda: live.state == LiveState.INTERRUPTED, "the run interrupted")
        header = text_of(live.query_one("#live-header", Static))
        assert "interrupted" in header and f"--resume {run_id}" in header
        await wait_for(pilot, lambda: app.return_code is not None, "the app exited")
    assert app.return_value == 130
    assert ended_line(app.live_outcome) == (f"forgetui: run {run_id} stopped (exit 130): its sandboxes were removed; "
                                            f"`forgetui run --resume {run_id}` finishes it")
    store = run_home / "runs" / run_id / "store.duckdb"
    assert run_query(store, "SELECT status FROM runs").rows == [["interrupted"]]
    assert sorted(r[0] for r in run_query(store, "SELECT status FROM rollouts").rows) == ["pending", "pending"]
    assert not list((Path(tempfile.gettempdir()) / "forgetui-local").glob(f"forgetui-{run_id}-*"))  # folders reaped
    for _ in range(100):  # SIGKILLed processes may take a moment to be reaped
        if not sandbox_pids(run_id):
            break
        await asyncio.sleep(0.05)
    left = sandbox_pids(run_id)
    for pid in left:  # do not leave them sleeping behind the test session, even when the assert fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} harness process(es) outlived the cancelled run"


async def test_a_failing_run_shows_its_error_and_stays_open(run_home: Path) -> None:
    config = make_config("true")
    config.env.tasks = ["no-such-task"]
    app = ForgetuiApp(run_config=config, refresh_s=1.0, stores_refresh_s=2.0, run_refresh_s=0.5)
    async with app.run_test(size=(180, 50)) as pilot:
        live = app.query_one(LiveRun)
        await wait_for(pilot, lambda: live.state == LiveState.FAILED, "the run failed")
        header = text_of(live.query_one("#live-header", Static))
        assert "failed" in header and "no task of env 'toy' matches ['no-such-task']" in header
        await pilot.pause(0.2)
        assert app.is_running  # the error stays on screen until q
        await pilot.press("q")
        await wait_for(pilot, lambda: app.return_code is not None, "the app exited")
    assert app.return_value == 2


async def test_rollouts_tab_of_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    path = tmp_path / "runs" / "run-x" / "store.duckdb"
    with Store.open(path) as store:
        store.insert_run("run-x", {}, status="done")
        for i, (status, reward, passed, error) in enumerate(
                [("done", 1.0, True, None), ("failed", 0.0, False, "exit 1"), ("infra_error", None, None, "no image"),
                 ("done", 0.0, False, None)]):
            store.upsert_rollout({"rollout_id": f"run-x/t{i}/0", "run_id": "run-x", "task_id": f"t{i}",
                                  "sample_index": 0, "status": status, "reward": reward, "passed": passed,
                                  "attempt": i, "error": error})
        store.flush()
    app = ForgetuiApp(refresh_s=0.2, stores_refresh_s=0.5)
    async with app.run_test(size=(180, 50)) as pilot:
        await wait_for(pilot, lambda: app.home_screen.in_focus is not None, "the run in focus")
        assert app.home_screen.check_action("show_tab", ("tab-live",)) is False  # no run going here: no Run tab
        await pilot.press("3")
        table = app.query_one("#rollouts-table", RolloutLines)
        await wait_for(pilot, lambda: table.row_count == 4, "the Rollouts tab filled")
        assert app.focused is table
        # one outcome vocabulary: core's, the same words the run's counts use
        assert [r[:5] + r[-1:] for r in lines(table)] == [
            ["passed", "t0", "0", "", "1", ""],  # (no step: an eval)
            ["harness_failed", "t1", "0", "", "0", "exit 1"],
            ["infra_error", "t2", "0", "", "", "no image"],
            ["below_threshold", "t3", "0", "", "0", ""],
        ]
        await pilot.press("q")
    assert app.return_value is None and app.return_code == 0


# ---------------------------------------------------------------------- the CLI picks the TUI only on a terminal
@pytest.mark.parametrize(("tty", "no_ui", "expected"), [(True, False, "tui"), (False, False, "headless"),
                                                         (True, True, "headless")])
def test_cmd_run_opens_the_tui_only_on_a_tty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tty: bool,
                                             no_ui: bool, expected: str) -> None:
    import forgetui.headless
    import forgetui.tui.app
    from forgetui.cli import cmd_run

    calls: list[tuple] = []
    monkeypatch.setattr(forgetui.headless, "run_headless", lambda config, **kw: calls.append(("headless", kw)) or 0)
    monkeypatch.setattr(forgetui.tui.app, "run_tui", lambda **kw: calls.append(("tui", kw)) or 0)
    monkeypatch.setattr("sys.stdout.isatty", lambda: tty)
    config = tmp_path / "c.toml"
    config.write_text('[env]\nname = "toy"\n')
    args = argparse.Namespace(command="run", config=str(config), set=["run.n_samples=3"], resume=None, k="1,2",
                              no_ui=no_ui)
    assert cmd_run(args) == 0
    assert [c[0] for c in calls] == [expected]
    kw = calls[0][1]
    assert kw["ks"] == [1, 2] and kw["resume"] is None
    if expected == "tui":
        assert kw["run_config"].run.n_samples == 3 and kw["run_config"].env.name == "toy"
    else:
        assert kw["json_out"] is no_ui


def test_nothing_left_behind_by_the_fixture(run_home: Path) -> None:
    assert (run_home / "models").resolve() == (SESSION_HOME / "models").resolve()
    assert shutil.which("bash")  # the shell harness needs it
