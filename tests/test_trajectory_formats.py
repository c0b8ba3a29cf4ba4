"""The recorded conversation in outside graders' formats: harbor's ATIF, a Claude Code session, an OpenClaw session.

The ATIF checks restate harbor's pydantic models (harbor 0.25.0,
src/harbor/models/trajectories/*.py): the keys each object allows (every model forbids others), the
required ones, the schema versions, sequential step ids, agent-only step fields, and observation
results naming only their own step's tool calls. The OpenClaw checks restate pi-coding-agent's
session types (session-manager.ts: SessionHeader, SessionMessageEntry) and pi-ai's messages
(types.ts: UserMessage, AssistantMessage, ToolResultMessage, TextContent, ThinkingContent, ToolCall),
the JSONL OpenClaw wrote its sessions in before SQLite.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime
from typing import Any

import pytest

from core.rollout.trajectory_formats import (
    ATIF_PATH,
    ATIF_VERSION,
    NO_OUTPUT,
    OPENCLAW_MISSING_RESULT,
    TRAJECTORY_PATH,
    TrajectoryMeta,
    claude_session_events,
    claude_session_path,
    openclaw_index,
    openclaw_index_path,
    openclaw_session_entries,
    openclaw_session_path,
    to_atif,
    tool_arguments,
    trajectory_files,
)

# object → (allowed keys, required keys), as harbor's models declare them
ATIF_SCHEMA: dict[str, tuple[set[str], set[str]]] = {
    "trajectory": (
        {"schema_version", "session_id", "trajectory_id", "agent", "steps", "notes", "final_metrics",
         "continued_trajectory_ref", "extra", "subagent_trajectories"},
        {"schema_version", "agent", "steps"},
    ),
    "agent": ({"name", "version", "model_name", "tool_definitions", "extra"}, {"name", "version"}),
    "step": (
        {"step_id", "timestamp", "source", "model_name", "reasoning_effort", "message", "reasoning_content",
         "tool_calls", "observation", "metrics", "is_copied_context", "llm_call_count", "extra"},
        {"step_id", "source", "message"},
    ),
    "tool_call": ({"tool_call_id", "function_name", "arguments", "extra"}, {"tool_call_id", "function_name", "arguments"}),
    "observation": ({"results"}, {"results"}),
    "result": ({"source_call_id", "content", "subagent_trajectory_ref", "extra"}, set()),
    "final_metrics": (
        {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_cost_usd", "total_steps", "extra"},
        set(),
    ),
}  # fmt: skip
ATIF_VERSIONS = {f"ATIF-v1.{i}" for i in range(9)}
AGENT_ONLY = {"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"}
# fields each version added after v1.4 (the version our documents claim must not need them)
AFTER_V14 = {"trajectory_id", "continued_trajectory_ref", "subagent_trajectories", "tool_definitions",
             "is_copied_context", "llm_call_count"}  # fmt: skip


def _schema_problems(schema: dict[str, tuple[set[str], set[str]]], kind: str, obj: Any, where: str) -> list[str]:
    """Schema problems of one object: not an object, unknown keys, missing required keys."""
    if not isinstance(obj, dict):
        return [f"{where}: not an object"]
    allowed, required = schema[kind]
    problems = [f"{where}: unknown key {k!r}" for k in sorted(set(obj) - allowed)]
    return problems + [f"{where}: missing {k!r}" for k in sorted(required - set(obj))]


def _check(kind: str, obj: Any, where: str) -> list[str]:
    """ATIF schema problems of one object."""
    return _schema_problems(ATIF_SCHEMA, kind, obj, where)


def _step_problems(step: dict[str, Any], i: int) -> list[str]:
    """Schema problems of one step and what it holds."""
    where = f"steps[{i}]"
    problems = _check("step", step, where)
    if step.get("step_id") != i + 1:
        problems.append(f"{where}.step_id: expected {i + 1}")
    if step.get("source") not in ("system", "user", "agent"):
        problems.append(f"{where}.source: {step.get('source')!r}")
    if step.get("source") != "agent":
        problems += [f"{where}.{k}: only for agent steps" for k in AGENT_ONLY & set(step)]
    if not isinstance(step.get("message"), str):
        problems.append(f"{where}.message: not a string")
    calls = step.get("tool_calls") or []
    for j, call in enumerate(calls):
        problems += _check("tool_call", call, f"{where}.tool_calls[{j}]")
        if not isinstance(call.get("arguments"), dict):
            problems.append(f"{where}.tool_calls[{j}].arguments: not an object")
    ids = {c.get("tool_call_id") for c in calls}
    if "observation" in step:
        problems += _check("observation", step["observation"], f"{where}.observation")
        for j, result in enumerate(step["observation"].get("results", [])):
            problems += _check("result", result, f"{where}.observation.results[{j}]")
            if result.get("source_call_id") is not None and result["source_call_id"] not in ids:
                problems.append(f"{where}.observation.results[{j}]: names a call of another step")
    return problems


def atif_problems(doc: dict[str, Any]) -> list[str]:
    """Every way `doc` breaks harbor's ATIF models; [] for a valid trajectory."""
    problems = _check("trajectory", doc, "trajectory") + _check("agent", doc.get("agent"), "agent")
    if doc.get("schema_version") not in ATIF_VERSIONS:
        problems.append(f"schema_version: {doc.get('schema_version')!r}")
    if "final_metrics" in doc:
        problems += _check("final_metrics", doc["final_metrics"], "final_metrics")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        return [*problems, "steps: needs at least one"]
    for i, step in enumerate(steps):
        problems += _step_problems(step, i)
    return problems


