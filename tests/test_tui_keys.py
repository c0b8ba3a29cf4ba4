"""Every key the footer shows, on every screen, does something one can see — and the footer shows no other.

Each screen is opened on real stores (written by the real writer; a live one held by a process of its own, so
`x` really stops it); the keys shown (enabled, `show`) must be exactly the ones listed here for that state, and
pressing each changes what its check reads: a screen, a tab, a table's rows, a mark, a file, a process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest

from forgetui.tui.app import ForgetuiApp
from forgetui.tui.screens.compare_screen import CompareScreen
from forgetui.tui.screens.confirm import Confirm
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.rollout_screen import FIRST_CALLS, RolloutScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.widgets.calls_table import CallsTable
from forgetui.tui.widgets.filter_bar import FilterBar
from forgetui.tui.widgets.result_table import ResultTable
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.sql_console import SqlConsole
from forgetui.tui.widgets.token_view import TokenView
from tests.tui_helpers import until as until_shown
from tests.tui_stores import build_run

HOLD_LIVE = """
import sys, time
from core.store.writer import Store
store = Store.open(sys.argv[1])
store.insert_run("live-run", {"env": {"name": "toy"}}, status="running")
store.flush()
store.serve_queries()
print("serving", flush=True)
time.sleep(120)
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    build_run(tmp_path, "eval-run", tasks=2, samples=2)
    build_run(tmp_path, "train-run", tasks=2, samples=2, steps=2)
    build_run(tmp_path, "long-run", tasks=1, samples=1, calls=FIRST_CALLS + 2)
    build_run(tmp_path, "failed-run", tasks=0, status="failed")
    return tmp_path


