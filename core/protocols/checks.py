"""Checks every protocol applies to a parsed request before any generation: ranges, `n`, `stream`, tool choice.

A value the proxy cannot honour is refused with a 400 in the caller's protocol, never accepted
silently (a harness asking for three choices and getting one) or left to fail later (an integer
over 64 bits that breaks rendering the answer after the whole generation ran).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from core.chat import MAX_JSON_DEPTH, ChatRequest, json_depth, nests_too_deep, text_depth
from core.errors import ProtocolError

MAX_TOKENS_LIMIT = 2**31 - 1  # past any context length; an int32 every backend and the store take


@dataclass(frozen=True)
class FieldNames:
    """How a protocol spells the sampling fields, so a refusal names the caller's own field."""

    max_tokens: str = "max_tokens"
    temperature: str = "temperature"
    top_p: str = "top_p"
    tool_choice: str = "tool_choice"


def check_sampling(request: ChatRequest, names: FieldNames) -> ChatRequest:
    """`request` itself once its limits are in range and its tool choice names an offered tool."""
    if request.max_tokens is not None and not 1 <= request.max_tokens <= MAX_TOKENS_LIMIT:
        raise ProtocolError(f"'{names.max_tokens}' must be an integer from 1 to {MAX_TOKENS_LIMIT}, got {request.max_tokens}")
    if request.temperature is not None and not (math.isfinite(request.temperature) and request.temperature >= 0):
        raise ProtocolError(f"'{names.temperature}' must be a number ≥ 0, got {request.temperature}")
    if request.top_p is not None and not (math.isfinite(request.top_p) and 0 < request.top_p <= 1):
        raise ProtocolError(f"'{names.top_p}' must be a number in (0, 1], got {request.top_p}")
    named = chosen_tool(request.tool_choice)
    if named is not None:
        check_offered([named], request.tools, names.tool_choice)
    return request


def chosen_tool(choice: Any) -> str | None:
    """The function a canonical tool choice forces, if it names one."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if name is not None:
            if not isinstance(name, str) or not name:
                raise ProtocolError("a tool choice that names a function needs a non-empty string 'name'")
            return name
    return None


def check_offered(names: list[Any], tools: list[dict[str, Any]], field: str) -> None:
    """Every name in `names` is one of the offered function tools."""
    offered = {t["function"]["name"] for t in tools}
    for name in names:
        if name not in offered:
            listed = ", ".join(sorted(offered)) or "none"
            raise ProtocolError(f"'{field}' names the tool {name!r}, which the request does not offer (offered: {listed})")


def stream_flag(body: dict[str, Any], stream: bool | None, key: str = "stream") -> bool:
    """`stream` from the URL when the protocol puts it there, else the body's boolean (absent or null: False)."""
    if stream is not None:
        return stream
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ProtocolError(f"'{key}' must be true or false, got {value!r}")
    return value


def single_choice(body: dict[str, Any], key: str) -> None:
    """Refuse asking for more than one choice: the proxy samples one, and a harness must not be told otherwise."""
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value != 1:
        raise ProtocolError(f"'{key}' must be 1 (the proxy samples one choice per call), got {value!r}")


def too_deep(where: str, depth: int) -> ProtocolError:
    """The one refusal for JSON nested past `MAX_JSON_DEPTH`, whichever protocol and field it is in."""
    return ProtocolError(f"{where}: nested too deep to handle ({depth} levels of objects and lists; at most {MAX_JSON_DEPTH} are supported)")


def check_depth(value: Any, where: str) -> None:
    """Refuse `value` (parsed JSON) nested past `MAX_JSON_DEPTH`."""
    depth = json_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise too_deep(where, depth)


def check_nesting(request: ChatRequest) -> None:
    """Refuse, before any generation, a request whose tool schemas, tool choice or history tool-call arguments
    nest past `MAX_JSON_DEPTH`: the proxy compares, renders and records them as JSON (the same limit holds for
    arguments the protocols turn into text while parsing, and for what a model samples)."""
    for i, tool in enumerate(request.tools):
        check_depth(tool, f"the schema of tools[{i}] ({tool['function']['name']!r})")
    check_depth(request.tool_choice, "the tool choice")
    check_depth(request.extra, "the request's other fields")
    for i, message in enumerate(request.messages):
        for call in message.get("tool_calls") or ():
            args = call["function"]["arguments"]
            if nests_too_deep(args):
                raise too_deep(f"the arguments of a tool call in message {i}", text_depth(args))
            if _SURROGATE_ESCAPE.search(args) and not _unicode_json(args):
                raise ProtocolError(f"the arguments of a tool call in message {i} escape a lone surrogate (\\ud800-\\udfff): not text a tokenizer or the store can take")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _unicode_json(text: str) -> bool:
    """Whether JSON `text` (not JSON: kept as text, fine) holds only strings that are valid Unicode once parsed."""
    try:
        value = json.loads(text)
    except ValueError:
        return True
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def logprobs_refused(what: str) -> ProtocolError:
    """The refusal of a request that asks for logprobs in its answer: the proxy returns none."""
    return ProtocolError(
        f"{what} is not supported: this proxy returns no logprobs in its answers (the sampled tokens' logprobs "
        "are recorded in the store, calls.completion_logprobs); send the request without it"
    )


def refuse_logprobs(body: dict[str, Any], *keys: str, where: str = "") -> None:
    """Refuse any of `keys` set (true, or a count above 0) in `body`."""
    for key in keys:
        if body.get(key) not in (None, False, 0):
            raise logprobs_refused(f"'{where}{key}'")