SHELL_ARGS = {"command": "echo hi > note.txt"}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a shell agent."},
    {"role": "user", "content": [{"type": "text", "text": "Write note.txt, then patch it."}]},
    {"role": "assistant", "content": "Two steps.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "shell", "arguments": json.dumps(SHELL_ARGS)}},
        {"id": "call_b", "type": "function", "function": {"name": "apply_patch", "arguments": "*** Begin Patch"}},
    ]},
    {"role": "tool", "tool_call_id": "call_a", "content": ""},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "patched 1 file"}]},
    {"role": "assistant", "content": "Wrote and patched note.txt."},
]  # fmt: skip
META = TrajectoryMeta(
    rollout_id="r-42", attempt=1, agent_name="react", agent_version="7", model_name="policy", cwd="/app",
    written_at="2025-10-16T14:30:00.000Z",
)  # fmt: skip


def test_atif_document_follows_harbors_schema() -> None:
    doc = to_atif(CONVERSATION, META)
    assert doc is not None and atif_problems(doc) == []
    assert doc["schema_version"] == ATIF_VERSION == "ATIF-v1.4"
    assert not AFTER_V14 & (set(doc) | set(doc["agent"]) | {k for s in doc["steps"] for k in s})
    assert (doc["session_id"], doc["agent"]) == (
        "r-42",
        {"name": "react", "version": "7", "model_name": "policy"},
    )
    assert [s["source"] for s in doc["steps"]] == ["system", "user", "agent", "agent"]
    assert [s["message"] for s in doc["steps"]] == [
        "You are a shell agent.", "Write note.txt, then patch it.", "Two steps.", "Wrote and patched note.txt.",
    ]  # fmt: skip
    assert doc["final_metrics"] == {"total_steps": 4}


def test_atif_round_trips_tool_call_ids_arguments_and_observations() -> None:
    step = to_atif(CONVERSATION, META)["steps"][2]
    assert step["tool_calls"] == [
        {"tool_call_id": "call_a", "function_name": "shell", "arguments": SHELL_ARGS},
        {"tool_call_id": "call_b", "function_name": "apply_patch", "arguments": {"input": "*** Begin Patch"}},
    ]
    assert step["observation"] == {"results": [
        {"source_call_id": "call_a", "content": ""}, {"source_call_id": "call_b", "content": "patched 1 file"},
    ]}  # fmt: skip
    # back to OpenAI chat: the same calls, the same results in the same order
    calls = [
        {"id": c["tool_call_id"], "name": c["function_name"], "args": c["arguments"]}
        for c in step["tool_calls"]
    ]
    original = CONVERSATION[2]["tool_calls"]
    assert [c["id"] for c in calls] == [c["id"] for c in original]
    assert calls[0]["args"] == json.loads(original[0]["function"]["arguments"])
    results = [(r["source_call_id"], r["content"]) for r in step["observation"]["results"]]
    assert results == [("call_a", ""), ("call_b", "patched 1 file")]


