"""Issue 47's findings, each at 80×24 (and 160×48 where the layout differs), on stores written by the real writer:
the token cursor always on screen, honest small plots, `forgetui run`'s TUI, the launch form selecting the new
run, failure reasons, narrow tables, confirm dialogs, headers and the keys users of k9s/lazygit expect."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from textual.widgets import Static, TabbedContent
from textual_plotext import PlotextPlot

from core.models.resolve import load_tokenizer, resolve_model
from core.models.tiny import ensure_tiny_model
from core.store.writer import Store
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.progress import CallRate, RunProgress
from forgetui.tui.screens.compare_screen import CompareScreen
from forgetui.tui.screens.new_run import NewRunScreen
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.source import RunSource
from forgetui.tui.widgets.call_inspector import CallInspector
from forgetui.tui.widgets.calls_table import CallsTable
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.sql_editor import SqlEditor, completions, schema_names
from forgetui.tui.widgets.token_view import TokenView
from forgetui.tui.widgets.train_curves import MIN_PLOT_ROWS, TrainCurves
from tests.tui_helpers import text_of, until
from tests.tui_stores import T0, build_run

SESSION_HOME = Path(os.environ["FORGETUI_HOME"])
SIZES = [(80, 24), (160, 48)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("tiny"))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "models").symlink_to(ensure_tiny_model(SESSION_HOME / "models").parent, target_is_directory=True)
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    return tmp_path


def cursor_lines(view: TokenView) -> list[int]:
    """The rows of the token body, on screen now, that draw the cursor's token (reverse video)."""
    body, scroll = view.query_one("#token-body", Static), view.query_one("#token-scroll")
    top, height = int(scroll.scroll_y), scroll.scrollable_content_region.height
    rows = []
    for y in range(top, min(top + height, body.virtual_size.height or body.size.height)):
        if any(seg.style is not None and seg.style.reverse for seg in body.render_line(y)):
            rows.append(y)
    return rows


# ---------------------------------------------------------------- 1. the token cursor is always on screen
@pytest.mark.parametrize("size", SIZES)
async def test_token_cursor_stays_on_screen(home: Path, tokenizer, size: tuple[int, int]) -> None:
    build_run(home, "long-prompt", tasks=1, samples=1, calls=4, tokenizer=tokenizer, system_tokens=700)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await app.push_screen(RolloutScreen(RunSource(home / "runs" / "long-prompt"), "long-prompt/task-0/0"))
        screen = app.screen
        view = screen.query_one(TokenView)
        await until(pilot, lambda: view.sample is not None, "the sample")
        await pilot.press("right")  # to the Tokens tab
        await pilot.pause()
        assert view.has_focus
        await until(pilot, lambda: bool(cursor_lines(view)), "the first sampled token on screen")
        for key in ("n", "n", "p", "end", "home", "pagedown", "pagedown", "down", "up"):
            await pilot.press(key)
            await pilot.pause()
            await until(pilot, lambda: bool(cursor_lines(view)), f"the cursor on screen after {key}")


# ---------------------------------------------------------------- 2. honest small plots
@pytest.mark.parametrize("size", SIZES)
async def test_training_curves_read_honestly_at_any_size(home: Path, size: tuple[int, int]) -> None:
    build_run(home, "train-run", tasks=2, samples=2, steps=4)  # reward 0.25, 0.45, 0.65, 0.85; loss 0.5/(step+1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await app.push_screen(RunScreen(RunSource(home / "runs" / "train-run"), refresh_s=3600))
        screen = app.screen
        await pilot.pause()
        screen.query_one("#run-tabs", TabbedContent).active = "tab-curves"
        await until(pilot, lambda: screen.query(TrainCurves) and screen.query_one(TrainCurves).border_subtitle == "4 steps",
                    "the curves")
        curves = screen.query_one(TrainCurves)
        await pilot.pause()
        plots = list(curves.query(PlotextPlot))
        lines = curves.query_one("#curve-lines", Static)
        if size == (80, 24):  # each plot would get a few rows: the numbers instead, every metric on its own line
            assert not any(p.display and p.size.height for p in plots) or not curves.query_one("#curve-grid").display
            text = text_of(lines)
            assert lines.display and lines.size.height >= 5
            assert "reward" in text and "0.25 → 0.85" in text and "min 0.25 · max 0.85" in text
            assert "loss" in text and "0.5 → 0.125" in text
        else:  # room enough: every plot has rows for its data, its ticks and its title
            assert not lines.display
            assert all(p.size.height >= MIN_PLOT_ROWS for p in plots)


