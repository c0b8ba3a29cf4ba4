"""The Textual TUI on real stores: the Runs list, the Calls tab following the run in focus, the inspector, the SQL
console; plus its data layer (`forgetui.tui.source`)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import DataTable, Static
from textual.worker import WorkerCancelled, WorkerFailed

from core.errors import StoreError
from core.store.writer import Store
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.conversation import request_turns, response_turns
from forgetui.tui.rows import rollout_label
from forgetui.tui.source import RunCatalog, RunSource
from forgetui.tui.widgets.call_inspector import CallInspector, prob_colour
from forgetui.tui.widgets.calls_table import CallsTable
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.sql_console import SqlConsole
from tests.conftest import HARNESS_REQUESTS  # noqa: E402
from tests.tui_helpers import text_of

FIXTURES = HARNESS_REQUESTS
T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def call_row(i: int, rollout: str, **over: object) -> dict:
    row = {
        "call_id": f"{rollout}-call-{i}",
        "rollout_id": rollout,
        "seq": i,
        "api": "chat",
        "model": "tiny",
        "request": {"model": "tiny", "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"question number {i} from {rollout}"},
        ]},
        "response": {"choices": [{"message": {"role": "assistant", "content": f"answer {i}"}}]},
        "prompt_token_ids": list(range(10 + i)),
        "completion_token_ids": [101, 102, 103],
        "completion_logprobs": [-0.01, -1.5, -4.0],
        "finish_reason": "stop",
        "status": "ok",
        "started_at": T0 + dt.timedelta(seconds=10 * i + (0 if rollout == "ro-a" else 1)),
        "latency_ms": 12.5 + i,
        "branch": 0,
        "extends_parent": i > 0,
    }
    row.update(over)
    return row


def fill(store: Store, run_id: str, n_calls: dict[str, int]) -> None:
    store.insert_run(run_id, {"model": "tiny"}, status="done")
    for rollout, n in n_calls.items():
        store.upsert_rollout({"rollout_id": rollout, "run_id": run_id, "status": "done", "reward": 1.0})
        for i in range(n):
            store.record_call(call_row(i, rollout))
    store.flush()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A FORGETUI_HOME with an older proxy store (1 call) and a newer run store (3 calls in 2 rollouts)."""
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    old = tmp_path / "stores" / "proxy-1.duckdb"
    with Store.open(old) as s:
        fill(s, "proxy-1", {"ro-x": 1})
    new = tmp_path / "runs" / "run-b" / "store.duckdb"
    with Store.open(new) as s:
        fill(s, "run-b", {"ro-a": 2, "ro-b": 1})
    os.utime(old, (1_000_000, 1_000_000))
    return tmp_path


async def settle(app: ForgetuiApp, pilot, cond, tries: int = 300, show=lambda: "") -> None:
    """Let workers finish and messages land until `cond()` holds."""
    for _ in range(tries):
        try:
            await app.workers.wait_for_complete()
        except (WorkerCancelled, WorkerFailed):
            pass
        await pilot.pause(0.01)
        if cond():
            return
    raise AssertionError(f"the TUI never reached the expected state {show()}")