def test_a_result_of_an_unknown_call_gets_its_own_step() -> None:
    """ATIF lets a result name only its own step's calls: a stray one stays valid, its id kept in extra."""
    doc = to_atif([*CONVERSATION[:2], {"role": "tool", "tool_call_id": "ghost", "content": "late"}], META)
    assert atif_problems(doc) == []
    assert doc["steps"][-1] == {
        "step_id": 3, "source": "system", "message": "", "extra": {"tool_call_id": "ghost"},
        "observation": {"results": [{"content": "late"}]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("not json", {"input": "not json"}),
        ("[1, 2]", {"value": [1, 2]}),
        ("", {}),
        (None, {}),
    ],
)
def test_tool_arguments_are_always_an_object(raw: Any, expected: dict[str, Any]) -> None:
    assert tool_arguments(raw) == expected


def test_claude_code_session_events() -> None:
    events = claude_session_events(CONVERSATION, META)
    # the system prompt is not in a Claude Code session
    assert [e["type"] for e in events] == [e["message"]["role"] for e in events] == ["user", "assistant"] * 2
    assert [e["parentUuid"] for e in events] == [None, *(e["uuid"] for e in events[:-1])]
    assert {e["sessionId"] for e in events} == {META.session_uuid} and uuid.UUID(META.session_uuid)
    assert all(e["cwd"] == "/app" and e["timestamp"] == META.written_at for e in events)
    assert events[0]["message"]["content"] == "Write note.txt, then patch it."
    assert events[1]["message"]["content"] == [
        {"type": "text", "text": "Two steps."},
        {"type": "tool_use", "id": "call_a", "name": "shell", "input": SHELL_ARGS},
        {"type": "tool_use", "id": "call_b", "name": "apply_patch", "input": {"input": "*** Begin Patch"}},
    ]
    assert events[2]["message"]["content"] == [
        {"tool_use_id": "call_a", "type": "tool_result", "content": ""},
        {"tool_use_id": "call_b", "type": "tool_result", "content": "patched 1 file"},
    ]
    assert events[3]["message"]["model"] == "policy"


def test_an_unanswered_call_gets_a_placeholder_result() -> None:
    events = claude_session_events(CONVERSATION[:3], META)
    assert [b["content"] for b in events[-1]["message"]["content"]] == [NO_OUTPUT, NO_OUTPUT]


def test_trajectory_files_paths_and_contents() -> None:
    files = trajectory_files(CONVERSATION, META)
    session = f"/logs/agent/sessions/projects/-app/{META.session_uuid}.jsonl"
    openclaw = f"/logs/agent/openclaw/agents/main/sessions/{META.session_uuid}.jsonl"
    index = "/logs/agent/openclaw/agents/main/sessions/sessions.json"
    assert set(files) == {TRAJECTORY_PATH, ATIF_PATH, session, openclaw, index}
    assert (claude_session_path(META), openclaw_session_path(META), openclaw_index_path()) == (session, openclaw, index)
    assert [json.loads(line) for line in files[TRAJECTORY_PATH].splitlines()] == CONVERSATION
    assert json.loads(files[ATIF_PATH]) == to_atif(CONVERSATION, META)
    assert [json.loads(line) for line in files[session].splitlines()] == claude_session_events(
        CONVERSATION, META
    )
    assert [json.loads(line) for line in files[openclaw].splitlines()] == openclaw_session_entries(CONVERSATION, META)
    assert json.loads(files[index]) == openclaw_index(META)
    # the same attempt names the same session; another attempt another
    assert trajectory_files(CONVERSATION, META) == files
    assert TrajectoryMeta("r-42", attempt=2).session_uuid != META.session_uuid


def test_no_messages_writes_only_the_empty_jsonl() -> None:
    """An ATIF trajectory needs one step at least: with nothing recorded there is no document to write."""
    assert to_atif([], META) is None
    assert trajectory_files([], META) == {TRAJECTORY_PATH: b""}


# ----------------------------------------------------------------------------- OpenClaw session
# object → (allowed keys, required keys), as pi's session and message types declare them
OPENCLAW_SCHEMA: dict[str, tuple[set[str], set[str]]] = {
    "header": ({"type", "version", "id", "timestamp", "cwd", "parentSession"}, {"type", "version", "id", "timestamp", "cwd"}),
    "entry": ({"type", "id", "parentId", "timestamp", "message"}, {"type", "id", "parentId", "timestamp", "message"}),
    "user": ({"role", "content", "timestamp"}, {"role", "content", "timestamp"}),
    "assistant": (
        {"role", "content", "api", "provider", "model", "usage", "stopReason", "errorMessage", "timestamp"},
        {"role", "content", "api", "provider", "model", "usage", "stopReason", "timestamp"},
    ),
    "toolResult": (
        {"role", "toolCallId", "toolName", "content", "details", "isError", "timestamp"},
        {"role", "toolCallId", "toolName", "content", "isError", "timestamp"},
    ),
    "text": ({"type", "text", "textSignature"}, {"type", "text"}),
    "thinking": ({"type", "thinking", "thinkingSignature"}, {"type", "thinking"}),
    "toolCall": ({"type", "id", "name", "arguments", "thoughtSignature"}, {"type", "id", "name", "arguments"}),
    "usage": ({"input", "output", "cacheRead", "cacheWrite", "totalTokens", "cost"}, {"input", "output", "cacheRead", "cacheWrite", "totalTokens", "cost"}),
}  # fmt: skip
BLOCKS_OF = {"user": {"text"}, "assistant": {"text", "thinking", "toolCall"}, "toolResult": {"text"}}
STOP_REASONS = {"stop", "length", "toolUse", "error", "aborted"}
SAFE_SESSION_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$", re.IGNORECASE)  # OpenClaw's SAFE_SESSION_ID_RE


