"""The Textual TUI on a real store: stores list, calls table, inspector, SQL console; plus its data layer."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static
from textual.worker import WorkerCancelled, WorkerFailed

from core.store.writer import Store
from forgetui.tui import data
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.conversation import request_turns, response_turns
from forgetui.tui.widgets.call_inspector import CallInspector, prob_colour
from forgetui.tui.widgets.calls_table import CallsTable
from forgetui.tui.widgets.sql_console import SqlConsole
from forgetui.tui.widgets.store_list import StoreList
from tests.conftest import HARNESS_REQUESTS  # noqa: E402

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


def text_of(widget: Static) -> str:
    content = widget.content
    return getattr(content, "plain", None) or str(content)


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


# ---------------------------------------------------------------------- data layer (no textual)
def test_find_and_summarize_stores(home: Path) -> None:
    stores = data.StoreCatalog().list()
    assert [(s.kind, s.name) for s in stores] == [("run", "run-b"), ("proxy", "proxy-1")]
    run_b = stores[0]
    assert (run_b.n_rollouts, run_b.n_calls, run_b.live, run_b.error) == (2, 3, False, None)
    assert [(r.run_id, r.status) for r in run_b.runs] == [("run-b", "done")]


def test_load_calls_and_one_call(home: Path) -> None:
    path = home / "runs" / "run-b" / "store.duckdb"
    calls = data.load_calls(path)
    assert [(c.rollout_id, c.seq) for c in calls] == [("ro-a", 0), ("ro-b", 0), ("ro-a", 1)]
    assert calls[2].cells() == ("1", "ro-a", "chat", "tiny", "ok", "11", "3", "14", "0", "yes")
    detail = data.load_call(path, "ro-a-call-1")
    assert detail.request["messages"][1]["content"] == "question number 1 from ro-a"
    assert detail.completion_token_ids == [101, 102, 103]
    assert detail.completion_logprobs == [-0.01, -1.5, -4.0]
    with pytest.raises(data.StoreError, match="not in"):
        data.load_call(path, "nope'; DROP TABLE calls; --")


def test_unreadable_store_is_listed_with_its_error(home: Path) -> None:
    (home / "stores" / "broken.duckdb").write_bytes(b"this is not duckdb")
    stores = {s.name: s for s in data.StoreCatalog().list()}
    assert stores["broken"].error and "broken.duckdb" in stores["broken"].error
    assert stores["run-b"].n_calls == 3


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
async def test_store_list_calls_inspector(home: Path) -> None:
    app = ForgetuiApp(refresh_s=0.2, stores_refresh_s=0.5)
    async with app.run_test(size=(180, 50)) as pilot:
        stores = app.query_one(StoreList)
        await settle(app, pilot, lambda: len(stores.stores) == 2)
        assert [s.name for s in stores.stores] == ["run-b", "proxy-1"]
        prompt = stores.get_option_at_index(0).prompt
        assert "3 calls" in prompt.plain and "2 rollouts" in prompt.plain and "run-b done" in prompt.plain

        table = app.query_one(CallsTable)
        # select the older store with the keyboard, then the newer one again
        stores.focus()
        await pilot.press("down", "enter")
        await settle(app, pilot, lambda: app.store == home / "stores" / "proxy-1.duckdb" and table.row_count == 1)
        assert table_rows(table)[0][:5] == ["0", "ro-x", "chat", "tiny", "ok"]
        await pilot.press("up", "enter")
        await settle(app, pilot, lambda: app.store == home / "runs" / "run-b" / "store.duckdb"
                     and table.row_count == 3)
        assert [r[:2] for r in table_rows(table)] == [["0", "ro-a"], ["0", "ro-b"], ["1", "ro-a"]]
        assert table_rows(table)[2] == ["1", "ro-a", "chat", "tiny", "ok", "11", "3", "14", "0", "yes"]

        inspector = app.query_one(CallInspector)
        table.focus()
        await pilot.press("down", "down")
        request = inspector.query_one("#call-request", Static)
        await settle(app, pilot, lambda: "question number 1 from ro-a" in text_of(request))
        assert "You are terse." in text_of(request)
        assert "answer 1" in text_of(inspector.query_one("#call-response", Static))
        assert "101 102 103" in text_of(inspector.query_one("#call-tokens", Static))
        assert "ro-a-call-1" in text_of(inspector.query_one("#call-header", Static))


async def test_sql_console_result_and_error(home: Path) -> None:
    app = ForgetuiApp(refresh_s=0.2, stores_refresh_s=0.5)
    async with app.run_test(size=(180, 50)) as pilot:
        await settle(app, pilot, lambda: app.store is not None)  # the newest store is selected on start
        await pilot.press("e")
        console = app.query_one(SqlConsole)
        result = console.query_one("#sql-result", DataTable)
        status = console.query_one("#sql-status", Static)

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
            stores = app.query_one(StoreList)
            await pilot.press("c")  # a store's calls load when their tab is shown
            await settle(app, pilot, lambda: table.row_count == 1)
            assert stores.stores[0].live and stores.stores[0].runs[0].status == "running"
            for i in (1, 2):
                store.record_call(call_row(i, "ro-a"))
            store.update_run_status("run-live", "done")
            store.flush()
            await settle(app, pilot, lambda: table.row_count == 3 and stores.stores[0].runs[0].status == "done")
            assert [r[0] for r in table_rows(table)] == ["0", "1", "2"]
            assert stores.stores[0].n_calls == 3
            await pilot.press("c")
            table.focus()
            await pilot.press("f")  # follow: the cursor goes to the newest call, and stays on new ones
            await settle(app, pilot, lambda: table.cursor_row == 2)
            store.record_call(call_row(3, "ro-a"))
            store.flush()
            await settle(app, pilot, lambda: table.row_count == 4 and table.cursor_row == 3)
    finally:
        store.close()


async def test_a_worker_result_arriving_while_the_app_closes_is_dropped(home: Path) -> None:
    """Workers post from threads: a result that lands after the widgets are gone must not crash the app's exit."""
    from forgetui.tui.messages import StoresLoaded

    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.query_one(StoreList).remove()  # as on shutdown, before the queue is drained
        app.post_message(StoresLoaded([]))
        await pilot.pause()
        assert app.is_running  # and leaving the context re-raises any error the handler hit


