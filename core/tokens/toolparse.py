"""Parse tool calls out of sampled text; parsers are pluggable by name (hermes/qwen first).

A parser never raises: malformed tool-call text comes back as plain text with
an error string, so a model's bad output becomes an observation, not a 500.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from core.chat import ToolCall
from core.errors import ConfigError


@dataclass
class ParsedOutput:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
HERMES_OPEN = "<tool_call>"


def parse_hermes(text: str) -> ParsedOutput:
    """Hermes / Qwen2.5 style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""
    start = text.find(HERMES_OPEN)
    if start < 0:
        return ParsedOutput(text=text)
    calls: list[ToolCall] = []
    for match in _HERMES_BLOCK.finditer(text, start):
        raw = match.group(1).strip()
        if not match.group(2):
            return ParsedOutput(text=text, error="unterminated <tool_call> block")
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            return ParsedOutput(text=text, error=f"tool call is not valid JSON: {exc.msg} at char {exc.pos}")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ParsedOutput(text=text, error="tool call JSON has no string 'name'")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return ParsedOutput(text=text, error="tool call 'arguments' is a string that is not JSON")
        if not isinstance(args, dict):
            return ParsedOutput(text=text, error="tool call 'arguments' is not an object")
        calls.append(ToolCall(id=new_call_id(), name=obj["name"], arguments=json.dumps(args, ensure_ascii=False)))
    return ParsedOutput(text=text[:start].rstrip(), tool_calls=calls)


PARSERS: dict[str, Callable[[str], ParsedOutput]] = {"hermes": parse_hermes, "qwen": parse_hermes}
OPEN_TAGS: dict[str, str] = {"hermes": HERMES_OPEN, "qwen": HERMES_OPEN}


def get_parser(name: str) -> Callable[[str], ParsedOutput]:
    try:
        return PARSERS[name]
    except KeyError:
        raise ConfigError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(PARSERS))}") from None


class VisibleTextStream:
    """Streams the text a client may see, holding back anything that may start a tool call.

    Text before the first tool-call tag streams as it is sampled; from the tag
    on, everything is held until the whole completion is parsed.
    """

    def __init__(self, open_tag: str = HERMES_OPEN) -> None:
        self.open_tag = open_tag
        self.buffer = ""
        self.emitted = 0
        self.in_tool = False

    def feed(self, delta: str) -> str:
        """Add sampled text; return the newly visible part."""
        self.buffer += delta
        if self.in_tool:
            return ""
        tag_at = self.buffer.find(self.open_tag, max(0, self.emitted - len(self.open_tag)))
        if tag_at >= 0:
            self.in_tool = True
            safe = tag_at
        else:
            safe = len(self.buffer)
            # hold back a suffix that could be the start of the tag
            for keep in range(min(len(self.open_tag) - 1, len(self.buffer)), 0, -1):
                if self.open_tag.startswith(self.buffer[-keep:]):
                    safe = len(self.buffer) - keep
                    break
        out = self.buffer[self.emitted : safe]
        self.emitted = max(self.emitted, safe)
        return out

    def rest(self, visible_text: str) -> str:
        """What is still owed to the client once the final visible text is known (it starts with what was sent)."""
        return visible_text[self.emitted :]
