"""Real harness first requests grown into long histories the way each harness grows them.

Each harness's first request (`tests/fixtures/harness-requests/<harness>.jsonl`, its largest POST) is
the start; every call then appends the assistant's answer (a shell tool call) and a tool result of about
1.2 KB in that harness's protocol, as the harness resends its whole history: Claude Code's Messages
blocks (moving its `cache_control` marker to the newest block, as it does), Codex's Responses items,
Gemini CLI's `contents` parts, and chat messages for OpenClaw, opencode, pi and mini-swe-agent. Bodies
are serialized compactly with raw UTF-8, as the JavaScript and Rust harnesses send them (within a few
bytes of the recorded Content-Length). Used by `tests/test_request_deltas.py` and
`benchmarks/store_scale.py`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "harness-requests"
HARNESS_API = {"claude-code": "messages", "codex": "responses", "gemini-cli": "gemini"}  # the others speak chat
HARNESSES = ("claude-code", "codex", "gemini-cli", "openclaw-chat", "opencode", "pi", "mini-swe-agent")
SHELL_TOOL = {"claude-code": "Bash", "codex": "exec_command", "gemini-cli": "run_shell_command", "openclaw-chat": "exec"}
RESULT_LINE = "drwxr-xr-x 2 agent agent 4096 Nov 30 12:00 src/module_{i:03d}  # é – ok\n"


def first_request(harness: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of the harness's largest recorded POST."""
    posts = []
    for line in (FIXTURES / f"{harness}.jsonl").read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry.get("method") == "POST":
            body = entry["body"]
            posts.append((entry["path"], json.loads(body) if isinstance(body, str) else body))
    if not posts:
        raise FileNotFoundError(f"no POST recorded in {harness}.jsonl")
    return max(posts, key=lambda p: len(json.dumps(p[1])))


def tool_result(i: int) -> str:
    """About 1.2 KB of command output (a directory listing, with a few non-ASCII characters)."""
    return "".join(RESULT_LINE.format(i=i * 20 + k) for k in range(18))


class History:
    """One harness session's request body, grown call by call."""

    def __init__(self, harness: str) -> None:
        self.harness = harness
        self.api = HARNESS_API.get(harness, "chat")
        self.path, first = first_request(harness)
        self.body: dict[str, Any] = copy.deepcopy(first)
        self.calls = 0

    def encoded(self) -> bytes:
        """The body as the harness sends it."""
        return json.dumps(self.body, separators=(",", ":"), ensure_ascii=False).encode()

    def answer(self, i: int) -> tuple[str, str, str, dict[str, Any]]:
        """The assistant's i-th answer: (call id, text, tool name, arguments): a sentence and a shell tool call."""
        command = f"ls -la src/part_{i}"
        args = {"cmd": command} if self.harness == "codex" else {"command": command}
        return f"call_{i:04d}", f"Listing part {i}.", SHELL_TOOL.get(self.harness, "bash"), args

    def script(self, calls: int) -> dict[str, Any]:
        """A scripted-backend script whose i-th turn is `answer(i)`: the history a real harness would keep."""
        turns = []
        for i in range(calls):
            _, text, tool, args = self.answer(i)
            turns.append({"text": text, "tool_call": {"name": tool, "arguments": args}})
        return {"turns": turns}

    def grow(self) -> None:
        """Append the answer to the last call and its tool result, as this harness does."""
        i = self.calls
        self.calls += 1
        call_id, text, tool, args = self.answer(i)
        result = tool_result(i)
        if self.api == "messages":
            for message in self.body["messages"]:  # Claude Code keeps one moving cache marker on the newest block
                for block in message.get("content") if isinstance(message.get("content"), list) else ():
                    block.pop("cache_control", None)
            self.body["messages"] += [
                {"role": "assistant", "content": [{"type": "text", "text": text}, {"type": "tool_use", "id": call_id, "name": tool, "input": args}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": result, "cache_control": {"type": "ephemeral"}}]},
            ]
        elif self.api == "responses":
            self.body["input"] += [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
                {"type": "function_call", "name": tool, "arguments": json.dumps(args), "call_id": call_id},
                {"type": "function_call_output", "call_id": call_id, "output": result},
            ]
        elif self.api == "gemini":
            self.body["contents"] += [
                {"role": "model", "parts": [{"text": text}, {"functionCall": {"name": tool, "args": args}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": tool, "response": {"output": result}}}]},
            ]
        else:
            self.body["messages"] += [
                {"role": "assistant", "content": text, "tool_calls": [{"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}]},
                {"role": "tool", "tool_call_id": call_id, "content": result},
            ]


def bodies(harness: str, calls: int) -> list[bytes]:
    """The `calls` request bodies of one session, each the last one grown by an answer and a tool result."""
    history = History(harness)
    out = []
    for n in range(calls):
        if n:
            history.grow()
        out.append(history.encoded())
    return out