# ---------------------------------------------------------------- 5. why a run failed, whichever entry point ran it
async def test_a_headless_run_that_failed_before_any_rollout_says_why(home: Path) -> None:
    """`forgetui run --no-ui` (no TUI, no launch record) that fails as it plans its rollouts: the store keeps
    why, and the Runs list and the Run screen say it at 80×24."""
    import subprocess
    import sys

    config = home / "bad.toml"
    config.write_text('[env]\nname = "toy"\ntasks = ["no-such-task"]\n[harness]\nname = "oracle"\n'
                      '[runtime]\nkind = "local"\n')
    done = subprocess.run([sys.executable, "-m", "forgetui.cli", "run", str(config), "--no-ui"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "FORGETUI_HOME": str(home)})
    assert done.returncode != 0, done.stderr
    (store,) = home.glob("runs/*/store.duckdb")
    run_id = store.parent.name
    from core.store.query import run_query
    rows = run_query(store, f"SELECT value FROM meta WHERE key = 'failure:{run_id}'").rows
    assert rows and "no task of env 'toy' matches ['no-such-task']" in rows[0][0]
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 1, "the run listed")
        (info,) = runs.rows
        assert info.status == "failed" and "no task of env 'toy' matches" in (info.reason or "")
        assert runs.border_subtitle.startswith("why: no task of env 'toy' matches")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "its Run screen")
        summary = app.screen.query_one("#run-summary-text", Static)
        await until(pilot, lambda: "why: no task of env 'toy' matches ['no-such-task']" in text_of(summary),
                    "the reason on the Run screen")
        assert "recorded no reason" not in text_of(summary)


# ---------------------------------------------------------------- 6. 80 columns: names get the width; wide/narrow, sideways
def drawn_rows(table) -> list[str]:
    """The table's lines as drawn on screen now (header first)."""
    return [table.render_line(y).text for y in range(table.scrollable_content_region.height)]


@pytest.mark.parametrize("size", SIZES)
async def test_task_names_keep_their_width_and_w_shows_every_column(home: Path, size: tuple[int, int]) -> None:
    build_run(home, "named", tasks=2, samples=1, task_prefix="count-lines")
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await app.push_screen(RunScreen(RunSource(home / "runs" / "named"), refresh_s=3600))
        lines = app.screen.query_one(RolloutLines)
        await until(pilot, lambda: lines.row_count == 2, "the rollouts")
        await pilot.pause()
        drawn = drawn_rows(lines)
        assert "count-lines-0" in drawn[1] and "count-lines-1" in drawn[2]  # whole: they tell the rows apart
        if size == (80, 24):
            assert drawn[0].split()[:4] == ["outcome", "task", "#", "st"]  # the counts' short headers
            assert "w: wide" in lines.border_subtitle
        else:
            assert drawn[0].split()[:4] == ["outcome", "task", "sample", "step"]
        await pilot.press("w")  # wide: every column whole, scrolled sideways with shift+→
        assert lines.wide and lines.widths == lines.natural and lines.headers[2] == "sample"
        if lines.virtual_size.width > lines.scrollable_content_region.width:
            await pilot.press("shift+right")
            assert lines.scroll_offset.x > 0
        await pilot.press("w")
        assert not lines.wide and lines.scroll_offset.x == 0


async def test_runs_list_scrolls_sideways_at_80_columns(home: Path) -> None:
    for n in range(2):
        build_run(home, f"run-{n}", tasks=1, samples=1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 2, "the runs")
        await pilot.pause()
        assert runs.virtual_size.width > runs.scrollable_content_region.width  # created/why are past the border
        assert "created" not in drawn_rows(runs)[0]
        for _ in range(6):
            await pilot.press("greater_than_sign")
        assert runs.scroll_offset.x > 0 and "created" in drawn_rows(runs)[0]
        await pilot.press("less_than_sign", "less_than_sign", "less_than_sign", "less_than_sign", "less_than_sign",
                          "less_than_sign")
        assert runs.scroll_offset.x == 0


