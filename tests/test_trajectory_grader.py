"""Graders read the trajectory: before the verifier runs, the rollout's recorded conversation is at
/logs/agent/trajectory.jsonl (OpenAI chat messages with tool calls), /logs/agent/trajectory.json
(harbor's ATIF), /logs/agent/sessions/projects/<cwd-slug>/<uuid>.jsonl (a Claude Code session) and
/logs/agent/openclaw/agents/main/sessions/<uuid>.jsonl (an OpenClaw session, found through its
sessions.json), whatever the harness.

A harbor task whose test.sh passes only when all four show a shell tool call carrying a marker,
with its result: the built-in harness and two external harnesses (Codex on the Responses API,
Claude Code on Anthropic Messages) under the scripted backend, and two controls that must score 0.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
import pytest

from core.config import load_config
from core.rollout.trajectory import main_conversation

pytestmark = pytest.mark.docker

MARKER = "grader-marker-5e1f"
TOOL_SCRIPT = [{"tool": "shell", "command": f"echo {MARKER} > note.txt"}, {"text": "Wrote note.txt."}]
TEXT_ONLY = [{"text": f"I would run: echo {MARKER} > note.txt"}]  # names the marker, calls no tool
GRADER = r"""#!/bin/bash
python3 - <<'PY'
import glob, json

def marked(args):
    return "MARKER" in (args if isinstance(args, str) else json.dumps(args))

found, present, atif_calls = set(), set(), []
try:  # OpenAI chat messages, one per line
    for line in open("/logs/agent/trajectory.jsonl"):
        if any(marked(c["function"]["arguments"]) for c in json.loads(line).get("tool_calls") or []):
            found.add("jsonl")
except FileNotFoundError:
    pass
try:  # harbor's ATIF: the marked call and its result in one agent step
    doc = json.load(open("/logs/agent/trajectory.json"))
    present.add("atif")
    for step in doc["steps"] if doc["schema_version"].startswith("ATIF-v1.") else []:
        calls = step.get("tool_calls") or []
        atif_calls += [c["tool_call_id"] for c in calls]
        answered = {r.get("source_call_id") for r in (step.get("observation") or {}).get("results", [])}
        if step["source"] == "agent" and any(marked(c["arguments"]) and c["tool_call_id"] in answered for c in calls):
            found.add("atif")
except FileNotFoundError:
    pass
for path in glob.glob("/logs/agent/sessions/projects/-app/*.jsonl"):  # a Claude Code session, as harbor keeps it
    present.add("session")
    events = [json.loads(line) for line in open(path)]
    blocks = [b for e in events if isinstance(e["message"]["content"], list) for b in e["message"]["content"]]
    uses = {b["id"] for b in blocks if b["type"] == "tool_use" and marked(b["input"])}
    if uses & {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}:
        found.add("session")
try:  # an OpenClaw session as older OpenClaw wrote it, found as OpenClaw tooling finds it: through sessions.json
    sessions = "/logs/agent/openclaw/agents/main/sessions"
    entry = json.load(open(f"{sessions}/sessions.json"))["agent:main:main"]
    present.add("openclaw")
    header, *entries = [json.loads(line) for line in open(entry["sessionFile"])]
    ok = (header["type"], header["version"], header["id"]) == ("session", 3, entry["sessionId"])
    ok = ok and entry["sessionFile"] == f"{sessions}/{entry['sessionId']}.jsonl"
    messages = [e["message"] for e in entries if e["type"] == "message"]
    calls = {b["id"] for m in messages if m["role"] == "assistant" for b in m["content"]
             if b["type"] == "toolCall" and marked(b["arguments"])}
    results = {m["toolCallId"] for m in messages if m["role"] == "toolResult" and not m["isError"]}
    if ok and calls & results:
        found.add("openclaw")
except FileNotFoundError:
    pass