def _oc_check(kind: str, obj: Any, where: str) -> list[str]:
    """OpenClaw (pi session) schema problems of one object."""
    return _schema_problems(OPENCLAW_SCHEMA, kind, obj, where)


def _oc_message_problems(message: Any, where: str) -> list[str]:
    """Schema problems of one pi-ai message and its content blocks."""
    role = message.get("role") if isinstance(message, dict) else None
    if role not in BLOCKS_OF:
        return [f"{where}.role: {role!r}"]
    problems = _oc_check(role, message, where)
    if not isinstance(message.get("timestamp"), int):
        problems.append(f"{where}.timestamp: not Unix milliseconds")
    for j, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        if kind not in BLOCKS_OF[role]:
            problems.append(f"{where}.content[{j}]: a {kind!r} block in a {role} message")
            continue
        problems += _oc_check(kind, block, f"{where}.content[{j}]")
        if kind == "toolCall" and not isinstance(block.get("arguments"), dict):
            problems.append(f"{where}.content[{j}].arguments: not an object")
    if role == "assistant":
        problems += _oc_check("usage", message.get("usage"), f"{where}.usage")
        if message.get("stopReason") not in STOP_REASONS:
            problems.append(f"{where}.stopReason: {message.get('stopReason')!r}")
    if role == "toolResult" and not isinstance(message.get("isError"), bool):
        problems.append(f"{where}.isError: not a boolean")
    return problems


def openclaw_problems(lines: list[dict[str, Any]]) -> list[str]:
    """Every way a session file breaks pi's session format (header first, then parentId-chained message entries)."""
    if not lines:
        return ["no header"]
    header, entries = lines[0], lines[1:]
    problems = _oc_check("header", header, "header")
    if (header.get("type"), header.get("version")) != ("session", 3):
        problems.append(f"header: type/version {header.get('type')!r}/{header.get('version')!r}")
    if not SAFE_SESSION_ID.match(str(header.get("id"))):
        problems.append("header.id: not a safe session id")
    parent = None
    for i, entry in enumerate(entries):
        where = f"entries[{i}]"
        problems += _oc_check("entry", entry, where)
        if entry.get("type") != "message":
            problems.append(f"{where}.type: {entry.get('type')!r}")
        if entry.get("parentId") != parent:
            problems.append(f"{where}.parentId: expected {parent!r}")
        parent = entry.get("id")
        datetime.fromisoformat(str(entry.get("timestamp")).replace("Z", "+00:00"))
        problems += _oc_message_problems(entry.get("message"), f"{where}.message")
    ids = [e.get("id") for e in entries]
    if len(set(ids)) != len(ids) or not all(isinstance(i, str) and re.fullmatch(r"[0-9a-f]{8}", i) for i in ids):
        problems.append("entry ids: not unique 8-hex-digit ids")
    return problems


