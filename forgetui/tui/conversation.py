"""Turn recorded request/response bodies of any wire protocol into (role, text) turns for display."""

from __future__ import annotations

import json
import logging
from typing import Any

from core.errors import ProtocolError
from core.protocols.registry import (
    get_protocol,  # at start-up: imported on first use, it stalled the UI ~20 ms
)

log = logging.getLogger(__name__)

Turn = tuple[str, str]


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def _tool_call(name: Any, args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return f"→ {name}({json.dumps(args, ensure_ascii=False, default=str) if not isinstance(args, str) else args})"


def part_text(part: Any) -> str:
    """Text of one content part/block/item of any protocol; unknown shapes as compact JSON."""
    if part is None:
        return ""
    if isinstance(part, str):
        return part
    if isinstance(part, list):
        return "\n".join(t for t in (part_text(p) for p in part) if t)
    if not isinstance(part, dict):
        return str(part)
    kind = part.get("type")
    if "text" in part and isinstance(part["text"], str):
        return part["text"]
    if kind in ("tool_use", "function_call") or "functionCall" in part:
        fc = part.get("functionCall") or part
        return _tool_call(fc.get("name"), fc.get("input", fc.get("arguments", fc.get("args"))))
    if kind in ("tool_result", "function_call_output") or "functionResponse" in part:
        inner = part.get("functionResponse") or part
        body = inner.get("content", inner.get("output", inner.get("response")))
        return "← " + (part_text(body) if not isinstance(body, dict) else _dump(body))
    if kind in ("thinking", "reasoning"):
        return "(thinking) " + part_text(part.get("thinking") or part.get("summary") or "")
    if "content" in part:
        return part_text(part["content"])
    return json.dumps(part, ensure_ascii=False, default=str)


def _chat_message(msg: dict[str, Any]) -> Turn:
    role = str(msg.get("role") or msg.get("type") or "?")
    pieces = [part_text(msg.get("content"))]
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or tc
        pieces.append(_tool_call(fn.get("name"), fn.get("arguments")))
    if msg.get("tool_call_id"):
        role = f"{role} ({msg['tool_call_id']})"
    return role, "\n".join(p for p in pieces if p)


def generic_turns(body: Any) -> list[Turn]:
    """Turns from a body of any protocol, by its shape; the JSON itself when no shape fits."""
    if not isinstance(body, dict):
        return [("body", body if isinstance(body, str) else _dump(body))] if body is not None else []
    turns: list[Turn] = []
    system = body.get("system") or body.get("instructions") or body.get("systemInstruction")
    if system:
        turns.append(("system", part_text(system.get("parts") if isinstance(system, dict) else system)))
    if isinstance(body.get("messages"), list):  # chat / anthropic
        turns += [_chat_message(m) for m in body["messages"] if isinstance(m, dict)]
    elif isinstance(body.get("contents"), list):  # gemini request
        turns += [(str(c.get("role", "?")), part_text(c.get("parts"))) for c in body["contents"] if isinstance(c, dict)]
    elif "input" in body or "output" in body:  # responses
        items = body.get("input", body.get("output"))
        if isinstance(items, str):
            turns.append(("user", items))
        else:
            for item in items or []:
                if isinstance(item, dict):
                    turns.append((str(item.get("role") or item.get("type") or "?"), part_text(item)))
    elif isinstance(body.get("choices"), list):  # chat response
        for choice in body["choices"]:
            turns.append(_chat_message(choice.get("message") or choice.get("delta") or {}))
    elif isinstance(body.get("candidates"), list):  # gemini response
        for cand in body["candidates"]:
            content = cand.get("content") or {}
            turns.append((str(content.get("role", "model")), part_text(content.get("parts"))))
    elif isinstance(body.get("content"), list):  # anthropic response
        turns.append((str(body.get("role", "assistant")), part_text(body["content"])))
    if not turns:
        turns.append(("body", _dump(body)))
    return turns


def request_turns(api: str, body: Any) -> list[Turn]:
    """The conversation a request carries: parsed by its wire protocol when possible, else by shape."""
    if isinstance(body, dict):
        try:
            request = get_protocol(api).parse_request(body, model=body.get("model") or "?", stream=False)
        except (ValueError, ProtocolError, KeyError, TypeError, AttributeError) as exc:
            log.debug("showing the %s request by shape: %s", api, exc)
        else:
            return [_chat_message(m) for m in request.messages]
    return generic_turns(body)


def response_turns(body: Any) -> list[Turn]:
    """What the response said (assistant text, tool calls)."""
    return generic_turns(body)


def tools_offered(body: Any) -> list[tuple[str, str]]:
    """(name, description) of the tools a request offers, in any wire protocol."""
    if not isinstance(body, dict):
        return []
    out = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        for decl in tool.get("functionDeclarations") or tool.get("function_declarations") or []:  # gemini
            out.append((str(decl.get("name")), str(decl.get("description") or "")))
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool  # chat | messages, responses
        if fn.get("name"):
            out.append((str(fn["name"]), str(fn.get("description") or "")))
    return out