@pytest.mark.parametrize("size", SIZES)
async def test_compare_shows_run_b_on_screen(home: Path, size: tuple[int, int]) -> None:
    build_run(home, "run-a", tasks=2, samples=2, seed=1)
    build_run(home, "run-b", tasks=2, samples=2, seed=2)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=size) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 2, "the runs")
        await pilot.press("c", "down", "c")
        await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.result is not None, "compared")
        await pilot.pause()
        body, pane = app.screen.query_one("#compare-body"), app.screen.query_one("#compare")
        assert body.size.width <= pane.scrollable_content_region.width  # every column, B's included, on screen
        if size == (80, 24):
            await pilot.press("w")  # the full form (A's and B's intervals): wider than the screen, scrolls
            await pilot.pause()
            assert body.size.width > pane.scrollable_content_region.width


@pytest.mark.parametrize("size", SIZES)
async def test_form_labels_end_before_their_values(home: Path, size: tuple[int, int]) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=size) as pilot:
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewRunScreen) and app.screen.query("#in-env-name"), "the form")
        await pilot.pause()
        for row in app.screen.query(".form-row"):
            label, key = row.query_one(".form-label"), row.query_one(".form-key")
            field = row.query_one("FormField")
            shown = [w for w in (label, key) if w.display and w.size.width]
            assert all(w.content_region.right < field.region.x for w in shown)  # a blank cell at least between them
            assert field.tooltip
        assert app.screen.query_one("#in-policy-backend").tooltip == "policy.backend"


async def test_calls_table_headers_are_the_sql_columns(home: Path) -> None:
    build_run(home, "calls-run", tasks=1, samples=1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: app.home_screen.in_focus is not None, "a run in focus")
        await pilot.press("2")
        table = app.query_one(CallsTable)
        await until(pilot, lambda: table.row_count == 3, "the calls")
        from core.store.query import run_query
        store = home / "runs" / "calls-run" / "store.duckdb"
        sql_columns = {r[0] for r in run_query(store, "SELECT column_name FROM information_schema.columns "
                                                      "WHERE table_name = 'calls'").rows}
        headers = [h for h in table.headers if h != "rollout"]  # the rollout id, its run's prefix cut
        assert set(headers) <= sql_columns, set(headers) - sql_columns


# ---------------------------------------------------------------- 8. headers that read right
def test_calls_per_second_over_batched_commits() -> None:
    """The store commits calls in batches: two polls a second apart often see one count. The rate is taken over
    the recent window, so a run whose calls climb never reads 0.00 calls/s between two batches."""
    rate = CallRate(window_s=30.0)
    assert rate.add(0.0, 100) is None  # a resumed run: 100 calls from before, no rate yet
    assert rate.add(1.0, 100) == 0.0
    assert rate.add(2.0, 130) == pytest.approx(15.0)
    assert rate.add(3.0, 130) == pytest.approx(10.0)  # the same count as a second ago: still calls climbing
    progress = RunProgress()
    for t, n in ((0.0, 100), (1.0, 100), (2.0, 130), (3.0, 130)):
        progress.apply_calls(n, t)
    assert progress.calls_per_s == pytest.approx(10.0) and progress.n_calls == 130
    assert rate.add(100.0, 190) == pytest.approx(60 / 97)  # older counts leave the window (the last before it stays)


@pytest.mark.parametrize("size", SIZES)
async def test_a_rollout_whose_harness_failed_but_passed_says_both(home: Path, size: tuple[int, int]) -> None:
    build_run(home, "mixed", tasks=5, samples=2)  # task-4/0: status failed, passed True (tests/tui_stores.py)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await app.push_screen(RunScreen(RunSource(home / "runs" / "mixed"), refresh_s=3600))
        lines = app.screen.query_one(RolloutLines)
        await until(pilot, lambda: lines.row_count == 10, "the rollouts")
        row = next(r for r in lines.rows if r.status == "failed" and r.passed)
        index = lines.shown.index(row)
        assert lines.row_cells(index)[0] == "passed (h.fail)"
        await pilot.pause()
        assert "passed (h.fail)" in lines.render_line(index + 1 - int(lines.scroll_offset.y)).text
        lines.cursor = index
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RolloutScreen), "the rollout")
        verifier = app.screen.query_one("#verifier", Static)
        await until(pilot, lambda: "passed:" in text_of(verifier), "the verifier tab")
        assert "the verifier passed the workspace, though the harness failed" in text_of(verifier)
        assert "status failed · passed True" not in text_of(verifier)