# ---------------------------------------------------------------------- issue 10's defects
def test_rollout_label_drops_the_shared_run_prefix() -> None:
    assert data.rollout_label("run-20260101-abc/hello/0/s1") == "hello/0/s1"
    assert data.rollout_label("ro-a") == "ro-a"
    long = "run/" + "t" * 50 + "/3"
    assert data.rollout_label(long).endswith("t/3") and len(data.rollout_label(long)) == 32


async def test_inspector_body_is_plain_under_bold_headings(home: Path) -> None:
    """A heading's style must not become the base style of the request and response after it."""
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.query_one(CallsTable)
        await pilot.press("c")
        await settle(app, pilot, lambda: table.row_count == 3)
        table.focus()
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


async def test_empty_home_shows_how_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        header = app.query_one("#call-header", Static)
        await settle(app, pilot, lambda: "No runs yet" in text_of(header))
        assert "forgetui run examples/demo.toml" in text_of(header) and str(tmp_path) in text_of(header)


async def test_80x24_gives_the_calls_table_the_width(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(CallsTable)
        await pilot.press("c")
        await settle(app, pilot, lambda: table.row_count == 3)
        await pilot.pause()
        stores = app.query_one(StoreList)
        assert not stores.display or stores.size.width == 0
        assert table.size.width >= 70
        await pilot.press("s")  # the stores pane comes back on demand, and goes once a store is chosen
        await pilot.pause()
        assert stores.size.width > 0 and stores.has_focus
        await pilot.press("enter")
        await settle(app, pilot, lambda: stores.size.width == 0)


async def test_holding_the_arrow_key_loads_one_call(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []
    real = data.load_call

    def counting(path: Path, call_id: str):
        loaded.append(call_id)
        return real(path, call_id)

    monkeypatch.setattr(data, "load_call", counting)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.query_one(CallsTable)
        await pilot.press("c")
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
                       "Open a store by path…"):
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
        await pilot.press("c")
        await settle(app, pilot, lambda: table.row_count == 3)
        await pilot.press("down", "enter")  # the second call: ro-b's
        await settle(app, pilot, lambda: isinstance(app.screen, RolloutScreen))
        assert app.screen.rollout_id == "ro-b"
        conv = app.screen.query_one("#conv", Static)
        await settle(app, pilot, lambda: "question number 0 from ro-b" in text_of(conv))


async def test_a_store_loads_only_the_tab_that_is_shown(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Calls and Rollouts tables (up to a thousand rows each, styled on the event loop) fill when shown, not before."""
    asked: list[str] = []
    for name in ("load_calls", "load_rollouts"):
        real = getattr(data, name)
        monkeypatch.setattr(data, name, lambda path, _real=real, _name=name: asked.append(_name) or _real(path))
    app = ForgetuiApp(refresh_s=0.1, stores_refresh_s=60)
    async with app.run_test(size=(180, 50)) as pilot:
        await settle(app, pilot, lambda: app.store is not None)
        await pilot.pause(0.5)  # several refresh ticks on the Runs tab
        assert asked == [] and app.query_one(CallsTable).row_count == 0
        await pilot.press("o")
        await settle(app, pilot, lambda: app.query_one("#rollouts", DataTable).row_count > 0)
        assert set(asked) == {"load_rollouts"}
        await pilot.press("c")
        await settle(app, pilot, lambda: app.query_one(CallsTable).row_count == 3)
        assert "load_calls" in asked


async def test_the_footer_rebuilds_only_when_its_keys_change(home: Path) -> None:
    from forgetui.tui.widgets.key_footer import KeyFooter

    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        footer = app.query_one(KeyFooter)
        rebuilt: list[int] = []
        footer.call_after_refresh = lambda *a, **k: rebuilt.append(1)  # type: ignore[method-assign]
        for _ in range(5):  # what focus moves and widgets' refresh_bindings publish, with nothing changed
            footer.bindings_changed(app.screen)
        assert rebuilt == []
        app.query_one("#tabs").active = "tab-sql"  # other focus, other keys
        app.query_one("#sql-input").focus()
        await pilot.pause()
        footer.bindings_changed(app.screen)
        assert rebuilt == [1]


async def test_the_rollout_list_moves_scrolls_and_opens_by_key_and_click(tmp_path: Path) -> None:
    from textual.app import App

    from forgetui.tui.messages import RolloutOpened
    from forgetui.tui.run_data import RolloutLine, RunSource
    from forgetui.tui.widgets.rollout_lines import RolloutLines

    opened: list[str] = []

    class One(App):
        def compose(self):  # noqa: ANN202
            yield RolloutLines(RunSource(tmp_path), id="lines")

        def on_rollout_opened(self, message: RolloutOpened) -> None:
            opened.append(message.rollout_id)

    def line(i: int, status: str = "done") -> RolloutLine:
        return RolloutLine(f"r{i}", f"task-{i % 3}", i, 0, status, 1.0, True, 3, 24, 30.0, "boom\nagain" if i == 7 else None)

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
        assert lines.render_line(lines.size.height - 1).text.startswith(" done")  # drawn: the row, not a blank
        await pilot.press("pageup")
        assert lines.cursor == 49 - (lines.scrollable_content_region.height - 2)
        await pilot.press("home", "enter")
        await pilot.pause()
        assert lines.cursor == 0 and lines.scroll_offset.y == 0 and opened == ["r0"]
        await pilot.click(RolloutLines, offset=(5, 3))  # the row under the pointer: header, then r0, r1, r2
        assert lines.cursor == 2 and opened == ["r0"]
        await pilot.click(RolloutLines, offset=(5, 3))  # again: it opens
        await pilot.pause()
        assert opened == ["r0", "r2"]
        lines.show_lines([line(i, "running") for i in range(2)])  # fewer rows: the cursor stays inside
        await pilot.pause()
        assert lines.cursor == 1 and lines.row_cells(0)[0] == "running"


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