def table_rows(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def lines(table) -> list[list[str]]:  # noqa: ANN001 - a LineTable
    return [table.row_cells(i) for i in range(table.row_count)]


# ---------------------------------------------------------------------- data layer (no textual)
def test_catalog_lists_runs_and_proxy_sessions(home: Path) -> None:
    runs = RunCatalog().list()
    assert [(r.kind, r.run_id) for r in runs] == [("run", "run-b"), ("proxy", "proxy-1")]
    run_b = runs[0]
    assert (run_b.total, run_b.done, run_b.live, run_b.reason) == (2, 2, False, None)
    assert run_b.source == RunSource(home / "runs" / "run-b")
    assert RunSource(home / "runs" / "run-b").count_calls() == 3


def test_load_calls_and_one_call(home: Path) -> None:
    source = RunSource(home / "runs" / "run-b")
    calls = source.calls()
    assert [(c.rollout_id, c.seq) for c in calls] == [("ro-a", 0), ("ro-b", 0), ("ro-a", 1)]
    assert list(calls[2].cells().values()) == ["1", "ro-a", "chat", "tiny", "ok", "11", "3", "14", "0", "yes"]
    detail = source.call("ro-a-call-1")
    assert detail.request["messages"][1]["content"] == "question number 1 from ro-a"
    assert detail.completion_token_ids == [101, 102, 103]
    assert detail.completion_logprobs == [-0.01, -1.5, -4.0]
    with pytest.raises(StoreError, match="not in"):
        source.call("nope'; DROP TABLE calls; --")


def test_unreadable_store_is_listed_with_its_error(home: Path) -> None:
    (home / "stores" / "broken.duckdb").write_bytes(b"this is not duckdb")
    runs = {r.run_id: r for r in RunCatalog().list()}
    assert runs["broken"].status == "unreadable" and "broken.duckdb" in (runs["broken"].reason or "")
    assert runs["run-b"].total == 2


def test_why_is_said_for_runs_that_stopped_not_for_one_still_going(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Runs list's why: a failed run, and one left `running` by a writer that died, give their last rollout
    error; a run still running (its writer serves it live) or done does not: a rollout that errored there is
    that rollout's story, not why the run stopped."""
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))

    def write(store: Store, run_id: str, status: str) -> None:
        store.insert_run(run_id, {}, status=status)
        store.upsert_rollout({"rollout_id": f"{run_id}-1", "run_id": run_id, "status": "infra_error",
                              "error": f"{run_id}: sandbox image pull failed"})
        store.upsert_rollout({"rollout_id": f"{run_id}-2", "run_id": run_id, "status": "done", "reward": 1.0})
        store.flush()

    for run_id, status in (("failed", "failed"), ("died", "running"), ("done", "done")):
        with Store.open(tmp_path / "runs" / run_id / "store.duckdb") as s:
            write(s, run_id, status)
    live = Store.open(tmp_path / "runs" / "going" / "store.duckdb")
    try:
        live.serve_queries()
        write(live, "going", "running")
        runs = {r.run_id: r for r in RunCatalog().list()}
    finally:
        live.close()
    assert runs["going"].live and runs["going"].reason is None
    assert runs["done"].reason is None
    assert runs["failed"].reason == "failed: sandbox image pull failed"
    assert runs["died"].reason == "died: sandbox image pull failed" and not runs["died"].live
    # the Run screen says the same of each
    for run_id in ("failed", "died", "done"):
        detail = RunSource(tmp_path / "runs" / run_id).run_detail()
        assert detail.reason == runs[run_id].reason, run_id


def _api_for(path: str) -> str | None:
    if "/messages" in path and "count_tokens" not in path:
        return "messages"
    if path.rstrip("/").endswith("/responses"):
        return "responses"
    if "chat/completions" in path:
        return "chat"
    if "enerateContent" in path:  # generateContent and streamGenerateContent
        return "gemini"
    return None


def test_request_turns_for_every_harness_fixture() -> None:
    seen = set()
    for fixture in sorted(FIXTURES.glob("*.jsonl")):
        for line in fixture.read_text().splitlines():
            req = json.loads(line)
            api = _api_for(req.get("path", ""))
            if req.get("method") != "POST" or api is None or not isinstance(req.get("body"), dict):
                continue
            turns = request_turns(api, req["body"])
            roles = {r.split(" ")[0] for r, _ in turns}
            assert "user" in roles, (fixture.name, api, roles)
            assert any(text.strip() for _, text in turns)
            seen.add(api)
    assert {"chat", "messages", "responses", "gemini"} <= seen


