"""Server-sent-event framing and the small JSON/content helpers every wire protocol shares.

JSON is encoded with orjson: the proxy's added latency has to stay at a couple of milliseconds.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from core.chat import ImagePart, Piece
from core.errors import ProtocolError
from core.protocols.checks import check_depth

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"

def dumps(obj: Any) -> bytes:
    """Compact JSON bytes."""
    return orjson.dumps(obj)


def data_frame(obj: Any, eol: bytes = b"\n\n") -> bytes:
    """`data: <json>` followed by the blank line that ends the event."""
    return b"data: " + orjson.dumps(obj) + eol


def event_frame(event: str, obj: Any) -> bytes:
    """`event: <name>` + `data: <json>` (Responses and Messages framing)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def now() -> int:
    """Unix time in whole seconds (the `created` fields)."""
    return int(time.time())


def dump_args(obj: Any, where: str = "tool-call arguments") -> str:
    """Tool-call arguments as JSON text (the canonical `ToolCall.arguments`); a 400 past the one nesting limit."""
    check_depth(obj, where)
    return json.dumps(obj, ensure_ascii=False)


def load_args(arguments: str) -> dict[str, Any]:
    """Tool-call arguments text as an object; non-object or broken JSON is wrapped so nothing is lost."""
    if not arguments or not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"raw_arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


def args_json(arguments: str) -> str:
    """Arguments text guaranteed to be a JSON object (what streaming parsers accumulate)."""
    if arguments and arguments.strip():
        try:
            if isinstance(orjson.loads(arguments), dict):
                return arguments
        except orjson.JSONDecodeError:
            pass
    return dump_args(load_args(arguments))


def require_dict(body: Any, what: str = "request body") -> dict[str, Any]:
    """`body` itself, or a ProtocolError saying it is not a JSON object."""
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(body).__name__}")
    return body


def model_name(body: dict[str, Any], model: str | None) -> str:
    """The model from the URL, else the body's `model` (which must then be a string)."""
    if model is not None:
        return model
    value = body.get("model")
    if not isinstance(value, str) or not value:
        raise ProtocolError("'model' is required and must be a non-empty string")
    return value


def opt_int(body: dict[str, Any], *keys: str) -> int | None:
    """The first of `keys` present as an integer; a wrong type is a ProtocolError."""
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise ProtocolError(f"'{key}' must be an integer, got {value!r}")
        return int(value)
    return None


def opt_float(body: dict[str, Any], key: str) -> float | None:
    """`body[key]` as a float, None when absent; a wrong type is a ProtocolError."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"'{key}' must be a number, got {value!r}")
    return float(value)


def stop_list(value: Any, key: str) -> list[str]:
    """A stop field (string or list of strings) as a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise ProtocolError(f"'{key}' must be a string or a list of strings")


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """A canonical OpenAI function tool."""
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}: a function tool needs a non-empty string 'name'")
    function: dict[str, Any] = {"name": name}
    if isinstance(description, str) and description:
        function["description"] = description
    function["parameters"] = (
        parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    )
    return {"type": "function", "function": function}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A canonical assistant `tool_calls` entry."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def text_remainder(streamed: str, final: str) -> str:
    """The part of the final text that was not streamed yet (empty when it all was)."""
    if len(final) > len(streamed) and final.startswith(streamed):
        return final[len(streamed) :]
    return ""


def object_list(value: Any, key: str) -> list[dict[str, Any]]:
    """A list of objects (`tools`, ...): None is empty; anything else is a ProtocolError naming the item."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(f"'{key}' must be a list")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ProtocolError(f"{key}[{i}] must be an object")
    return value


ImageOf = Callable[[dict[str, Any], str], ImagePart | None]


def content_pieces(content: Any, where: str, text_kinds: tuple[str, ...], placeholders: dict[str, str], image_of: ImageOf | None = None) -> list[Piece]:
    """Content (a string, null, or a list of typed parts) as its pieces: texts, and images where `image_of` finds them.

    Other parts the text cannot hold (audio, files; images without `image_of`) are placeholders.
    """
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ProtocolError(f"{where} must be a string or a list of content parts")
    pieces: list[Piece] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            pieces.append(part)
            continue
        if not isinstance(part, dict):
            raise ProtocolError(f"{where}[{i}] must be an object with a 'type'")
        kind = part.get("type")
        image = image_of(part, f"{where}[{i}]") if image_of is not None else None
        if image is not None:
            pieces.append(image)
        elif kind in text_kinds:
            text = part.get("text")
            if not isinstance(text, str):
                raise ProtocolError(f"{where}[{i}].text must be a string")
            pieces.append(text)
        elif kind == "refusal":
            pieces.append(str(part.get("refusal") or ""))
        elif kind in placeholders:
            pieces.append(placeholders[kind])
        else:
            log.debug("ignoring %s part of type %r", where, kind)
    return pieces