async def test_a_cancelled_call_header_names_no_none(home: Path) -> None:
    path = home / "runs" / "cancelled" / "store.duckdb"
    with Store.open(path) as store:
        store.insert_run("cancelled", {}, status="interrupted")
        store.upsert_rollout({"rollout_id": "cancelled/t/0", "run_id": "cancelled", "task_id": "t", "status": "running"})
        store.record_call({"call_id": "c0", "rollout_id": "cancelled/t/0", "seq": 0, "api": "chat", "model": "m",
                           "request": {"messages": [{"role": "user", "content": "hi"}]}, "status": "cancelled",
                           "error": "the run was cancelled", "started_at": T0})
        store.flush()
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.home_screen.in_focus is not None, "the run in focus")
        await pilot.press("2")
        header = app.query_one(CallInspector).query_one("#call-header", Static)
        await until(pilot, lambda: "c0" in text_of(header), "the call's header")
        assert "None" not in text_of(header) and "no tokens recorded" in text_of(header)


async def test_a_refresh_that_fails_keeps_the_run_header(home: Path) -> None:
    build_run(home, "steady", tasks=1, samples=2)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await app.push_screen(RunScreen(RunSource(home / "runs" / "steady"), refresh_s=3600))
        screen = app.screen
        summary = screen.query_one("#run-summary-text", Static)
        await until(pilot, lambda: screen.detail is not None, "the run")
        screen.post_message(RunScreen.Failed("run", 'IO Error: Could not set lock on file "/x/store.duckdb": '
                                                    "Conflicting lock is held in /usr/bin/python3 (PID 1)"))
        await until(pilot, lambda: "refresh failed" in text_of(summary), "the note")
        assert text_of(summary).startswith("steady")  # the header stays
        assert "locked by its writer" in text_of(summary) and "Could not set lock" not in text_of(summary)


# ---------------------------------------------------------------- 9. what users of k9s, lazygit and Harlequin expect
async def test_esc_in_the_table_clears_its_filter(home: Path) -> None:
    for run_id in ("eval-a", "train-b"):
        build_run(home, run_id, tasks=1, samples=1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 2, "the runs")
        await pilot.press("slash", "e", "v", "a", "l", "enter")  # Enter: back in the table, the filter kept
        await until(pilot, lambda: runs.row_count == 1 and runs.has_focus, "filtered, focus in the table")
        await pilot.press("escape")
        await until(pilot, lambda: runs.row_count == 2, "the filter cleared")
        bar = app.query_one("#tab-runs").query_one("FilterBar")
        assert bar.value == "" and bar.size.height == 0 and runs.has_focus and app.screen is app.home_screen
        # on the Run screen: the first Esc clears the filter, the next goes back
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the Run screen")
        lines = app.screen.query_one(RolloutLines)
        await until(pilot, lambda: lines.row_count == 1, "its rollout")
        await pilot.press("slash", "z", "z", "z", "enter")
        await until(pilot, lambda: lines.row_count == 0 and lines.has_focus, "filtered to nothing")
        await pilot.press("escape")
        await until(pilot, lambda: lines.row_count == 1, "cleared")
        assert isinstance(app.screen, RunScreen)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is app.home_screen, "back home")


async def test_follow_does_not_stick_across_runs(home: Path) -> None:
    for run_id in ("run-a", "run-b"):
        build_run(home, run_id, tasks=1, samples=1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 2, "the runs")
        await pilot.press("2")
        calls = app.query_one(CallsTable)
        await until(pilot, lambda: calls.row_count == 3, "the calls")
        await pilot.press("f")
        assert calls.follow and "following" in calls.border_subtitle
        await pilot.press("1", "down", "2")  # another run in focus
        await until(pilot, lambda: calls.row_count == 3 and app.home_screen.in_focus[1] == runs.selected.run_id,
                    "the other run's calls")
        assert not calls.follow and "following" not in calls.border_subtitle
        assert calls.cursor == 0  # its first call, not its newest