def test_response_turns_by_shape() -> None:
    assert response_turns({"content": [{"type": "text", "text": "hi"},
                                       {"type": "tool_use", "name": "ls", "input": {"p": "."}}]}) == [
        ("assistant", 'hi\n→ ls({"p": "."})')]
    assert response_turns({"candidates": [{"content": {"role": "model", "parts": [{"text": "yo"}]}}]}) == [
        ("model", "yo")]
    assert response_turns({"output": [{"type": "message", "role": "assistant",
                                       "content": [{"type": "output_text", "text": "done"}]}]}) == [
        ("assistant", "done")]
    assert prob_colour(0.0) == "rgb(0,255,60)" and prob_colour(-50.0) == "rgb(255,0,60)"


# ---------------------------------------------------------------------- the app
async def test_the_calls_tab_follows_the_run_in_focus(home: Path) -> None:
    """The Calls tab shows the calls of the run under the Runs list's cursor, whichever it is."""
    app = ForgetuiApp(refresh_s=0.2, stores_refresh_s=0.5)
    async with app.run_test(size=(180, 50)) as pilot:
        runs = app.query_one(RunsTable)
        await settle(app, pilot, lambda: runs.row_count == 2)
        assert runs.has_focus and [r.run_id for r in runs.shown] == ["run-b", "proxy-1"]
        table = app.query_one(CallsTable)
        await pilot.press("down")  # the proxy session
        await pilot.press("2")  # the Calls tab
        await settle(app, pilot, lambda: table.row_count == 1)
        assert lines(table)[0][:5] == ["0", "ro-x", "chat", "tiny", "ok"] and table.border_title == "Calls of proxy-1"
        await pilot.press("1", "up", "2")  # back to the Runs list, the run above, its calls
        await settle(app, pilot, lambda: table.row_count == 3)
        assert [r[:2] for r in lines(table)] == [["0", "ro-a"], ["0", "ro-b"], ["1", "ro-a"]]
        assert lines(table)[2] == ["1", "ro-a", "chat", "tiny", "ok", "11", "3", "14", "0", "yes"]

        inspector = app.query_one(CallInspector)
        assert table.has_focus
        await pilot.press("down", "down")
        request = inspector.query_one("#call-request", Static)
        await settle(app, pilot, lambda: "question number 1 from ro-a" in text_of(request))
        assert "You are terse." in text_of(request)
        assert "answer 1" in text_of(inspector.query_one("#call-response", Static))
        assert "101 102 103" in text_of(inspector.query_one("#call-tokens", Static))
        assert "ro-a-call-1" in text_of(inspector.query_one("#call-header", Static))
        await pilot.press("slash", *"ro-b")  # the calls table filters too
        await settle(app, pilot, lambda: table.row_count == 1)
        assert lines(table)[0][1] == "ro-b" and "filter “ro-b”" in table.border_subtitle


async def test_sql_console_result_and_error(home: Path) -> None:
    app = ForgetuiApp(refresh_s=0.2, stores_refresh_s=0.5)
    async with app.run_test(size=(180, 50)) as pilot:
        await settle(app, pilot, lambda: app.home_screen.in_focus is not None)  # the newest run is in focus on start
        await pilot.press("4")
        console = app.query_one(SqlConsole)
        result = console.query_one("#sql-result", DataTable)
        status = console.query_one("#sql-status", Static)
        assert console.border_title == "SQL on run-b"

        console.sql = "SELECT count(*) AS n FROM calls"
        await pilot.press("ctrl+enter")
        await settle(app, pilot, lambda: result.row_count == 1)
        assert table_rows(result) == [["3"]]
        assert "1 rows" in text_of(status)

        console.sql = "SELEC nonsense FROM"
        await pilot.click("#sql-run")
        await settle(app, pilot, lambda: "parse" in text_of(status).lower() or "syntax" in text_of(status).lower())
        assert app.is_running

        console.sql = "DELETE FROM calls"
        await pilot.press("ctrl+enter")  # focus is on the Run button now
        await settle(app, pilot, lambda: "read-only" in text_of(status), show=lambda: text_of(status))
        assert app.is_running

        console.sql = "SELECT call_id FROM calls WHERE rollout_id = 'ro-b'"
        await pilot.press("ctrl+enter")
        await settle(app, pilot, lambda: table_rows(result) == [["ro-b-call-0"]])


