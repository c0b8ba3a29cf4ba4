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
from typing import Any

from core.chat import MAX_JSON_DEPTH, ToolCall, nests_too_deep, text_depth
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
        obj, error = _loads(raw, "tool call")
        if error:
            return ParsedOutput(text=text, error=error)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return ParsedOutput(text=text, error="tool call JSON has no string 'name'")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            args, error = _loads(args, "tool call 'arguments' (a string)")
            if error:
                return ParsedOutput(text=text, error=error)
        if not isinstance(args, dict):
            return ParsedOutput(text=text, error="tool call 'arguments' is not an object")
        arguments = json.dumps(args, ensure_ascii=False)
        if not _is_unicode(obj["name"]) or not _is_unicode(arguments):
            return ParsedOutput(text=text, error="tool call holds a lone surrogate escape (\\ud800-\\udfff): not text any client can take")
        calls.append(ToolCall(id=new_call_id(), name=obj["name"], arguments=arguments))
    return ParsedOutput(text=text[:start].rstrip(), tool_calls=calls)


def _loads(raw: str, what: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why `raw` is no JSON the proxy can re-serialise): a model's output never raises."""
    if nests_too_deep(raw):
        return None, f"{what} nests {text_depth(raw)} levels deep, past the {MAX_JSON_DEPTH} the proxy can re-serialise"
    try:
        return json.loads(raw, parse_constant=_no_constant), None
    except json.JSONDecodeError as exc:
        return None, f"{what} is not valid JSON: {exc.msg} at char {exc.pos}"
    except ValueError as exc:
        return None, f"{what} is not valid JSON: {exc}"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