async def test_help_describes_the_token_view_keys(home: Path, tokenizer) -> None:
    build_run(home, "tokens", tasks=1, samples=1, tokenizer=tokenizer)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await app.push_screen(RolloutScreen(RunSource(home / "runs" / "tokens"), "tokens/task-0/0"))
        view = app.screen.query_one(TokenView)
        await until(pilot, lambda: view.sample is not None, "the sample")
        await pilot.press("right")  # the Tokens tab
        await pilot.pause()
        assert view.has_focus
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen.query("HelpPanel"), "the keys panel")
        await pilot.pause(0.3)
        panel = app.screen.query_one("HelpPanel")
        from rich.console import Console
        console = Console(record=True, width=120, file=io.StringIO())
        for table in panel.query("BindingsTable"):
            console.print(table.render())
        shown = console.export_text()
        for words in ("Next token", "Previous token", "20 tokens on", "200 tokens back", "First token", "Last token",
                      "Next sampled"):
            assert words in shown, words


@pytest.mark.parametrize("size", SIZES)
async def test_search_in_the_conversation_and_the_tokens(home: Path, tokenizer, size: tuple[int, int]) -> None:
    build_run(home, "talk", tasks=1, samples=1, calls=12, tokenizer=tokenizer)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await app.push_screen(RolloutScreen(RunSource(home / "runs" / "talk"), "talk/task-0/0"))
        screen = app.screen
        view = screen.query_one(TokenView)
        await until(pilot, lambda: view.sample is not None, "the rollout")
        scroll = screen.query_one("#conv-scroll")
        assert scroll.scroll_y == 0
        await pilot.press("slash")
        bar = screen.query_one("#rollout-search")
        assert bar.has_focus
        await pilot.press(*"step 1", "enter")  # step 1, step 10, step 11: the last far below the first screen
        await until(pilot, lambda: bar.border_title == "match 1/3", "the first match")
        await pilot.press("enter", "enter")
        await until(pilot, lambda: bar.border_title == "match 3/3", "the last match")
        await pilot.pause(0.2)
        conv = screen.query_one("#conv", Static)
        assert scroll.scroll_y > 0  # scrolled down to it
        top, height = int(scroll.scroll_y), scroll.scrollable_content_region.height
        on_screen = [conv.render_line(y).text for y in range(top, top + height)]
        assert any("step 11:" in line for line in on_screen)
        await pilot.press("escape")  # closes; the highlights go
        await pilot.pause()
        assert scroll.has_focus and not bar.display
        # the tokens: the cursor goes to the token where the match starts
        await pilot.press("right")
        await pilot.pause()
        await pilot.press("slash", *"ok 10", "enter")  # the tool result after call 11, inserted tokens
        await until(pilot, lambda: str(bar.border_title).startswith("token match"), f"a token match ({bar.border_title})")
        pieces = view.sample.pieces
        assert "".join(pieces[view.cursor:view.cursor + 4]).lower().lstrip().startswith("ok 10")
        await until(pilot, lambda: bool(cursor_lines(view)), "the match's token on screen")


async def test_tab_completes_table_and_column_names_in_the_sql_editor(home: Path) -> None:
    build_run(home, "sql-run", tasks=1, samples=1)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.home_screen.in_focus is not None, "a run in focus")
        await pilot.press("4")
        editor = app.query_one(SqlEditor)
        await until(pilot, lambda: editor.has_focus, "the editor")
        editor.text = ""
        await pilot.press(*"SELECT rollouts.rew", "tab")  # a table's column after `table.`
        assert editor.text == "SELECT rollouts.reward"
        await pilot.press(*", completion_l", "tab")  # one column: completion_logprobs
        assert editor.text.endswith(", completion_logprobs")
        await pilot.press(*" FROM rollo", "tab")  # rollouts, rollout_requests, ...: the common part, the rest listed
        status = app.query_one("#sql-status", Static)
        assert editor.text.endswith(" FROM rollout") and "rollouts" in text_of(status)
        await pilot.press(*"s ", "tab")  # after a space Tab indents as before
        assert editor.text.rstrip(" ").endswith("FROM rollouts") and editor.text.endswith("rollouts   ")
        assert completions("SELECT st", schema_names())[1][:1] == ["started_at"]