async def test_ctrl_a_selects_the_whole_query(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot, lambda: app.home_screen.in_focus is not None)
        await pilot.press("4")
        console = app.query_one(SqlConsole)
        console.sql = "SELECT 1\nFROM calls"
        editor = console.query_one("#sql-input")
        assert editor.has_focus
        await pilot.press("ctrl+a")
        assert editor.selected_text == "SELECT 1\nFROM calls"
        await pilot.press(*"SELECT 2")  # typing replaces the selection
        assert console.sql == "SELECT 2"


async def test_live_store_refreshes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    store = Store.open(tmp_path / "runs" / "run-live" / "store.duckdb")
    try:
        store.serve_queries()
        store.insert_run("run-live", {}, status="running")
        store.upsert_rollout({"rollout_id": "ro-a", "run_id": "run-live", "status": "running"})
        store.record_call(call_row(0, "ro-a"))
        store.flush()
        app = ForgetuiApp(refresh_s=0.1, stores_refresh_s=0.2)
        async with app.run_test(size=(180, 50)) as pilot:
            table = app.query_one(CallsTable)
            runs = app.query_one(RunsTable)
            await settle(app, pilot, lambda: runs.row_count == 1)
            assert runs.rows[0].live and runs.rows[0].status == "running"
            await pilot.press("2")  # a run's calls load when their tab is shown
            await settle(app, pilot, lambda: table.row_count == 1)
            for i in (1, 2):
                store.record_call(call_row(i, "ro-a"))
            store.update_run_status("run-live", "done")
            store.flush()
            await settle(app, pilot, lambda: table.row_count == 3 and runs.rows[0].status == "done")
            assert [r[0] for r in lines(table)] == ["0", "1", "2"]
            await pilot.press("f")  # follow: the cursor goes to the newest call, and stays on new ones
            await settle(app, pilot, lambda: table.cursor == 2)
            store.record_call(call_row(3, "ro-a"))
            store.flush()
            await settle(app, pilot, lambda: table.row_count == 4 and table.cursor == 3)
    finally:
        store.close()


async def test_a_worker_result_arriving_while_the_app_closes_is_dropped(home: Path) -> None:
    """Workers post from threads: a result that lands after the widgets are gone must not crash the app's exit."""
    from forgetui.tui.screens.home import HomeScreen

    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.query_one(RunsTable).remove()  # as on shutdown, before the queue is drained
        app.home_screen.post_message(HomeScreen.RunsListed([]))
        await pilot.pause()
        assert app.is_running  # and leaving the context re-raises any error the handler hit


# ---------------------------------------------------------------------- issue 10's defects
def test_rollout_label_drops_the_shared_run_prefix() -> None:
    assert rollout_label("run-20260101-abc/hello/0/s1") == "hello/0/s1"
    assert rollout_label("ro-a") == "ro-a"
    long = "run/" + "t" * 50 + "/3"
    assert rollout_label(long).endswith("t/3") and len(rollout_label(long)) == 32


async def test_inspector_body_is_plain_under_bold_headings(home: Path) -> None:
    """A heading's style must not become the base style of the request and response after it."""
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.query_one(CallsTable)
        await settle(app, pilot, lambda: app.home_screen.in_focus is not None)
        await pilot.press("2")
        await settle(app, pilot, lambda: table.row_count == 3)
        await pilot.press("down")
        request = app.query_one("#call-request", Static)
        await settle(app, pilot, lambda: "question number 0 from ro-b" in text_of(request))
        text = request.content
        assert str(text.style) == ""
        at = text.plain.index("question number")
        covering = [str(s.style) for s in text.spans if s.start <= at < s.end]
        assert not any("bold" in c or "underline" in c for c in covering), covering
        assert any("underline" in str(s.style) and text.plain[s.start:s.end].startswith("Request")
                   for s in text.spans)