@pytest.fixture
def live_writer(home: Path):
    """A process of its own holding a run's store live (its writer serves queries), as a running run does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LIVE, str(home / "runs" / "live-run" / "store.duckdb")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
    yield proc
    proc.kill()
    proc.wait()


def shown_keys(app: ForgetuiApp) -> set[str]:
    """The keys the footer shows now, enabled (a disabled one would be drawn dim: none is)."""
    return {b.binding.key for b in app.screen.active_bindings.values() if b.binding.show and b.enabled}


until = partial(until_shown, tries=600)


Check = Callable[[], Awaitable[None]]


async def test_every_footer_key_on_every_screen_changes_something(home: Path, live_writer) -> None:
    app = ForgetuiApp(refresh_s=0.3, stores_refresh_s=0.5)
    async with app.run_test(size=(160, 48)) as pilot:
        home_screen = app.home_screen
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 5 and any(r.live for r in runs.rows), "five runs, one live")

        async def nothing() -> None:
            await pilot.pause()

        def on(screen_type: type) -> Check:
            async def check() -> None:
                await until(pilot, lambda: isinstance(app.screen, screen_type), f"the {screen_type.__name__}")
            return check

        async def back() -> None:
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is home_screen, "home again")

        async def tab_moved() -> None:
            assert home_screen.active_tab != "tab-runs"

        async def to_runs() -> None:
            home_screen.action_show_tab("tab-runs")  # (← went round to the SQL tab, whose editor takes digits)
            await until(pilot, lambda: home_screen.active_tab == "tab-runs" and runs.has_focus, "the Runs tab")

        async def help_shown() -> None:
            await until(pilot, lambda: app.screen.query("HelpPanel"), "the keys panel")

        async def help_hidden() -> None:
            await pilot.press("question_mark")
            await until(pilot, lambda: not app.screen.query("HelpPanel"), "the keys panel closed")

        def select(run_id: str) -> None:
            runs.cursor = next(i for i, r in enumerate(runs.shown) if r.run_id == run_id)

        # ---- Home, Runs tab, on a failed run: resume, delete, compare, and the list's keys
        select("failed-run")
        await pilot.pause()

        async def filter_open() -> None:
            bar = home_screen.query_one("#tab-runs").query_one(FilterBar)
            await until(pilot, lambda: bar.has_focus and bar.has_class("-shown"), "the filter")

        async def marked() -> None:
            assert runs.marked is not None and runs.marked.run_id == "failed-run"

        async def unmark() -> None:
            await pilot.press("c")  # again on the same run: the mark goes
            assert runs.marked is None

        launched_before = len(app.launched)

        async def resumed() -> None:
            await until(pilot, lambda: len(app.launched) == launched_before + 1, "the resume launched")
            assert app.launched[-1].argv[-3:] == ("--resume", "failed-run", "--no-ui")

        async def sorted_by() -> None:
            assert runs.sort_key == "run" and "sorted by run" in runs.border_subtitle

        async def sort_back() -> None:
            runs.set_sort("created")
            select("failed-run")
            await pilot.pause()

        checks = {
            "n": (on(NewRunScreen), back),
            "slash": (filter_open, back),
            "c": (marked, unmark),
            "R": (resumed, nothing),
            "D": (on(Confirm), back),
            "g": (on(Confirm), back),
            "left": (tab_moved, to_runs),
            "question_mark": (help_shown, help_hidden),
        }
        assert shown_keys(app) == set(checks) | {"q"}, "the Runs tab on a failed run"
        for key, (check, undo) in checks.items():
            await pilot.press(key)
            await check()
            await undo()
            select("failed-run")
            await pilot.pause()
        await pilot.press("S")  # not in the footer (? lists it): still does what it says
        await sorted_by()
        await sort_back()

        # ---- the live run: stop is shown (and resume and delete are not); x stops its process
        select("live-run")
        await pilot.pause()
        assert shown_keys(app) == {"q", "n", "slash", "c", "x", "g", "left", "question_mark"}
        await pilot.press("x")  # asks first, Cancel focused: x Enter stops nothing
        await on(Confirm)()
        assert app.focused.id == "no"
        await pilot.press("enter")
        await pilot.pause(0.3)
        assert live_writer.poll() is None
        await pilot.press("x")
        await on(Confirm)()
        await pilot.press("left", "enter")  # Stop it
        await until(pilot, lambda: live_writer.poll() is not None, "the live run's process stopped", tries=1500)

        # ---- a done run: compare opens with c, c on another
        select("train-run")
        await pilot.pause()
        assert shown_keys(app) == {"q", "n", "slash", "c", "D", "g", "left", "question_mark"}
        await pilot.press("c")
        select("eval-run")
        await pilot.press("c")
        await on(CompareScreen)()
        compare = app.screen
        await until(pilot, lambda: compare.result is not None, "the comparison")
        assert shown_keys(app) == {"escape", "s", "w", "question_mark"}
        await pilot.press("s")
        assert compare.sub_title == "compare eval-run → train-run"
        await until(pilot, lambda: compare.result is not None, "the swapped comparison")
        await pilot.press("question_mark")
        await help_shown()
        await help_hidden()
        await pilot.press("q")  # q steps back from a sub-screen
        await until(pilot, lambda: app.screen is home_screen, "home")

        # ---- the Calls tab: follow, filter, tabs
        select("eval-run")
        await pilot.press("2")
        calls = home_screen.query_one(CallsTable)
        await until(pilot, lambda: calls.row_count > 0 and calls.has_focus, "the calls")
        assert shown_keys(app) == {"f", "q", "n", "slash", "left", "question_mark"}
        await pilot.press("f")
        assert calls.follow and calls.cursor == calls.row_count - 1
        await pilot.press("f")
        assert not calls.follow
        await pilot.press("slash")
        bar = home_screen.query_one("#tab-calls").query_one(FilterBar)
        assert bar.has_focus
        await pilot.press(*"task-1", "enter")
        assert calls.has_focus and calls.row_count == 6 and all("/task-1/" in r.rollout_id for r in calls.shown)
        await pilot.press("slash", "escape")
        assert calls.row_count == 12
        await pilot.press("left")
        assert home_screen.active_tab == "tab-runs"
        await pilot.press("right", "right")
        assert home_screen.active_tab == "tab-rollouts"

        # ---- the Rollouts tab
        assert shown_keys(app) == {"q", "n", "slash", "left", "question_mark"}
        await pilot.press("slash", *"task-1", "enter")
        rollouts = home_screen.query_one("#rollouts-table")
        await until(pilot, lambda: rollouts.row_count == 2, "the filtered rollouts")

        # ---- the SQL tab: the editor has the focus; its keys are the console's
        await pilot.press("right")
        console = home_screen.query_one(SqlConsole)
        await until(pilot, lambda: console.query_one("#sql-input").has_focus, "the editor")
        assert shown_keys(app) == {"f5", "escape"}  # no result yet: no export keys
        await pilot.press("f5")
        table = console.query_one(ResultTable)
        await until(pilot, lambda: table.result is not None, "the result")
        assert shown_keys(app) == {"f5", "f8", "f9", "escape"}
        await pilot.press("f8")
        await until(pilot, lambda: list((home / "runs" / "eval-run" / "exports").glob("*.csv")), "the CSV")
        await pilot.press("f9")
        await until(pilot, lambda: list((home / "runs" / "eval-run" / "exports").glob("*.parquet")), "the Parquet")
        await pilot.press("escape")  # leaves the editor: the screen's keys are back
        assert not console.query_one("#sql-input").has_focus
        assert {"q", "n", "left", "question_mark"} <= shown_keys(app)
        await pilot.press("1")

        # ---- the Run screen
        select("train-run")
        await pilot.press("enter")
        await on(RunScreen)()
        run_screen = app.screen
        await until(pilot, lambda: run_screen.detail is not None, "the run")
        assert shown_keys(app) == {"escape", "r", "slash", "left", "t", "question_mark"}
        first = run_screen.detail
        await pilot.press("r")
        await until(pilot, lambda: run_screen.detail is not first, "reloaded")
        await pilot.press("slash", *"timeout", "enter")
        lines = run_screen.query_one("#run-lines")
        assert lines.has_focus and {lines.row_cells(i)[0] for i in range(lines.row_count)} == {"timeout"}
        await pilot.press("left")
        assert run_screen.query_one("#run-tabs").active == "tab-behaviour"
        await pilot.press("t")
        assert run_screen.query_one("#run-tabs").active == "tab-lines"
        await pilot.press("escape")  # in the filtered table: the filter goes first
        await until(pilot, lambda: lines.row_count > 1, "the filter cleared")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is home_screen, "home")

        # ---- the Rollout screen: a long conversation (m shows all; there is one branch: no b)
        select("long-run")
        await pilot.press("enter")
        await on(RunScreen)()
        await until(pilot, lambda: app.screen.query_one("#run-lines").row_count == 1, "the long run's rollout")
        await pilot.press("enter")
        await on(RolloutScreen)()
        rollout = app.screen
        await until(pilot, lambda: rollout.detail is not None, "the rollout")
        assert shown_keys(app) == {"escape", "left", "m", "slash", "question_mark"}
        await pilot.press("m")
        assert rollout.all_shown and "m" not in shown_keys(app)
        await pilot.press("right")
        assert rollout.query_one("#rollout-tabs").active == "tab-tokens"
        view = rollout.query_one(TokenView)
        assert view.has_focus and shown_keys(app) == {"n", "p", "escape", "slash", "question_mark"}  # ←/→ move a token here
        at = view.cursor
        await pilot.press("n")
        after = view.cursor
        assert after > at
        await pilot.press("p")  # back into the sampled run before
        assert at <= view.cursor < after
        await pilot.press("escape")
        await on(RunScreen)()
        await pilot.press("q")
        await until(pilot, lambda: app.screen is home_screen, "home")

        # ---- the New run form and a dialog: their own keys
        await pilot.press("n")
        await on(NewRunScreen)()
        assert shown_keys(app) == {"escape", "ctrl+s"}
        form = app.screen
        for key, value in {"env.tasks": '["no-such-task"]', "harness.name": "oracle", "runtime.kind": "local"}.items():
            form.query_one(f"#in-{key.replace('.', '-')}").value = value  # a run that stops as it starts
        await pilot.press("ctrl+s")
        await until(pilot, lambda: app.screen is home_screen, "the form closed, the run launched")
        await pilot.press("g")
        await on(Confirm)()
        assert shown_keys(app) == {"escape"}
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is home_screen, "the dialog closed")

        # ---- and q quits from home (asking first about the run launched here, if it still runs)
        await pilot.press("q")
        if isinstance(app.screen, Confirm):
            await pilot.press("right", "enter")  # stop it and quit
        await until(pilot, lambda: app.return_code is not None, "the app exited")
