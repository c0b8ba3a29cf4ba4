"""Request bodies parsed once, as JSON with no repeated keys.

A JSON object may name a key twice (``"messages": [A], "messages": [B]``); parsers keep the last
(orjson, what the proxy acts on) while DuckDB's JSON functions read the first, so the model would
answer B while the stored request shows A. Such a body is refused with a 400 in the caller's
protocol, never guessed at: the record is the body as sent, and it is what the model saw.

Finding a repeated key costs one `orjson.dumps` of the parsed value, not a second parse: outside
strings, a colon separates each object member from its value, so the colons of the body as sent
(counting each ``\\u003a`` escape as the colon it stands for) add up to the members and in-string
colons of what was parsed — unless a repeated key's member was dropped, which leaves the body with
more. orjson's output has exactly as many colons as the parsed value holds.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from core.errors import ProtocolError

# a \u003a escape (a colon) preceded by an even number of backslashes, i.e. not itself escaped
_ESCAPED_COLON = re.compile(rb"(?<!\\)(?:\\\\)*\\u003[aA]")


def load_json(body: bytes, what: str = "request body") -> Any:
    """The parsed body; ProtocolError (400) when it is not JSON or an object in it repeats a key."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    if _colons_as_sent(body) != _colons_parsed(value):
        raise ProtocolError(
            f"{what} repeats the key {_repeated_key(body)} in one JSON object; send each key once "
            "(the proxy refuses rather than guess which value the model should see and the store should show)"
        )
    return value


def _colons_as_sent(body: bytes) -> int:
    """Colons in the body, counting each escaped colon in its strings."""
    escaped = len(_ESCAPED_COLON.findall(body)) if b"\\u003" in body else 0  # one scan; the pattern checks the rest
    return body.count(b":") + escaped


def _colons_parsed(value: Any) -> int:
    """Object members plus colons inside strings of a parsed value: what its JSON text holds."""
    try:
        return orjson.dumps(value).count(b":")
    except orjson.JSONEncodeError:  # deeper than orjson writes (its reader takes 1024 levels, its writer 254)
        return _count_by_walking(value)


def _count_by_walking(value: Any) -> int:
    count = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            count += len(node) + sum(key.count(":") for key in node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            count += node.count(":")
    return count


class _Repeated(Exception):
    pass


def _first_repeat(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Repeated(key)
        seen[key] = value
    return seen


def _repeated_key(body: bytes) -> str:
    """The first repeated key, for the message (a second, slower parse: only a refused body gets here)."""
    try:
        json.loads(body, object_pairs_hook=_first_repeat)
    except _Repeated as exc:
        return repr(exc.args[0])[:200]
    except (RecursionError, ValueError):
        pass
    return "(a key)"
