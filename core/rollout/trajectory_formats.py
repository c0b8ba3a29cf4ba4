"""The recorded main conversation (OpenAI chat messages) in the formats outside graders read.

Each converter is a pure function of the messages and a `TrajectoryMeta`; `trajectory_files` gives
every file to put in the sandbox before the verifier runs, path → bytes:

* ``/logs/agent/trajectory.jsonl`` — the messages themselves, one per line.
* ``/logs/agent/trajectory.json`` — Harbor's ATIF (Agent Trajectory Interchange Format), what harbor
  agents write to ``/logs/agent`` and harbor tooling reads. Schema: harbor's pydantic models,
  ``src/harbor/models/trajectories/{trajectory,step,agent,tool_call,observation,observation_result}.py``
  (harbor 0.25.0 on PyPI; the spec is harbor's ``docs/rfcs/0001-trajectory-format.md``). Only fields
  ATIF-v1.4 has are used, so the document is valid under v1.4 and every later version's models.
* ``/logs/agent/sessions/projects/<cwd-slug>/<session-uuid>.jsonl`` — a Claude Code project session:
  harbor's ``claude-code`` agent runs Claude Code with ``CLAUDE_CONFIG_DIR=/logs/agent/sessions``, so
  that is where a harbor grader finds its transcript; the events are the ``user``/``assistant`` chain
  harbor's ``ClaudeCode.atif_to_native_trajectory`` (``src/harbor/agents/installed/claude_code.py``)
  writes, threaded by ``uuid``/``parentUuid``. System messages are left out, as there.
* ``/logs/agent/openclaw/agents/main/sessions/<session-uuid>.jsonl`` (and ``sessions.json`` beside it)
  — an OpenClaw session transcript as OpenClaw wrote it before it moved sessions into SQLite
  (2026.9.5), which is what older OpenClaw graders read. ``/logs/agent/openclaw`` is laid out as an
  OpenClaw state dir (``OPENCLAW_STATE_DIR``, default ``~/.openclaw``): ``agents/<agentId>/sessions/``
  with the default agent ``main``, the index keyed by the main session key ``agent:main:main``. It
  lies under ``/logs/agent`` (what harbor keeps of a trial, where the other transcripts are) rather
  than in the sandbox user's own ``~/.openclaw``, which an OpenClaw harness may be using itself.
  The format is pi-coding-agent's ``SessionManager`` JSONL, which OpenClaw writes through: see
  ``CURRENT_SESSION_VERSION``, ``SessionHeader``, ``SessionMessageEntry`` and ``appendMessage`` in
  badlogic/pi-mono ``packages/coding-agent/src/core/session-manager.ts``, the message types
  (``UserMessage``, ``AssistantMessage``, ``ToolResultMessage``, ``ToolCall``) in
  ``packages/ai/src/types.ts``, and in openclaw/openclaw (a JSONL version, commit ce4ebb01)
  ``src/config/sessions/transcript.ts`` (``ensureSessionHeader``, ``mirrorCliTurnToTranscript``),
  ``src/config/sessions/paths.ts`` (``resolveSessionTranscriptPath``) and
  ``src/agents/session-transcript-repair.ts`` (each call's result right after its turn; a missing
  one gets ``makeMissingToolResult``'s synthetic error result; strays are dropped).

The proxy records every harness's calls, so these files are written whatever harness ran. A
conversation with no messages gets only the (empty) JSONL: an ATIF document needs one step at least.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

AGENT_DIR = "/logs/agent"
TRAJECTORY_PATH = f"{AGENT_DIR}/trajectory.jsonl"  # OpenAI chat messages, one per line
ATIF_PATH = f"{AGENT_DIR}/trajectory.json"  # harbor's ATIF document
# harbor runs Claude Code with CLAUDE_CONFIG_DIR=/logs/agent/sessions
CLAUDE_SESSIONS_DIR = f"{AGENT_DIR}/sessions/projects"
# OpenClaw's state dir under /logs/agent, laid out as ~/.openclaw is (agents/<agentId>/sessions/)
OPENCLAW_STATE_DIR = f"{AGENT_DIR}/openclaw"
OPENCLAW_AGENT_ID = "main"  # OpenClaw's DEFAULT_AGENT_ID
OPENCLAW_SESSION_KEY = f"agent:{OPENCLAW_AGENT_ID}:main"  # the agent's main session (sessions.json's key)
OPENCLAW_SESSIONS_DIR = f"{OPENCLAW_STATE_DIR}/agents/{OPENCLAW_AGENT_ID}/sessions"
OPENCLAW_SESSION_VERSION = 3  # pi-coding-agent's CURRENT_SESSION_VERSION
OPENCLAW_PROVIDER = "forgetui"  # the model provider assistant messages name (the proxy served them)
OPENCLAW_API = "openai-completions"  # the pi-ai API the recorded messages are in (OpenAI chat)
# OpenClaw's makeMissingToolResult text, for a call the conversation never answered
OPENCLAW_MISSING_RESULT = (
    "[openclaw] missing tool result in session history; inserted synthetic error result for transcript repair."
)
# the oldest version with every field used here (harbor's models accept v1.0 … v1.8)
ATIF_VERSION = "ATIF-v1.4"
NO_OUTPUT = "[no output recorded]"  # a tool call without a result (harbor's placeholder)
IMAGE_OMITTED = "[image omitted]"
# session (and event) uuids are uuid5(this, "rollout:attempt"): the same attempt writes the same names
_SESSION_NS = uuid.UUID("6f1c2b0e-3d4a-5b8c-9e7f-a1b2c3d4e5f6")


@dataclass(frozen=True)
class TrajectoryMeta:
    """What the recorded messages do not say: who ran, with which model, where and when."""

    rollout_id: str
    attempt: int = 0
    agent_name: str = "forgetui"
    agent_version: str = "0"
    model_name: str | None = None
    cwd: str = "/app"
    written_at: str = ""  # ISO 8601; "" means now

    @property
    def session_uuid(self) -> str:
        """A stable UUID for the attempt (Claude Code names its session files by one)."""
        return str(uuid.uuid5(_SESSION_NS, f"{self.rollout_id}:{self.attempt}"))

    @property
    def timestamp(self) -> str:
        """`written_at`, or else the current time."""
        return self.written_at or now_iso()


def now_iso() -> str:
    """The current UTC time as ISO 8601 with milliseconds (``2025-10-16T14:30:00.000Z``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_text(content: Any) -> str:
    """A message's content as plain text (text parts joined by newlines, images named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and "image" in str(part.get("type", "")):
                parts.append(IMAGE_OMITTED)
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def tool_arguments(raw: Any) -> dict[str, Any]:
    """Arguments as an object, as harbor's converters make them: other text is ``{"input": …}``, a non-object ``{"value": …}``."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return {"input": raw}
        return parsed if isinstance(parsed, dict) else {"value": parsed}
    return {"value": raw}


def _call_fields(call: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(id, name, arguments object) of an OpenAI tool call."""
    fn = call.get("function") or {}
    return str(call.get("id") or ""), str(fn.get("name") or ""), tool_arguments(fn.get("arguments"))


# ----------------------------------------------------------------------------- OpenAI chat JSONL
def chat_jsonl(messages: list[dict[str, Any]]) -> bytes:
    """The messages, one JSON object per line."""
    return b"".join(orjson.dumps(m) + b"\n" for m in messages)


# ----------------------------------------------------------------------------- harbor ATIF
def _atif_step(message: dict[str, Any]) -> dict[str, Any]:
    """The ATIF step of one non-tool message (no step_id yet)."""
    role = message.get("role")
    text = message_text(message.get("content"))
    if role in ("system", "developer"):
        return {"source": "system", "message": text}
    if role != "assistant":
        return {"source": "user", "message": text}
    step: dict[str, Any] = {"source": "agent", "message": text}
    if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
        step["reasoning_content"] = message["reasoning_content"]
    calls = [_call_fields(c) for c in message.get("tool_calls") or []]
    if calls:
        step["tool_calls"] = [{"tool_call_id": i, "function_name": n, "arguments": a} for i, n, a in calls]
    return step


def atif_steps(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ATIF step per non-tool message; a tool result goes in its calling step's observation (else a system step)."""
    steps: list[dict[str, Any]] = []
    owner: dict[str, dict[str, Any]] = {}  # tool_call_id → the agent step that made the call
    for message in messages:
        if message.get("role") != "tool":
            step = {"step_id": len(steps) + 1, **_atif_step(message)}
            steps.append(step)
            owner.update((call["tool_call_id"], step) for call in step.get("tool_calls", []))
            continue
        call_id = message.get("tool_call_id")
        result = {"source_call_id": call_id, "content": message_text(message.get("content"))}
        step = owner.get(call_id) if isinstance(call_id, str) else None
        if step is None:  # ATIF lets a result name only its own step's calls
            del result["source_call_id"]
            step = {
                "step_id": len(steps) + 1,
                "source": "system",
                "message": "",
                "extra": {"tool_call_id": call_id},
            }
            steps.append(step)
        step.setdefault("observation", {"results": []})["results"].append(result)
    return steps


def to_atif(messages: list[dict[str, Any]], meta: TrajectoryMeta) -> dict[str, Any] | None:
    """The conversation as an ATIF trajectory document; None without messages (ATIF needs a step)."""
    steps = atif_steps(messages)
    if not steps:
        return None
    agent: dict[str, Any] = {"name": meta.agent_name, "version": meta.agent_version}
    if meta.model_name:
        agent["model_name"] = meta.model_name
    return {
        "schema_version": ATIF_VERSION,
        "session_id": meta.rollout_id,
        "agent": agent,
        "steps": steps,
        "notes": "Converted by forgetui from its proxy's record of the model calls (the attempt's main branch); "
        "steps carry no timestamps or token metrics.",
        "final_metrics": {"total_steps": len(steps)},
        "extra": {"rollout_id": meta.rollout_id, "attempt": meta.attempt, "written_at": meta.timestamp},
    }


# ----------------------------------------------------------------------------- Claude Code session
def claude_project_slug(cwd: str) -> str:
    """Claude Code's project folder name for a working directory (``/app`` → ``-app``)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", cwd)


def claude_session_path(meta: TrajectoryMeta) -> str:
    """Where the session file goes: ``/logs/agent/sessions/projects/<cwd-slug>/<session-uuid>.jsonl``."""
    return f"{CLAUDE_SESSIONS_DIR}/{claude_project_slug(meta.cwd)}/{meta.session_uuid}.jsonl"


class _Chain:
    """Claude Code session events, each linked to the one before by parentUuid."""

    def __init__(self, meta: TrajectoryMeta) -> None:
        self.meta = meta
        self.events: list[dict[str, Any]] = []
        self.parent: str | None = None
        self.timestamp = meta.timestamp

    def add(self, kind: str, message: dict[str, Any]) -> None:
        """Append one ``user`` or ``assistant`` event carrying `message`."""
        event_uuid = str(uuid.uuid5(_SESSION_NS, f"{self.meta.session_uuid}:{len(self.events)}"))
        self.events.append({
            "parentUuid": self.parent, "isSidechain": False, "type": kind, "uuid": event_uuid,
            "timestamp": self.timestamp, "sessionId": self.meta.session_uuid, "userType": "external",
            "cwd": self.meta.cwd, "gitBranch": "", "version": self.meta.agent_version, "message": message,
        })  # fmt: skip
        self.parent = event_uuid


def _assistant_message(message: dict[str, Any], meta: TrajectoryMeta, n: int) -> dict[str, Any] | None:
    """An Anthropic assistant message (text and tool_use blocks); None when it says nothing."""
    content: list[dict[str, Any]] = []
    text = message_text(message.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    for call_id, name, arguments in (_call_fields(c) for c in message.get("tool_calls") or []):
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
    if not content:
        return None
    return {
        "model": meta.model_name, "id": f"msg_{uuid.uuid5(_SESSION_NS, f'{meta.session_uuid}:msg:{n}').hex}",
        "type": "message", "role": "assistant", "content": content, "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }  # fmt: skip


def _results_message(results: list[dict[str, Any]], open_calls: list[str]) -> dict[str, Any]:
    """A user message with one tool_result per call of the turn before (its result, else a placeholder; strays dropped)."""
    results = [r for r in results if r["tool_use_id"] in open_calls]
    answered = {r["tool_use_id"] for r in results}
    blocks = results + [
        {"tool_use_id": c, "type": "tool_result", "content": NO_OUTPUT}
        for c in open_calls
        if c not in answered
    ]
    return {"role": "user", "content": blocks}


def claude_session_events(messages: list[dict[str, Any]], meta: TrajectoryMeta) -> list[dict[str, Any]]:
    """Claude Code session events: user text, assistant turns, after a turn with tool calls one user event of results."""
    chain = _Chain(meta)
    open_calls: list[str] = []  # the last assistant turn's call ids, until their results are flushed
    results: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal open_calls, results
        if open_calls:
            chain.add("user", _results_message(results, open_calls))
        open_calls, results = [], []

    for n, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id, text = str(message.get("tool_call_id") or ""), message_text(message.get("content"))
            results.append({"tool_use_id": call_id, "type": "tool_result", "content": text})
            continue
        flush()
        if role in ("system", "developer"):
            continue  # Claude Code sessions carry no system prompt
        if role == "assistant":
            body = _assistant_message(message, meta, n)
            if body is not None:
                chain.add("assistant", body)
                open_calls = [b["id"] for b in body["content"] if b["type"] == "tool_use"]
            continue
        chain.add("user", {"role": "user", "content": message_text(message.get("content"))})
    flush()
    return chain.events


def to_claude_session(messages: list[dict[str, Any]], meta: TrajectoryMeta) -> bytes:
    """The Claude Code session file's content: one event per line."""
    return b"".join(orjson.dumps(e) + b"\n" for e in claude_session_events(messages, meta))


# ----------------------------------------------------------------------------- OpenClaw session
def openclaw_session_path(meta: TrajectoryMeta) -> str:
    """Where the transcript goes: ``/logs/agent/openclaw/agents/main/sessions/<session-uuid>.jsonl``."""
    return f"{OPENCLAW_SESSIONS_DIR}/{meta.session_uuid}.jsonl"


def openclaw_index_path() -> str:
    """The sessions index beside it (``sessions.json``: session key → entry)."""
    return f"{OPENCLAW_SESSIONS_DIR}/sessions.json"


def _epoch_ms(iso: str) -> int:
    """An ISO 8601 time (``Z`` or an offset) as Unix milliseconds."""
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def _iso_ms(ms: int) -> str:
    """Unix milliseconds as ISO 8601 with milliseconds, as JavaScript's ``toISOString`` writes it."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """pi-ai's content blocks of a user or tool result message: one text block."""
    return [{"type": "text", "text": message_text(content)}]


def _openclaw_assistant(message: dict[str, Any], meta: TrajectoryMeta, ms: int) -> dict[str, Any]:
    """A pi-ai AssistantMessage: thinking, text and toolCall blocks, zero usage, ``toolUse`` when it calls."""
    content: list[dict[str, Any]] = []
    if isinstance(message.get("reasoning_content"), str) and message["reasoning_content"]:
        content.append({"type": "thinking", "thinking": message["reasoning_content"]})
    text = message_text(message.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    calls = [_call_fields(c) for c in message.get("tool_calls") or []]
    content += [{"type": "toolCall", "id": i, "name": n, "arguments": a} for i, n, a in calls]
    zero = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
    return {
        "role": "assistant", "content": content, "api": OPENCLAW_API, "provider": OPENCLAW_PROVIDER,
        "model": meta.model_name or "", "usage": {**zero, "totalTokens": 0, "cost": {**zero, "total": 0}},
        "stopReason": "toolUse" if calls else "stop", "timestamp": ms,
    }  # fmt: skip


def _openclaw_result(call_id: str, name: str, content: Any, ms: int, *, missing: bool = False) -> dict[str, Any]:
    """A pi-ai ToolResultMessage (OpenClaw's synthetic error result when `missing`)."""
    blocks = [{"type": "text", "text": OPENCLAW_MISSING_RESULT}] if missing else _text_blocks(content)
    return {
        "role": "toolResult", "toolCallId": call_id, "toolName": name or "unknown", "content": blocks,
        "isError": missing, "timestamp": ms,
    }  # fmt: skip


def openclaw_messages(messages: list[dict[str, Any]], meta: TrajectoryMeta) -> list[dict[str, Any]]:
    """pi-ai messages in session order: each call's result right after its turn, in call order; no system prompt."""
    base = _epoch_ms(meta.timestamp)
    out: list[dict[str, Any]] = []
    turn: list[tuple[str, str]] = []  # the last assistant turn's (call id, name), until its results are placed
    results: dict[str, Any] = {}  # call id → the recorded result's content

    def place_results() -> None:
        nonlocal turn, results
        for call_id, name in turn:
            answered = call_id in results
            out.append(_openclaw_result(call_id, name, results.get(call_id), base + len(out), missing=not answered))
        turn, results = [], {}

    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            if any(call_id == c for c, _ in turn):  # a stray result (no call of this turn) is dropped, as there
                results.setdefault(call_id, message.get("content"))
            continue
        place_results()
        if role in ("system", "developer"):
            continue  # pi keeps the system prompt out of the session (it is the context's systemPrompt)
        if role == "assistant":
            out.append(_openclaw_assistant(message, meta, base + len(out)))
            turn = [(b["id"], b["name"]) for b in out[-1]["content"] if b["type"] == "toolCall"]
            continue
        out.append({"role": "user", "content": _text_blocks(message.get("content")), "timestamp": base + len(out)})
    place_results()
    return out


def _entry_id(meta: TrajectoryMeta, n: int, taken: set[str]) -> str:
    """A stable 8-hex-digit entry id, unique in the file (pi's generateId shape; the full uuid on a clash)."""
    full = uuid.uuid5(_SESSION_NS, f"{meta.session_uuid}:openclaw:{n}")
    return str(full) if full.hex[:8] in taken else full.hex[:8]


def openclaw_session_entries(messages: list[dict[str, Any]], meta: TrajectoryMeta) -> list[dict[str, Any]]:
    """The OpenClaw session file's lines: the ``session`` header, then one ``message`` entry per message, parentId-chained."""
    header = {
        "type": "session", "version": OPENCLAW_SESSION_VERSION, "id": meta.session_uuid,
        "timestamp": _iso_ms(_epoch_ms(meta.timestamp)), "cwd": meta.cwd,
    }  # fmt: skip
    entries: list[dict[str, Any]] = [header]
    taken: set[str] = set()
    parent: str | None = None
    for n, message in enumerate(openclaw_messages(messages, meta)):
        entry_id = _entry_id(meta, n, taken)
        taken.add(entry_id)
        entry = {"type": "message", "id": entry_id, "parentId": parent, "timestamp": _iso_ms(message["timestamp"])}
        entries.append({**entry, "message": message})
        parent = entry_id
    return entries


def to_openclaw_session(messages: list[dict[str, Any]], meta: TrajectoryMeta) -> bytes:
    """The OpenClaw session file's content: one entry per line."""
    return b"".join(orjson.dumps(e) + b"\n" for e in openclaw_session_entries(messages, meta))


def openclaw_index(meta: TrajectoryMeta) -> dict[str, Any]:
    """``sessions.json``: the main session key → its entry (``sessionId``, ``updatedAt`` in ms, ``sessionFile``)."""
    entry = {"sessionId": meta.session_uuid, "updatedAt": _epoch_ms(meta.timestamp), "sessionFile": openclaw_session_path(meta)}
    return {OPENCLAW_SESSION_KEY: entry}


# ----------------------------------------------------------------------------- all of them
def trajectory_files(messages: list[dict[str, Any]], meta: TrajectoryMeta) -> dict[str, bytes]:
    """Every transcript file for the sandbox, path → content (ATIF and the sessions only with messages)."""
    files = {TRAJECTORY_PATH: chat_jsonl(messages)}
    atif = to_atif(messages, meta)
    if atif is not None:
        files[ATIF_PATH] = orjson.dumps(atif, option=orjson.OPT_INDENT_2) + b"\n"
        files[claude_session_path(meta)] = to_claude_session(messages, meta)
        files[openclaw_session_path(meta)] = to_openclaw_session(messages, meta)
        files[openclaw_index_path()] = orjson.dumps(openclaw_index(meta), option=orjson.OPT_INDENT_2) + b"\n"
    return files