print("present:", " ".join(sorted(present)))
print("found:", " ".join(sorted(found)))
print("atif-calls:", json.dumps(atif_calls))
open("/logs/verifier/reward.txt", "w").write("1" if found == {"jsonl", "atif", "openclaw", "session"} else "0")
PY
""".replace("MARKER", MARKER)


def _grader_said(row: dict, key: str) -> str:
    """What the grader printed after `key:` (its stdout is in the verifier's detail)."""
    lines = [line for line in row["meta"]["verifier"].splitlines() if line.startswith(f"{key}:")]
    assert lines, row["meta"]["verifier"]
    return lines[-1].removeprefix(f"{key}:").strip()


def _suite(root: Path, base_image: str) -> Path:
    task = root / "suite" / "cite-the-command"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 240.0\n[verifier]\ntimeout_sec = 60.0\n")
    (task / "instruction.md").write_text(f"Run exactly this shell command: echo {MARKER} > note.txt\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {base_image}\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(GRADER)
    return task.parent


def _run(tmp_path: Path, base_image: str, harness: str, turns: list[dict] | None) -> tuple[dict, list[dict]]:
    script = tmp_path / f"{harness}-script.json"
    script.write_text(json.dumps({"turns": turns or []}))
    config = load_config(None, [
        "env.name=harbor", f"env.path={json.dumps(str(_suite(tmp_path / harness, base_image)))}", f'harness.name="{harness}"',
        f'policy.backend="scripted:{script}"', "runtime.kind=docker", "run.max_retries=0",
    ])  # fmt: skip
    from core.run import execute_run

    summary = asyncio.run(execute_run(config))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        cur = con.execute("SELECT status, reward, passed, error, meta FROM rollouts")
        row = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
        cur = con.execute("SELECT call_id, api, model, request, response FROM calls_full WHERE status = 'ok' ORDER BY seq")
        calls = [dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    row["meta"] = json.loads(row["meta"]) if isinstance(row["meta"], str) else row["meta"]
    return row, calls


def _assert_graded_from_trajectory(row: dict, calls: list[dict], api: str) -> None:
    assert row["status"] == "done" and (row["reward"], row["passed"]) == (1.0, True), (row["error"], row["meta"].get("verifier"))
    assert calls and all(c["api"] == api for c in calls)
    # what the grader read is what the store holds: the main conversation, with the marked tool call and its result
    messages = main_conversation(calls)
    assert row["meta"]["trajectory_messages"] == len(messages)
    tool_calls = [c for m in messages for c in m.get("tool_calls") or []]
    assert any(MARKER in c["function"]["arguments"] for c in tool_calls)
    assert any(m["role"] == "tool" for m in messages) and messages[-1]["role"] == "assistant"
    # and in harbor's ATIF, a Claude Code session and an OpenClaw session too: the marked call with its result
    assert _grader_said(row, "found") == "atif jsonl openclaw session"
    assert json.loads(_grader_said(row, "atif-calls")) == [c["id"] for c in tool_calls]


def test_builtin_harness_trajectory_is_graded(tmp_path, docker_client, base_image) -> None:
    row, calls = _run(tmp_path, base_image, "react", TOOL_SCRIPT)
    _assert_graded_from_trajectory(row, calls, "chat")


def test_a_text_only_answer_and_noop_score_zero(tmp_path, docker_client, base_image) -> None:
    """Controls: the marker in plain text is no tool call; no model calls at all is an empty trajectory."""
    row, _ = _run(tmp_path, base_image, "react", TEXT_ONLY)
    assert (row["status"], row["reward"], row["passed"]) == ("done", 0.0, False), row["error"]
    assert row["meta"]["trajectory_messages"] >= 2
    assert (_grader_said(row, "present"), _grader_said(row, "found")) == ("atif openclaw session", "")
    row, calls = _run(tmp_path, base_image, "noop", None)
    assert (row["reward"], row["passed"], calls) == (0.0, False, []) and row["meta"]["trajectory_messages"] == 0
    assert _grader_said(row, "present") == ""  # nothing recorded: no ATIF document (it needs a step) and no sessions


@pytest.mark.slow
def test_codex_trajectory_is_graded(tmp_path, docker_client, base_image) -> None:
    row, calls = _run(tmp_path, base_image, "codex", TOOL_SCRIPT)
    _assert_graded_from_trajectory(row, calls, "responses")


@pytest.mark.slow
def test_claude_code_trajectory_is_graded(tmp_path, docker_client, base_image) -> None:
    row, calls = _run(tmp_path, base_image, "claude-code", TOOL_SCRIPT)
    _assert_graded_from_trajectory(row, calls, "messages")


def test_envs_whose_graders_read_no_transcript_get_none_written(tmp_path, docker_client, base_image) -> None:
    """The copy costs a query and a sandbox write per rollout: only suites that grade transcripts (harbor) pay it."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "done"}]}))
    config = load_config(None, [
        "env.name=toy", 'env.tasks=["hello"]', 'harness.name="react"', f'policy.backend="scripted:{script}"',
        "runtime.kind=docker", "run.max_retries=0",
    ])  # fmt: skip
    from core.run import execute_run

    summary = asyncio.run(execute_run(config))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        (meta,) = con.execute("SELECT meta FROM rollouts").fetchone()
        (n_calls,) = con.execute("SELECT count(*) FROM calls WHERE status = 'ok'").fetchone()
    finally:
        con.close()
    meta = json.loads(meta) if isinstance(meta, str) else meta
    assert n_calls >= 2 and meta["trajectory_messages"] == 0
