"""The behaviour views on hand-written wire bodies (protocol shapes the Docker tests do not reach), the tool
class table against every tool real harnesses offered, and the per-check scores environments record."""

from __future__ import annotations

import json

import pytest

from core.store.tool_classes import GENERIC_TOOLS, HARNESS_TOOLS, UNKNOWN, classify, table_rows
from core.store.writer import Store
from envs.claw_bench.report import parse_junit
from tests.conftest import harness_requests

FIXTURE_HARNESS = {"openclaw-chat": "openclaw"}


def offered_names(body: dict) -> list[str]:
    names = []
    for tool in body.get("tools") or []:
        if "function" in tool:
            names.append(tool["function"]["name"])
        elif tool.get("type") in (None, "function", "custom") and "name" in tool:
            names.append(tool["name"])
        names += [d["name"] for d in tool.get("functionDeclarations") or []]
    return names


def test_every_tool_a_real_harness_offered_has_a_class():
    seen = 0
    for fixture, request in harness_requests():
        body = request.get("body")
        body = json.loads(body) if isinstance(body, str) else body
        harness = FIXTURE_HARNESS.get(fixture, fixture)
        for name in offered_names(body or {}):
            assert classify(harness, name) != UNKNOWN, (harness, name)
            seen += 1
    assert seen > 50


def test_classification_falls_back_by_name_and_reports_unknown_tools():
    assert classify("react", "bash") == "shell" and classify("claude-code", "Edit") == "write"
    assert classify("some-new-harness", "Read_File") == "read"  # generic table, lower-cased
    assert classify("codex", "launch_rocket") == UNKNOWN
    keys = [(h, t) for h, t, _ in table_rows()]
    assert len(keys) == len(set(keys)) == sum(map(len, HARNESS_TOOLS.values())) + len(GENERIC_TOOLS)


def _call(rollout: str, seq: int, api: str, request: dict, response: dict, **extra) -> dict:
    return {"call_id": f"{rollout}-{seq}", "rollout_id": rollout, "seq": seq, "attempt": 0, "api": api, "status": "ok",
            "request": request, "response": response, "branch": 0, **extra}  # fmt: skip


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "store.duckdb")
    s.insert_run("run", {"policy": {"backend": "scripted:x"}})
    yield s
    s.close()


def rows(store: Store, sql: str) -> list[tuple]:
    from core.store.behaviour import with_views

    store.flush()
    return [tuple(r) for r in store.cursor().execute(with_views(sql)).fetchall()]


def test_gemini_calls_and_error_results(store):
    store.upsert_rollout({"rollout_id": "g", "run_id": "run", "env": "toy", "task_id": "t", "harness": "gemini-cli", "status": "done", "passed": True, "reward": 1.0, "attempt": 0})
    decl = {"functionDeclarations": [{"name": "run_shell_command"}, {"name": "read_file"}, {"name": "google_web_search"}]}
    call = {"functionCall": {"id": "c1", "name": "run_shell_command", "args": {"command": "ls missing 2>&1"}}}
    store.record_call(_call("g", 0, "gemini", {"contents": [{"role": "user", "parts": [{"text": "go"}]}], "tools": [decl]},
                            {"candidates": [{"content": {"role": "model", "parts": [{"text": "let me look"}, call]}}]}))  # fmt: skip
    result = {"functionResponse": {"id": "c1", "name": "run_shell_command", "response": {"error": "Command failed"}}}
    store.record_call(_call("g", 1, "gemini", {"contents": [{"role": "user", "parts": [{"text": "go"}]}, {"role": "model", "parts": [call]}, {"role": "user", "parts": [result]}], "tools": [decl]},
                            {"candidates": [{"content": {"role": "model", "parts": [{"text": "done"}]}}]}))  # fmt: skip
    assert rows(store, "SELECT tool, class, pos, writes FROM tool_uses") == [("run_shell_command", "shell", 1, False)]
    assert rows(store, "SELECT tool_id, seq, failed FROM tool_results") == [("c1", 1, True)]
    (b,) = rows(store, "SELECT classes_offered, classes_used, tool_calls, failed_tool_calls, recovered, wrote, verified FROM rollout_behaviour")
    assert b == (3, 1, 1, 1, True, False, None)