def _back_to_chat(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An OpenClaw session read back as OpenAI chat messages (what a grader reconstructs)."""
    chat: list[dict[str, Any]] = []
    for entry in lines[1:]:
        m = entry["message"]
        text = "\n".join(b["text"] for b in m["content"] if b["type"] == "text")
        if m["role"] == "toolResult":
            chat.append({"role": "tool", "tool_call_id": m["toolCallId"], "content": text})
            continue
        out: dict[str, Any] = {"role": m["role"], "content": text}
        calls = [b for b in m["content"] if b["type"] == "toolCall"]
        if calls:
            out["tool_calls"] = [{"id": b["id"], "name": b["name"], "arguments": b["arguments"]} for b in calls]
        chat.append(out)
    return chat


def test_openclaw_session_follows_pis_session_format() -> None:
    lines = openclaw_session_entries(CONVERSATION, META)
    assert openclaw_problems(lines) == []
    assert lines[0] == {
        "type": "session", "version": 3, "id": META.session_uuid, "timestamp": META.written_at, "cwd": "/app",
    }  # fmt: skip
    # the system prompt is not in a pi session; every result follows its call's turn
    assert [e["message"]["role"] for e in lines[1:]] == ["user", "assistant", "toolResult", "toolResult", "assistant"]
    first, last = lines[2]["message"], lines[-1]["message"]
    assert (first["stopReason"], last["stopReason"], first["model"]) == ("toolUse", "stop", "policy")
    stamps = [e["message"]["timestamp"] for e in lines[1:]]
    assert stamps == sorted(set(stamps)) and stamps[0] == int(datetime.fromisoformat("2025-10-16T14:30:00+00:00").timestamp() * 1000)


def test_openclaw_round_trips_tool_calls_and_results() -> None:
    lines = openclaw_session_entries(CONVERSATION, META)
    assert lines[2]["message"]["content"] == [
        {"type": "text", "text": "Two steps."},
        {"type": "toolCall", "id": "call_a", "name": "shell", "arguments": SHELL_ARGS},
        {"type": "toolCall", "id": "call_b", "name": "apply_patch", "arguments": {"input": "*** Begin Patch"}},
    ]
    assert [(m["toolCallId"], m["toolName"], m["content"], m["isError"]) for m in (e["message"] for e in lines[3:5])] == [
        ("call_a", "shell", [{"type": "text", "text": ""}], False),
        ("call_b", "apply_patch", [{"type": "text", "text": "patched 1 file"}], False),
    ]
    # back to OpenAI chat: the same messages less the system prompt, the same calls, ids, arguments and results
    chat = _back_to_chat(lines)
    original = CONVERSATION[1:]
    assert [m["role"] for m in chat] == [m["role"] for m in original]
    assert chat[0]["content"] == "Write note.txt, then patch it." and chat[-1]["content"] == original[-1]["content"]
    assert [(c["id"], c["name"]) for c in chat[1]["tool_calls"]] == [
        (c["id"], c["function"]["name"]) for c in original[1]["tool_calls"]
    ]
    assert chat[1]["tool_calls"][0]["arguments"] == json.loads(original[1]["tool_calls"][0]["function"]["arguments"])
    assert [(m["tool_call_id"], m["content"]) for m in chat[2:4]] == [("call_a", ""), ("call_b", "patched 1 file")]


def test_openclaw_repairs_pairing_as_openclaw_does() -> None:
    """A call without a result gets OpenClaw's synthetic error result; a result of no call of the turn is dropped."""
    messages = [
        *CONVERSATION[:3],
        {"role": "tool", "tool_call_id": "call_b", "content": "patched"},
        {"role": "tool", "tool_call_id": "ghost", "content": "stray"},
        {"role": "user", "content": "and?"},
        {"role": "tool", "tool_call_id": "call_a", "content": "late"},
    ]
    lines = openclaw_session_entries(messages, META)
    assert openclaw_problems(lines) == []
    results = [e["message"] for e in lines if e.get("message", {}).get("role") == "toolResult"]
    assert [(r["toolCallId"], r["isError"], r["content"][0]["text"]) for r in results] == [
        ("call_a", True, OPENCLAW_MISSING_RESULT), ("call_b", False, "patched"),
    ]  # fmt: skip
    assert [e["message"]["role"] for e in lines[1:]] == ["user", "assistant", "toolResult", "toolResult", "user"]


def test_openclaw_reasoning_is_a_thinking_block() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "reasoning_content": "greet"}]
    lines = openclaw_session_entries(messages, META)
    assert openclaw_problems(lines) == []
    assert lines[-1]["message"]["content"] == [{"type": "thinking", "thinking": "greet"}, {"type": "text", "text": "hello"}]


def test_openclaw_index_names_the_session_file() -> None:
    """sessions.json, keyed by the main session key, points at the transcript (how OpenClaw tooling finds it)."""
    entry = openclaw_index(META)["agent:main:main"]
    assert entry == {
        "sessionId": META.session_uuid, "updatedAt": 1760625000000, "sessionFile": openclaw_session_path(META),
    }  # fmt: skip
    assert openclaw_session_path(META).rsplit("/", 1)[1] == f"{entry['sessionId']}.jsonl"
