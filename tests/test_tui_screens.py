"""The drill-down: Runs (filter, sort) → Run (pass@k, training curves, rollouts) → Rollout (conversation, tools,
verifier, token view, raw JSON), on stores written by the real writer; and a veRL run's shards read as one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static, TabbedContent

from core.models.resolve import load_tokenizer, resolve_model
from core.models.tiny import ensure_tiny_model
from forgetui.tui.app import ForgetuiApp
from forgetui.tui.rows import filter_rows
from forgetui.tui.samples import rollout_log
from forgetui.tui.screens.rollout_screen import RolloutScreen
from forgetui.tui.screens.run_screen import RunScreen
from forgetui.tui.source import RunCatalog, RunSource
from forgetui.tui.widgets.behaviour_table import BehaviourTable
from forgetui.tui.widgets.call_json import CallJson
from forgetui.tui.widgets.filter_bar import FilterBar
from forgetui.tui.widgets.pass_table import PassTable
from forgetui.tui.widgets.rollout_lines import RolloutLines
from forgetui.tui.widgets.runs_table import RunsTable
from forgetui.tui.widgets.token_view import TokenView
from forgetui.tui.widgets.train_curves import TrainCurves
from tests.tui_helpers import text_of, until
from tests.tui_stores import build_run

SESSION_HOME = Path(os.environ["FORGETUI_HOME"])


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("tiny"))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer) -> Path:
    """Two runs: `train-run` (3 training steps) and `eval-run`; models shared with the session's home."""
    (tmp_path / "models").symlink_to(ensure_tiny_model(SESSION_HOME / "models").parent, target_is_directory=True)
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    build_run(tmp_path, "eval-run", tasks=3, samples=2, tokenizer=tokenizer)
    build_run(tmp_path, "train-run", tasks=2, samples=4, steps=3, tokenizer=tokenizer)
    return tmp_path


