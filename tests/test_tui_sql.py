"""The SQL console: run keys that work in every terminal, errors replacing results, paging, the cell viewer,
history, the schema browser, cancel and export, on a store written by the real writer."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import duckdb
import pytest
from textual.widgets import Static

from core.store.writer import Store
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.screens.cell_viewer import CellViewer
from forgetui.tui.source import RunSource
from forgetui.tui.widgets.result_table import CELL_CHARS, ResultTable
from forgetui.tui.widgets.schema_tree import SchemaTree
from forgetui.tui.widgets.sql_console import SqlConsole
from forgetui.tui.widgets.windowed_table import WINDOW
from tests.tui_helpers import until
from tests.tui_stores import build_run


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    build_run(tmp_path, "run-q", tasks=2, samples=2)
    return tmp_path


def status_of(console: SqlConsole) -> str:
    content = console.query_one("#sql-status", Static).content
    return getattr(content, "plain", None) or str(content)


async def open_console(app: ForgetuiApp, pilot) -> tuple[SqlConsole, ResultTable]:
    """The SQL tab (key 4), on the run in focus (the newest: the Runs list's cursor starts on it)."""
    await until(pilot, lambda: app.home_screen.in_focus is not None, "a run in focus")
    await pilot.press("4")
    console = app.screen.query_one(SqlConsole)
    await until(pilot, lambda: console.source is not None, "the console on the run in focus")
    return console, app.screen.query_one(ResultTable)


async def test_f5_and_ctrl_r_run_and_the_footer_shows_f5(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        shown = {b.binding.key for b in app.screen.active_bindings.values() if b.binding.show}
        assert "f5" in shown  # in the footer while the editor has focus
        console.sql = "SELECT count(*) AS n FROM rollouts"
        await pilot.press("f5")
        await until(pilot, lambda: table.row_count == 1, "F5's result")
        assert str(table.get_row_at(0)[0]) == "4"
        console.sql = "SELECT 7 AS seven"
        await pilot.press("ctrl+r")
        await until(pilot, lambda: str(table.get_row_at(0)[0]) == "7", "Ctrl+R's result")


async def test_error_replaces_the_result(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        console.sql = "SELECT rollout_id FROM rollouts"
        await pilot.press("f5")
        await until(pilot, lambda: table.row_count == 4, "4 rows")
        console.sql = "SELECT nope FROM rollouts"
        await pilot.press("f5")
        await until(pilot, lambda: "nope" in status_of(console), "the error")
        assert table.row_count == 0 and not table.columns


async def test_10000_rows_are_paged_and_json_cells_open_in_the_viewer(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        console.sql = ("SELECT i, json_object('i', i, 'words', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) AS j "
                       "FROM range(10000) t(i)")
        await pilot.press("f5")
        await until(pilot, lambda: table.row_count == WINDOW, "the first window")
        assert "10000 rows" in status_of(console)
        assert len(table.get_row_at(0)[1].plain) == CELL_CHARS  # cut, not tens of thousands of columns wide
        table.focus()
        for _ in range(WINDOW + 5):  # past the window's edge: it slides, the table never holds more than a window
            await pilot.press("down")
        await until(pilot, lambda: table.absolute_row == WINDOW + 5, "the cursor past the first window")
        assert table.window_start > 0 and table.row_count == WINDOW
        assert str(table.get_row_at(table.cursor_row)[0]) == str(WINDOW + 5)
        await pilot.press("end")
        assert table.absolute_row == 9_999 and table.row_count == WINDOW
        assert str(table.get_row_at(table.cursor_row)[0]) == "9999" and "of 10000" in table.border_subtitle
        await pilot.press("right", "enter")
        await until(pilot, lambda: isinstance(app.screen, CellViewer), "the cell viewer")
        viewer = app.screen
        assert json.loads(viewer.text) == {"i": 9999, "words": ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]}
        assert viewer.text.count("\n") > 5  # pretty-printed
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, CellViewer), "the viewer closed")


async def test_history_survives_a_restart_and_schema_inserts_names(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        for sql in ("SELECT 1 AS a", "SELECT 2 AS b"):
            console.sql = sql
            await pilot.press("f5")
            await until(pilot, lambda sql=sql: table.columns and str(list(table.columns.values())[0].label) in sql,
                        "the result")
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        await pilot.press("ctrl+up")
        assert console.sql == "SELECT 2 AS b"
        await pilot.press("ctrl+up")
        assert console.sql == "SELECT 1 AS a"
        await pilot.press("ctrl+down")
        assert console.sql == "SELECT 2 AS b"
        console.sql = "SELECT * FROM "
        editor = console.query_one("#sql-input")
        editor.move_cursor(editor.document.end)  # names go in at the editor's cursor
        tree = app.query_one(SchemaTree)
        tree.focus()
        tree.move_cursor(next(n for n in tree.root.children if n.data == "train_steps"))
        await pilot.press("enter")
        assert console.sql.endswith("train_steps") and console.query_one("#sql-input").has_focus


async def test_cancel_drops_the_answer(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = RunSource.query

    def slow(self, sql, max_rows=100_000, cancel=None):
        if cancel is not None:  # the console's query (the Runs list's are not held)
            release.wait(10)
        return real(self, sql, max_rows)

    monkeypatch.setattr(RunSource, "query", slow)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        console.sql = "SELECT 42 AS answer"
        await pilot.press("f5")
        await until(pilot, lambda: "running" in status_of(console), "running")
        await pilot.press("escape")
        assert "cancelled" in status_of(console)
        release.set()
        await pilot.pause(0.5)
        assert table.row_count == 0 and "cancelled" in status_of(console)
        console.sql = "SELECT 43 AS answer"  # the console still works
        await pilot.press("f5")
        await until(pilot, lambda: table.row_count == 1, "the next query")
        assert str(table.get_row_at(0)[0]) == "43"


async def test_cancel_interrupts_a_query_running_on_a_store_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Esc stops the query itself, not only the wait for it: DuckDB interrupts the connection it runs on."""
    ended: list[str] = []
    real = RunSource.query

    def recorded(self, sql, max_rows=100_000, cancel=None):
        try:
            return real(self, sql, max_rows, cancel)
        except Exception as exc:
            if cancel is not None:  # the console's query (not the Runs list's)
                ended.append(str(exc))
            raise

    monkeypatch.setattr(RunSource, "query", recorded)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        console.sql = "SELECT count(*) FROM range(100000000000) WHERE range % 7 = 3"  # minutes of work on two cores
        await pilot.press("f5")
        await until(pilot, lambda: "running" in status_of(console), "running")
        # the query is under way in its thread: its connection is watched by the cancel
        await until(pilot, lambda: console._cancel is not None and bool(console._cancel._cons), "the query running on its connection")
        await pilot.press("escape")
        await until(pilot, lambda: bool(ended), "the interrupted query to end", tries=1000)
        assert len(ended) == 1 and ended[0].startswith("query interrupted: cancelled") and table.row_count == 0


async def test_export_csv_and_parquet(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        console, table = await open_console(app, pilot)
        console.sql = "SELECT rollout_id, reward, [1, 2] AS ids FROM rollouts ORDER BY rollout_id"
        await pilot.press("f5")
        await until(pilot, lambda: table.row_count == 4, "the result")
        folder = home / "runs" / "run-q" / "exports"
        await pilot.press("f8")
        await until(pilot, lambda: list(folder.glob("*.csv")), "the CSV")
        await pilot.press("f9")
        await until(pilot, lambda: list(folder.glob("*.parquet")), "the Parquet file")
    lines = next(folder.glob("*.csv")).read_text().splitlines()
    assert lines[0] == "rollout_id,reward,ids" and lines[1].startswith("run-q/task-0/0,") and len(lines) == 5
    rows = duckdb.sql(f"SELECT rollout_id, ids FROM '{next(folder.glob('*.parquet'))}' ORDER BY 1").fetchall()
    assert rows[0] == ("run-q/task-0/0", [1, 2]) and len(rows) == 4
    assert Store  # the writer made the store above



async def test_window_cells_that_look_like_markup_are_shown_as_written() -> None:
    """A value such as an error `[Errno 2] ... [bold]` is text, not Rich markup to render (or to eat)."""
    from textual.app import App

    from forgetui.tui.widgets.windowed_table import WindowedTable

    value = "[bold]x[/bold] [Errno 2]"

    class Lines(WindowedTable):
        def count(self) -> int:
            return 1

        def cells(self, index: int) -> list[str]:
            return [value]

    class One(App):
        def compose(self):  # noqa: ANN202
            yield Lines()

        def on_mount(self) -> None:
            table = self.query_one(Lines)
            table.add_column("error", width=40)
            table.show_window(0)

    app = One()
    async with app.run_test(size=(60, 6)) as pilot:
        await pilot.pause()
        assert value in app.export_screenshot().replace("&#160;", " ")  # drawn as written, not parsed as markup


def test_schema_tree_lists_what_the_console_can_query(tmp_path: Path) -> None:
    """The Schema pane names every table, view and macro a query in the console can use: the behaviour views too,
    though since schema 6 they are TEMP views made per query (not in the file), and each one answers there."""
    names = [node.data for node in SchemaTree().root.children]
    assert {"calls", "token_ids", "full_prompt", "tool_uses", "rollout_behaviour", "behaviour_summary"} <= set(names)
    build_run(tmp_path, "r", tasks=1, samples=1, calls=2, seed=1)
    source = RunSource(tmp_path / "runs" / "r")
    for view in ("tool_uses", "rollout_behaviour", "behaviour_summary"):
        assert source.query(f"SELECT count(*) FROM {view}").rows  # binds: the pane names nothing the console refuses