async def test_empty_home_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from forgetui.tui.screens.new_run import NewRunScreen

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        empty = app.query_one("#empty-home", Static)
        await settle(app, pilot, lambda: empty.display)
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(empty.content)
        said = console.export_text()
        assert str(tmp_path) in said and "forgetui demo" in said and "examples/demo.toml" in said and "n  " in said
        assert not app.query_one(RunsTable).display
        await pilot.press("n")  # the key it names opens the form
        await settle(app, pilot, lambda: isinstance(app.screen, NewRunScreen))


async def test_at_80x24_the_newest_runs_pass_rate_is_on_screen(home: Path) -> None:
    """Scores come first: at 80 columns the newest run's pass rate and reward are drawn, a long env or model
    name shrinks (with …) instead of pushing them off, and widths follow the rows shown, not the widest ever."""
    build_long = home / "runs" / "run-long" / "store.duckdb"
    with Store.open(build_long) as s:
        s.insert_run("run-long", {"env": {"name": "an-environment-with-a-very-long-name-" * 3}}, status="done")
        s.upsert_rollout({"rollout_id": "run-long/t/0", "run_id": "run-long", "env": "e" * 90, "task_id": "t",
                          "status": "done", "reward": 0.75, "passed": True})
        s.flush()
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.query_one(RunsTable)
        await settle(app, pilot, lambda: runs.row_count == 3)
        newest = runs.shown[0]
        assert newest.run_id == "run-long" and runs.cursor == 0
        await pilot.pause(0.2)
        drawn = runs.render_line(1).text  # the first row as it is drawn, cut to the table's width on screen
        assert runs.size.width <= 80 and drawn.lstrip().startswith("run-long")
        assert "1.000" in drawn and "0.750" in drawn  # pass rate and mean reward, drawn in 80 columns
        env = runs.columns.index(next(c for c in runs.columns if c.name == "env"))
        assert runs.widths[env] < 90  # shrunk, not as wide as the env's name
        wide = runs.natural[env]
        await pilot.press("D")  # the long-named run goes
        await settle(app, pilot, lambda: app.screen is not app.home_screen)
        await pilot.press("left", "enter")  # Delete (Keep has the focus)
        await settle(app, pilot, lambda: runs.row_count == 2)
        assert runs.natural[env] < wide  # the column shrank back once the long name was gone