def cells(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


# ---------------------------------------------------------------------- data (no textual)
def test_run_catalog_rows(home: Path) -> None:
    runs = {r.run_id: r for r in RunCatalog().list()}
    train, ev = runs["train-run"].cells(), runs["eval-run"].cells()
    # eval-run: 6 rollouts with statuses done, done, failed, timeout, done, infra_error; passed where (t+i) even
    assert ev["progress"] == "6/6" and ev["status"] == "done" and ev["model"] == "builtin:tiny"
    assert ev["pass rate"] == "0.400" and ev["reward"] == "0.400"  # 2 of the 5 scored (infra error excluded)
    # pass@k at the largest k every task has scored samples for: task-2 has one (its other is an infra error)
    assert ev["pass@k"] == "0.500 @1"
    assert train["step"] == "3/3" and train["progress"] == "24/24"  # steps 0-2 of 3: done
    assert [r.run_id for r in filter_rows(list(runs.values()), "train")] == ["train-run"]


def test_shards_read_as_one_run(home: Path, tokenizer) -> None:
    """A veRL run: the driver's store and two workers' shards, each holding part of the rollouts."""
    run_dir = home / "runs" / "verl-run"
    build_run(home, "verl-run", tasks=1, samples=2, tokenizer=tokenizer, store_path=run_dir / "store.duckdb")
    for n in (1, 2):
        build_run(home, "verl-run", tasks=1, samples=2, tokenizer=tokenizer, seed=n,
                  store_path=run_dir / "shards" / f"worker-{n}" / "store.duckdb")
    detail = RunSource(run_dir).run_detail()
    assert len(detail.rollouts) == 6  # 2 per store: the same ids under different stores count apart
    info = [r for r in RunCatalog().list() if r.run_id == "verl-run"]
    assert len(info) == 1 and info[0].total == 6 and info[0].shards == 2


def test_rollout_detail_tokens_and_samples(home: Path) -> None:
    d = RunSource(home / "runs" / "eval-run").rollout("eval-run/task-0/0")
    assert [c["seq"] for c in d.calls] == [0, 1, 2]
    (sample,) = d.samples  # built from the 3 calls, which extend each other: one branch
    assert sample.pieces is not None and "".join(sample.pieces).startswith("You are terse.")
    completions = [c["completion_token_ids"] for c in d.calls]
    assert sum(sample.loss_mask) == sum(len(c) for c in completions)
    for call, start, end in zip(d.calls, sample.completion_starts, sample.completion_ends, strict=True):
        assert sample.token_ids[start:end] == list(call["completion_token_ids"])
        assert sample.logprobs[start:end] == pytest.approx(list(call["completion_logprobs"]))
    assert d.rollout["meta"]["verifier"] == "hello.txt found"


# ---------------------------------------------------------------------- the screens
async def test_runs_filter_sort_open_run_and_rollout(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(160, 48)) as pilot:
        runs = app.query_one(RunsTable)
        await until(pilot, lambda: runs.row_count == 2, "two runs listed")
        assert app.query_one("#tabs", TabbedContent).active == "tab-runs" and runs.has_focus
        await pilot.press("slash", *"eval")
        await until(pilot, lambda: runs.row_count == 1, "filtered to one run")
        assert runs.row_cells(0)[0] == "eval-run" and "filter “eval”" in runs.border_subtitle
        await pilot.press("escape")
        await until(pilot, lambda: runs.row_count == 2, "filter cleared")
        assert "filter" not in runs.border_subtitle  # the subtitle says what is shown now
        await pilot.press("S", "S", "S", "S")  # created → run → status → pass rate → reward
        assert runs.sort_key == "reward" and "sorted by reward" in runs.border_subtitle
        target = [i for i, r in enumerate(runs.shown) if r.run_id == "train-run"][0]
        runs.cursor = target
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the Run screen")
        screen = app.screen
        lines = screen.query_one(RolloutLines)
        await until(pilot, lambda: lines.row_count == 24, "24 rollouts on the Run screen")
        pass_table = screen.query_one(PassTable)
        assert [r[0] for r in pass_table.rows()] == ["1", "2", "4", "8"] and pass_table.rows()[-1][2] == "0.000"
        assert pass_table.size.height == 4 + 2  # sized to its content (k rows, header and its rule): pass^8 shows
        assert "over 21 samples of 2 tasks" in text_of(screen.query_one("#run-summary-text", Static))  # 3 infra errors left out
        curves = screen.query_one(TrainCurves)
        assert curves.border_subtitle == "3 steps" and curves.size.height == 0  # behind the Rollouts tab
        await pilot.press("right")  # ←/→ switch the tabs
        await pilot.pause()
        assert curves.size.height > 10 and curves.has_focus
        loss = curves.query_one("#curve-loss").plt
        assert "loss 0.167" in loss.build()  # the last step's loss, 0.5 / 3, in the plot's title
        await pilot.press("right")  # behaviour: `forgetui analyze`'s table, computed when the tab opens
        behaviour = screen.query_one(BehaviourTable)
        await until(pilot, lambda: behaviour.row_count > 0, "the behaviour table")
        header = [str(c.label) for c in behaviour.columns.values()]
        assert header[0].startswith("metric") and len(header) == 1 + 3  # one group per training step
        assert all("train-run · toy · react" in h and "(n=" in h for h in header[1:])
        rows = {r[0]: r[1:] for r in cells(behaviour)}
        assert {"pass rate", "tool calls", "turns", "verified after last write"} <= set(rows)
        assert all(v != "-" for v in rows["tool calls"])
        await pilot.press("t")  # ←/→ scroll the behaviour table there: t steps to the next tab
        assert "step 2: reward 0.650" in text_of(screen.query_one("#run-summary-text", Static))
        first = lines.row_cells(0)
        assert first[:6] == ["passed", "task-0", "0", "0", "1", "3"]
        assert lines.has_focus
        await pilot.press("slash", *"timeout")  # the rollouts filter
        await until(pilot, lambda: lines.row_count < 24, "the filtered rollouts")
        assert {lines.row_cells(i)[0] for i in range(lines.row_count)} == {"timeout"}
        await pilot.press("escape")
        await until(pilot, lambda: lines.row_count == 24 and lines.has_focus, "the filter cleared")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RolloutScreen), "the Rollout screen")
        rollout = app.screen
        conv = rollout.query_one("#conv", Static)
        await until(pilot, lambda: "call 3/3" in text_of(conv), "the conversation")
        body = text_of(conv)
        assert "tools offered: shell" in body and 'shell({"command": "echo hi > hello0.txt"})' in body
        assert "Say hello." in body and "ok 0" in body  # the user turn and a tool result
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "back on the Run screen")
        await pilot.press("q")  # q steps back too (k9s, lazygit): it does not quit from a sub-screen
        await until(pilot, lambda: app.screen is app.home_screen, "back home")
        assert app.is_running


