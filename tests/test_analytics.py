"""Behaviour metrics on crafted recordings: a scripted policy through react, Codex and Claude Code in Docker,
where every metric's true value is known by construction (no tool calls, a failed command then a fix and a
read-back, a write never checked with one of four required outputs, a malformed tool call)."""

from __future__ import annotations

import json

import duckdb
import pytest

from core.analytics.metrics import behaviour_table, rollout_rows, tool_usage
from core.store.tool_classes import UNKNOWN, classify
from tests.analytics_runs import crafted_scripts, run_scripted, toy_tasks

HARNESSES = {"react": "chat", "codex": "responses", "claude-code": "messages"}


@pytest.fixture(scope="module")
def crafted(request, tmp_path_factory, docker_client, base_image):
    """harness → ([stores], rollout rows by family): one run per crafted task and harness."""
    tasks = toy_tasks()
    scripts = crafted_scripts(tasks)
    out = {}
    for harness in HARNESSES:
        stores, rows = [], {}
        for name, task in tasks.items():
            summary = run_scripted(harness, scripts[name], tmp_path_factory.mktemp(f"{harness}-{name}"), tasks=[task.id])
            stores.append(summary.store)
            (rows[name],) = rollout_rows([summary.store])
        out[harness] = (stores, rows)
    return tasks, out


def runs_store(runs, harness: str, row: dict) -> str:
    """The store of the run that recorded `row`."""
    return next(s for s in runs[harness][0] if row["run_id"] in str(s))


def store_facts(store: str, rollout_id: str) -> dict:
    """What the store says independently of the views: token sums, prompt lengths, offered tool names."""
    con = duckdb.connect(store, read_only=True)
    try:
        calls = con.execute(
            "SELECT seq, len(completion_token_ids), len(prompt_token_ids), request FROM calls_full WHERE rollout_id = ? ORDER BY seq", [rollout_id]
        ).fetchall()
    finally:
        con.close()
    first = json.loads(calls[0][3])
    tools = first.get("tools") or []
    names = [t.get("function", t).get("name") for t in tools]
    return {"sampled": sum(c[1] for c in calls), "prompts": [c[2] for c in calls], "offered": [n for n in names if n]}


@pytest.mark.docker
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("harness", list(HARNESSES))
def test_every_metric_has_its_constructed_value(crafted, harness):
    tasks, runs = crafted
    _, rows = runs[harness]
    assert set(rows) == {"hello", "make-dirs", "sum-numbers", "write-file"}, [r["status"] for r in rows.values()]
    n_dirs = len(tasks["make-dirs"].meta["params"]["dirs"])

    none = rows["hello"]  # no tool call
    assert (none["tool_calls"], none["turns"], none["classes_used"], none["coverage"]) == (0, 1, 0, 0.0)
    assert none["wrote"] is False and none["verified"] is None
    assert (none["failed_tool_calls"], none["had_tool_error"], none["recovered"]) == (0, False, False)
    assert none["passed"] is False and none["malformed_calls"] == 0 and none["plan_completion"] is None

    unchecked = rows["make-dirs"]  # one of n dirs, never looked at again
    assert (unchecked["tool_calls"], unchecked["turns"], unchecked["classes_used"]) == (1, 2, 1)
    assert unchecked["wrote"] is True and unchecked["verified"] is False
    assert (unchecked["checks"], unchecked["checks_met"]) == (n_dirs, 1)
    assert unchecked["plan_completion"] == pytest.approx(1 / n_dirs) == unchecked["reward"]
    assert unchecked["failed_tool_calls"] == 0 and unchecked["passed"] is False

    fixed = rows["sum-numbers"]  # cat of a missing file fails, the fix writes the sum file, cat reads it back
    assert (fixed["tool_calls"], fixed["turns"]) == (3, 4)
    assert (fixed["failed_tool_calls"], fixed["had_tool_error"], fixed["recovered"]) == (1, True, True)
    assert fixed["wrote"] is True and fixed["verified"] is True and fixed["passed"] is True
    assert fixed["checks"] == 1 and fixed["plan_completion"] is None  # one required output: no plan to complete

    malformed = rows["write-file"]
    assert (malformed["malformed_calls"], malformed["tool_calls"], malformed["turns"]) == (1, 0, 1)

    for row in rows.values():
        assert row["harness"] == harness and row["unknown_tool_calls"] == 0 and row["branches"] == 1
        facts = store_facts(str(runs_store(runs, harness, row)), row["rollout_id"])
        assert row["sampled_tokens"] == facts["sampled"] and row["prompt_tokens"] == sum(facts["prompts"])
        if row["turns"] > 1:
            assert row["context_growth"] == pytest.approx((facts["prompts"][-1] - facts["prompts"][0]) / (row["turns"] - 1))
        else:
            assert row["context_growth"] is None
        offered = {classify(harness, name) for name in facts["offered"]} - {UNKNOWN}
        assert row["classes_offered"] == len(offered) > 0
    assert fixed["coverage"] == pytest.approx(1 / fixed["classes_offered"])


@pytest.mark.docker
@pytest.mark.timeout(1500)
def test_aggregates_and_tool_usage_per_harness(crafted):
    tasks, runs = crafted
    n_dirs = len(tasks["make-dirs"].meta["params"]["dirs"])
    stores = [store for h in HARNESSES for store in runs[h][0]]
    table = {row["harness"]: row for row in behaviour_table(stores, by="harness")}
    assert set(table) == set(HARNESSES)
    for row in table.values():
        assert row["rollouts"] == 4
        assert row["pass_rate"]["value"] == 0.25 and row["pass_rate"]["n"] == 4
        assert row["pass_rate"]["low"] <= 0.25 <= row["pass_rate"]["high"]  # n = 4 allows an interval
        assert row["verify_rate"]["value"] == 0.5 and row["verify_rate"]["n"] == 2  # only the two rollouts that wrote
        assert row["tool_error_rate"]["value"] == 0.25 and row["recovery_rate"]["value"] == 1.0
        assert row["recovery_rate"]["n"] == 1 and row["recovery_rate"]["low"] is None  # one rollout: no interval
        assert row["plan_completion"]["value"] == pytest.approx(1 / n_dirs)
        assert row["malformed_calls"]["value"] == 0.25 and row["tool_calls"]["value"] == 1.0
    usage: dict[tuple[str, str, str], list[int]] = {}
    for u in tool_usage(stores):  # one row per run × harness × tool: summed over the four runs
        total = usage.setdefault((u["harness"], u["tool"], u["class"]), [0, 0, 0])
        for i, key in enumerate(("calls", "rollouts", "failed")):
            total[i] += u[key]
    assert usage == {(h, tool, "shell"): [4, 2, 1] for h, tool in {"react": "bash", "codex": "exec_command", "claude-code": "Bash"}.items()}


@pytest.mark.docker
@pytest.mark.timeout(1500)
def test_views_live_in_the_store_for_forgetui_sql(crafted):
    from core.store.query import run_query

    _, runs = crafted
    store = runs["codex"][0][2]  # sum-numbers: three tool calls, one failed
    result = run_query(store, "SELECT tool, class, writes FROM tool_uses ORDER BY pos")
    assert result.rows == [["exec_command", "shell", False], ["exec_command", "shell", True], ["exec_command", "shell", False]]
    failed = run_query(store, "SELECT count(*) FROM tool_results WHERE failed")
    assert failed.rows == [[1]]
