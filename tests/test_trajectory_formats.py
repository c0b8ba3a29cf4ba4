"""The recorded conversation in outside graders' formats: harbor's ATIF and a Claude Code session.

The ATIF checks restate harbor's pydantic models (harbor 0.25.0,
src/harbor/models/trajectories/*.py): the keys each object allows (every model forbids others), the
required ones, the schema versions, sequential step ids, agent-only step fields, and observation
results naming only their own step's tool calls.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from core.rollout.trajectory_formats import (
    ATIF_PATH,
    ATIF_VERSION,
    NO_OUTPUT,
    TRAJECTORY_PATH,
    TrajectoryMeta,
    claude_session_events,
    claude_session_path,
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


def _check(kind: str, obj: Any, where: str) -> list[str]:
    """Schema problems of one object: not an object, unknown keys, missing required keys."""
    if not isinstance(obj, dict):
        return [f"{where}: not an object"]
    allowed, required = ATIF_SCHEMA[kind]
    problems = [f"{where}: unknown key {k!r}" for k in sorted(set(obj) - allowed)]
    return problems + [f"{where}: missing {k!r}" for k in sorted(required - set(obj))]


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
    assert set(files) == {TRAJECTORY_PATH, ATIF_PATH, session} and claude_session_path(META) == session
    assert [json.loads(line) for line in files[TRAJECTORY_PATH].splitlines()] == CONVERSATION
    assert json.loads(files[ATIF_PATH]) == to_atif(CONVERSATION, META)
    assert [json.loads(line) for line in files[session].splitlines()] == claude_session_events(
        CONVERSATION, META
    )
    # the same attempt names the same session; another attempt another
    assert trajectory_files(CONVERSATION, META) == files
    assert TrajectoryMeta("r-42", attempt=2).session_uuid != META.session_uuid


def test_no_messages_writes_only_the_empty_jsonl() -> None:
    """An ATIF trajectory needs one step at least: with nothing recorded there is no document to write."""
    assert to_atif([], META) is None
    assert trajectory_files([], META) == {TRAJECTORY_PATH: b""}