async def test_holding_the_arrow_key_loads_one_call(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []
    real = RunSource.call

    def counting(self, call_id: str):
        loaded.append(call_id)
        return real(self, call_id)

    monkeypatch.setattr(RunSource, "call", counting)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.query_one(CallsTable)
        await settle(app, pilot, lambda: app.home_screen.in_focus is not None)
        await pilot.press("2")
        await settle(app, pilot, lambda: table.row_count == 3)
        await pilot.pause(0.3)
        loaded.clear()
        await pilot.press("down", "down", "up", "down")
        header = app.query_one("#call-header", Static)
        await settle(app, pilot, lambda: "ro-a-call-1" in text_of(header))
        await pilot.pause(0.3)
        assert loaded == ["ro-a-call-1"]


async def test_theme_is_saved_help_opens_and_the_palette_has_the_run_commands(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = "nord"
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert app.screen.query("HelpPanel")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for wanted in ("New run…", "Resume the selected run", "Stop the selected run", "Delete the selected run", "gc",
                       "Compare runs", "Open a store by path…"):
            assert wanted in titles
    assert json.loads((home / "tui" / "settings.json").read_text())["theme"] == "nord"
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.theme == "nord"


async def test_enter_on_a_call_opens_its_rollout(home: Path) -> None:
    from forgetui.tui.screens.rollout_screen import RolloutScreen

    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.query_one(CallsTable)
        await settle(app, pilot, lambda: app.home_screen.in_focus is not None)
        await pilot.press("2")
        await settle(app, pilot, lambda: table.row_count == 3)
        await pilot.press("down", "enter")  # the second call: ro-b's
        await settle(app, pilot, lambda: isinstance(app.screen, RolloutScreen))
        assert app.screen.rollout_id == "ro-b"
        conv = app.screen.query_one("#conv", Static)
        await settle(app, pilot, lambda: "question number 0 from ro-b" in text_of(conv))
        await pilot.press("q")  # q steps back, it does not quit
        await settle(app, pilot, lambda: app.screen is app.home_screen)
        assert app.is_running


async def test_a_run_loads_only_the_tab_that_is_shown(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Calls and Rollouts tables (up to a thousand rows each) fill when shown, not before."""
    asked: list[str] = []
    for name in ("calls", "rollouts"):
        real = getattr(RunSource, name)
        monkeypatch.setattr(RunSource, name, lambda self, *a, _real=real, _name=name, **k: asked.append(_name) or _real(self, *a, **k))
    app = ForgetuiApp(refresh_s=0.1, stores_refresh_s=60)
    async with app.run_test(size=(180, 50)) as pilot:
        await settle(app, pilot, lambda: app.home_screen.in_focus is not None)
        await pilot.pause(0.5)  # several refresh ticks on the Runs tab
        assert asked == [] and app.query_one(CallsTable).row_count == 0
        await pilot.press("3")
        await settle(app, pilot, lambda: app.query_one("#rollouts-table").row_count > 0)
        assert set(asked) == {"rollouts"}
        await pilot.press("2")
        await settle(app, pilot, lambda: app.query_one(CallsTable).row_count == 3)
        assert "calls" in asked


async def test_the_footer_rebuilds_only_when_its_keys_change(home: Path) -> None:
    from forgetui.tui.widgets.key_footer import KeyFooter

    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        footer = app.screen.query_one(KeyFooter)
        rebuilt: list[int] = []
        footer.call_after_refresh = lambda *a, **k: rebuilt.append(1)  # type: ignore[method-assign]
        for _ in range(5):  # what focus moves and widgets' refresh_bindings publish, with nothing changed
            footer.bindings_changed(app.screen)
        assert rebuilt == []
        app.screen.query_one("#tabs").active = "tab-sql"  # other focus, other keys
        app.screen.query_one("#sql-input").focus()
        await pilot.pause()
        footer.bindings_changed(app.screen)
        assert rebuilt == [1]


async def test_the_rollout_list_moves_scrolls_and_opens_by_key_and_click(tmp_path: Path) -> None:
    from textual.app import App

    from forgetui.tui.rows import RolloutRow
    from forgetui.tui.widgets.line_table import LineTable
    from forgetui.tui.widgets.rollout_lines import RolloutLines

    opened: list[str] = []

    class One(App):
        def compose(self):  # noqa: ANN202
            yield RolloutLines(id="lines")

        def on_line_table_selected(self, message: LineTable.Selected) -> None:
            opened.append(message.row.rollout_id)

    def line(i: int, status: str = "done") -> RolloutRow:
        return RolloutRow(f"r{i}", "run", f"task-{i % 3}", i, 0, status, 1.0, True, 1, 3, 24, 30.0,
                          "boom\nagain" if i == 7 else None)

    app = One()
    async with app.run_test(size=(100, 12)) as pilot:
        lines = app.query_one(RolloutLines)
        lines.show_lines([line(i) for i in range(50)])
        lines.focus()
        await pilot.pause()
        assert lines.row_cells(7)[-1] == "boom again" and lines.border_subtitle.startswith("50 rollouts")
        await pilot.press("down", "down")
        assert lines.cursor == 2
        await pilot.press("end")
        await pilot.pause()
        assert lines.cursor == 49 and lines.scroll_offset.y > 0  # the last row is on screen
        assert lines.render_line(lines.size.height - 1).text.startswith(" passed")  # drawn: the row, not a blank
        await pilot.press("pageup")
        assert lines.cursor == 49 - (lines.scrollable_content_region.height - 2)
        await pilot.press("home", "enter")
        await pilot.pause()
        assert lines.cursor == 0 and lines.scroll_offset.y == 0 and opened == ["r0"]
        # the row under the pointer: the border (the widget's own DEFAULT_CSS), the header, then r0, r1, r2
        await pilot.click(RolloutLines, offset=(5, 4))
        assert lines.cursor == 2 and opened == ["r0"]
        await pilot.click(RolloutLines, offset=(5, 4))  # again: it opens
        await pilot.pause()
        assert opened == ["r0", "r2"]
        lines.show_lines([line(i, "running") for i in range(2)])  # fewer rows: the cursor stays inside
        await pilot.pause()
        assert lines.cursor == 1 and lines.row_cells(0)[0] == "running"
        lines.set_filter("task-1")  # `/` filtering: rows holding every word
        lines.show_lines([line(i) for i in range(50)])
        await pilot.pause()
        assert {lines.row_cells(i)[1] for i in range(lines.row_count)} == {"task-1"} and lines.row_count == 17


async def test_a_new_row_that_takes_the_cursors_place_is_announced() -> None:
    """A refresh that puts another row under the cursor at the same index (a new run listed first, followed) posts
    Highlighted with it; a refresh that keeps the same row there posts nothing (the CI flake of stop 62: the Runs
    tabs stayed on the older run)."""
    from textual.app import App

    from forgetui.tui.rows import RolloutRow
    from forgetui.tui.widgets.line_table import LineTable
    from forgetui.tui.widgets.rollout_lines import RolloutLines

    heard: list[str | None] = []

    class One(App):
        def compose(self):  # noqa: ANN202
            yield RolloutLines(id="lines")

        def on_line_table_highlighted(self, message: LineTable.Highlighted) -> None:
            heard.append(None if message.row is None else message.row.rollout_id)

    def line(name: str) -> RolloutRow:
        return RolloutRow(name, "run", "task", 0, 0, "done", 1.0, True, 1, 3, 24, 30.0, None)

    app = One()
    async with app.run_test(size=(100, 12)) as pilot:
        lines = app.query_one(RolloutLines)
        lines.show_lines([line("older")])
        await pilot.pause()
        assert heard[-1] == "older"
        before = len(heard)
        lines.show_lines([line("older")])  # the same row again: no news
        await pilot.pause()
        assert len(heard) == before
        lines.follow_row(lambda row: row.rollout_id == "newer")
        lines.show_lines([line("newer"), line("older")])  # at index 0, where the cursor already was
        await pilot.pause()
        assert lines.cursor == 0 and heard[-1] == "newer"


def test_a_big_load_runs_without_collections_and_ends_frozen() -> None:
    import gc

    from forgetui.tui import heap

    gc.unfreeze()
    assert gc.isenabled()
    try:
        with heap.loading():
            assert not gc.isenabled()  # no automatic collection holds the GIL while the worker builds
            with heap.loading():  # a second worker loading at once
                pass
            assert not gc.isenabled()
            kept = [[i] for i in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= len(kept)  # what the load built is out of later collections
    finally:
        gc.unfreeze()


HOLD_WITHOUT_ENDPOINT = """
import sys, time
from core.store.writer import Store
store = Store.open(sys.argv[1])
store.insert_run("opening", {}, status="running")
store.flush()
print("held", flush=True)
time.sleep(60)
"""


def test_a_store_its_writer_holds_without_an_endpoint_reads_as_starting(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's writer opens its store a moment before it serves live queries: the Runs list says `starting`
    (and retries), not DuckDB's "Conflicting lock" text."""
    import subprocess
    import sys

    from core.errors import StoreBusyError

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    path = tmp_path / "runs" / "opening" / "store.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_WITHOUT_ENDPOINT, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusyError):
            RunSource(path.parent).query("SELECT 1")
        catalog = RunCatalog()
        (info,) = catalog.list()
        assert (info.run_id, info.status, info.reason) == ("opening", "starting", None)
    finally:
        proc.kill()
        proc.wait()
    (info,) = catalog.list()  # once the writer is gone, the row is read (a busy one is never cached)
    assert info.status == "running"