def test_chat_list_content_and_responses_custom_tools(store):
    for rid, harness in (("c", "opencode"), ("r", "codex")):
        store.upsert_rollout({"rollout_id": rid, "run_id": "run", "env": "toy", "task_id": "t", "harness": harness, "status": "done", "passed": False, "reward": 0.0, "attempt": 0})
    tc = {"id": "t1", "type": "function", "function": {"name": "write", "arguments": json.dumps({"filePath": "a.txt", "content": "x"})}}
    store.record_call(_call("c", 0, "chat", {"messages": [{"role": "user", "content": "go"}]}, {"choices": [{"message": {"role": "assistant", "tool_calls": [tc]}}]}))
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [tc]}, {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "Traceback (most recent call last):\n boom"}]}]
    store.record_call(_call("c", 1, "chat", {"messages": msgs}, {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}))
    patch = {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** Begin Patch\n*** Add File: b.txt\n+x\n*** End Patch"}
    run = {"type": "function_call", "call_id": "p2", "name": "exec_command", "arguments": json.dumps({"cmd": "cat b.txt 2>/dev/null"})}
    store.record_call(_call("r", 0, "responses", {"input": "go"}, {"output": [patch, run]}))
    out = [{"type": "custom_tool_call_output", "call_id": "p1", "output": "Success"}, {"type": "function_call_output", "call_id": "p2", "output": "Process exited with code 0\nx"}]
    store.record_call(_call("r", 1, "responses", {"input": [patch, run, *out]}, {"output": [{"type": "message", "content": [{"type": "output_text", "text": "done"}]}]}))
    assert rows(store, "SELECT rollout_id, tool, class, writes FROM tool_uses ORDER BY rollout_id, pos") == [
        ("c", "write", "write", True), ("r", "apply_patch", "write", True), ("r", "exec_command", "shell", False)]  # fmt: skip
    assert rows(store, "SELECT rollout_id, tool_id, failed FROM tool_results ORDER BY rollout_id, tool_id") == [("c", "t1", True), ("r", "p1", False), ("r", "p2", False)]
    assert rows(store, "SELECT rollout_id, verified FROM rollout_behaviour ORDER BY rollout_id") == [("c", False), ("r", True)]


@pytest.mark.parametrize(
    ("command", "writes"),
    [("cat a.txt 2>&1", False), ("ls > /dev/null 2>&1", False), ("python3 -c 'x=1' >= 0", False), ("grep -c x log.txt", False),
     ("echo hi > hello.txt", True), ("sort a | tee b", True), ("sed -i 's/a/b/' f", True), ("mkdir -p a/b", True), ("mv a b", True)],
)  # fmt: skip
def test_shell_write_heuristic(store, command, writes):
    store.upsert_rollout({"rollout_id": "s", "run_id": "run", "env": "toy", "task_id": "t", "harness": "react", "status": "done", "attempt": 0})
    tc = {"id": "x", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    store.record_call(_call("s", 0, "chat", {"messages": []}, {"choices": [{"message": {"tool_calls": [tc]}}]}))
    assert rows(store, "SELECT writes FROM tool_uses") == [(writes,)]


def test_every_query_sees_the_views_the_file_does_not_hold(store):
    from core.store.behaviour import VIEW_NAMES
    from core.store.live import handle_query
    from core.store.query import run_query

    store.upsert_rollout({"rollout_id": "r", "run_id": "run", "env": "toy", "task_id": "t", "harness": "react", "status": "done", "attempt": 0})
    store.record_call(_call("r", 0, "chat", {"tools": [{"type": "function", "function": {"name": "bash"}}]},
                            {"choices": [{"message": {"tool_calls": [{"id": "a", "function": {"name": "bash", "arguments": "{}"}}]}}]}))
    store.flush()
    names = {r[0] for r in store.cursor().execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert not names & set(VIEW_NAMES) and {"calls_full", "call_requests"} <= names  # ~115 KB of catalog kept out
    live = handle_query(store, "SELECT tool, class FROM tool_uses")  # the writer's live endpoint
    assert live["rows"] == [["bash", "shell"]]
    described = handle_query(store, "DESCRIBE rollout_behaviour")
    assert "coverage" in [r[0] for r in described["rows"]]
    store.close()
    assert run_query(store.path, "SELECT tool_calls, classes_offered FROM rollout_behaviour").rows == [[1, 1]]  # the file
    # a query that defines one itself (core.store.behaviour.with_views) keeps its own
    assert run_query(store.path, "WITH tool_uses AS (SELECT 7 AS n) SELECT n FROM tool_uses").rows == [[7]]


def test_plan_completion_from_recorded_checks(store):
    for rid, checks in (("p3", {"a": 1.0, "b": 0.0, "c": 1.0}), ("p1", {"only": 1.0}), ("p0", None)):
        store.upsert_rollout({"rollout_id": rid, "run_id": "run", "env": "toy", "task_id": rid, "harness": "react", "status": "done", "attempt": 0, "meta": {"checks": checks} if checks else {}})
    got = rows(store, "SELECT rollout_id, checks, checks_met, plan_completion FROM rollout_behaviour ORDER BY rollout_id")
    assert got == [("p0", 0, 0, None), ("p1", 1, 1, None), ("p3", 3, 2, pytest.approx(2 / 3))]


def test_junit_cases_are_the_per_check_scores():
    xml = """<testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b"><failure message="x"/></testcase>
    <testcase classname="t" name="c"><skipped/></testcase><testcase name="d"/></testsuite>"""
    assert parse_junit(xml).cases == {"t::a": 1.0, "t::b": 0.0, "d": 1.0}


async def test_toy_verifier_records_one_check_per_required_output(tmp_path):
    import uuid

    from core.runtime import make_runtime
    from core.runtime.base import SandboxSpec
    from envs.toy import ToyEnv

    runtime = make_runtime("local", base_dir=tmp_path / "sandboxes")  # the toy verifier's own tests run it so too
    box = runtime.create(SandboxSpec(image="none", run_id="test-checks", rollout_id=uuid.uuid4().hex[:8]))
    await box.start()
    try:
        env = ToyEnv(families=["rename"], n=10)
        task = next(t for t in env.tasks() if len(t.meta["params"].get("stems", [])) == 4)
        p = task.meta["params"]
        for rel, data in task.files.items():
            await box.put_file(f"/workspace/{rel}", data.encode())
        stems = p["stems"]  # 1st and 3rd renamed, 2nd copied (the old file stays), 4th untouched
        script = f"mv {stems[0]}.{p['from']} {stems[0]}.{p['to']} && cp {stems[1]}.{p['from']} {stems[1]}.{p['to']} && mv {stems[2]}.{p['from']} {stems[2]}.{p['to']}"
        assert (await box.exec(script, timeout_s=30, workdir="/workspace")).exit_code == 0
        score = await env.verify(box, task, "/workspace")
        assert score.checks == {f"{s}.{p['to']}": v for s, v in zip(stems, (1.0, 0.0, 1.0, 0.0), strict=True)}
        assert score.score == 0.5
        dirs_env = ToyEnv(families=["make-dirs"], n=10)
        dirs_task = next(t for t in dirs_env.tasks() if len(t.meta["params"].get("dirs", [])) >= 3)
        dirs = dirs_task.meta["params"]["dirs"]
        assert (await box.exec(f"mkdir -p {dirs[1]}", timeout_s=30, workdir="/workspace")).exit_code == 0
        made = await dirs_env.verify(box, dirs_task, "/workspace")
        assert made.checks == {d: (1.0 if d == dirs[1] else 0.0) for d in dirs}
    finally:
        await box.stop()


def test_a_reference_harness_evaluates_no_model(store):
    """oracle/noop load no policy: their rows say `none`, not the config's (unused) policy.backend, as reports do."""
    from core.registry import model_shown_for

    for rid, harness in (("o", "oracle"), ("n", "noop"), ("r", "react")):
        store.upsert_rollout({"rollout_id": rid, "run_id": "run", "env": "toy", "task_id": "t", "harness": harness, "status": "done", "attempt": 0})
    assert rows(store, "SELECT rollout_id, model FROM rollout_behaviour ORDER BY rollout_id") == [("n", "none"), ("o", "none"), ("r", "scripted:x")]
    assert [model_shown_for("builtin:tiny", h) for h in ("oracle", "noop", "react", "not-installed-here")] == ["none", "none", "builtin:tiny", "builtin:tiny"]