async def test_token_view_cursor_and_raw_json(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await app.push_screen(RolloutScreen(RunSource(home / "runs" / "eval-run"), "eval-run/task-0/0"))
        screen = app.screen
        view = screen.query_one(TokenView)
        await until(pilot, lambda: view.sample is not None, "the sample")
        screen.query_one("#rollout-tabs", TabbedContent).active = "tab-tokens"
        view.focus()
        sample = view.sample
        first = sample.loss_mask.index(1)
        cursor = screen.query_one("#token-cursor", Static)
        assert view.cursor == first and "sampled" in text_of(cursor) and "call 1/3 completion" in text_of(cursor)
        assert f"logprob {sample.logprobs[first]:.4f}" in text_of(cursor)
        await pilot.press("n")  # to the next call's completion, past the inserted tool result
        assert view.cursor == sample.completion_starts[1]
        await pilot.press("left")
        assert "inserted (mask 0)" in text_of(cursor) and "call 2/3 prompt" in text_of(cursor)
        body = view.query_one("#token-body", Static).content
        assert "│call 2▸" in body.plain and "hello" in body.plain
        legend = text_of(view.query_one("#token-legend", Static))
        assert "sampled, by p" in legend and "inserted (mask 0)" in legend and "│call N▸" in legend
        # neighbouring tokens of one colour still read apart: every other token is a shade darker
        styles = [str(span.style) for span in body.spans if "on rgb" in str(span.style) and "reverse" not in str(span.style)]
        assert len(set(styles[:2])) == 2 or len(styles) < 2
        screen.query_one("#rollout-tabs", TabbedContent).active = "tab-raw"
        raw = screen.query_one(CallJson)
        await until(pilot, lambda: '"call_id": "eval-run/task-0/0#c0"' in raw.text, "the first call's JSON")
        screen.query_one("#raw-calls").focus()
        await pilot.press("down")
        await until(pilot, lambda: '"call_id": "eval-run/task-0/0#c1"' in raw.text, "the second call's JSON")


async def test_rollouts_tab_enter_opens_the_rollout(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(160, 48)) as pilot:
        table = app.query_one("#rollouts-table", RolloutLines)
        await until(pilot, lambda: app.home_screen.in_focus is not None, "a run in focus")
        await pilot.press("3")  # a run's rollouts load when their tab is shown
        await until(pilot, lambda: table.row_count > 0, "the run's rollouts")
        assert table.border_title == f"Rollouts of {app.home_screen.in_focus[1]}"
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RolloutScreen), "the Rollout screen")


async def test_filter_input_is_hidden_until_slash(home: Path) -> None:
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.query_one(RunsTable).row_count == 2, "the runs")
        box = app.query_one("#tab-runs").query_one(FilterBar)
        assert box.size.height == 0
        await pilot.press("slash")
        await pilot.pause()
        assert box.has_focus and box.size.height > 0


async def test_a_long_conversation_shows_its_first_calls_then_all(home: Path, tokenizer) -> None:
    from forgetui.tui.screens.rollout_screen import FIRST_CALLS

    build_run(home, "long-run", tasks=1, samples=1, calls=FIRST_CALLS + 5, tokenizer=tokenizer)
    app = ForgetuiApp(refresh_s=60, stores_refresh_s=60)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await app.push_screen(RolloutScreen(RunSource(home / "runs" / "long-run"), "long-run/task-0/0"))
        conv = app.screen.query_one("#conv", Static)
        await until(pilot, lambda: "more calls" in text_of(conv), "the first calls")
        assert f"call {FIRST_CALLS}/{FIRST_CALLS + 5}" in text_of(conv) and "… 5 more calls" in text_of(conv)
        assert app.screen.check_action("all_calls", ()) is True
        await pilot.press("m")
        await until(pilot, lambda: f"call {FIRST_CALLS + 5}/{FIRST_CALLS + 5}" in text_of(conv), "every call")
        assert "more calls" not in text_of(conv)
        assert app.screen.check_action("all_calls", ()) is False  # shown: the key leaves the footer


def test_the_sandbox_log_shown_is_the_last_attempt_counted_as_numbers(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for n in (0, 2, 10):
        (logs / f"hello.0.attempt{n}.log").write_text(f"attempt {n}")
    (logs / "hello.0.s1.attempt0.log").write_text("another step's")
    assert rollout_log(tmp_path, {"task_id": "hello", "sample_index": 0, "step": 0}) == "attempt 10"
    assert rollout_log(tmp_path, {"task_id": "hello", "sample_index": 0, "step": 1}) == "another step's"
    assert rollout_log(tmp_path, {"task_id": "hello", "sample_index": 1, "step": 0}) is None
