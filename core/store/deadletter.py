"""Bytes for a row the store could not take: JSON written without recursion, so no value can make it fail.

orjson stops at 254 levels of nesting and the standard library at Python's recursion limit; a
dead letter must be written whatever the row holds, so this encoder walks with an explicit stack.
It is only used on the failure path (speed does not matter there).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any


class _Text(str):
    """Already-encoded JSON text on the encoder's stack."""


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, bool | int | float | str):
        return json.dumps(value)  # ASCII escapes: any str, lone surrogates included, encodes
    if isinstance(value, dt.datetime | dt.date):
        return json.dumps(value.isoformat())
    return json.dumps(str(value))


def _children(value: Any) -> Any:
    """A container's items as a dict or list, or None for a scalar."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return list(value)
    tolist = getattr(value, "tolist", None)  # numpy arrays
    if callable(tolist) and not isinstance(value, str | bytes):
        items = tolist()
        return items if isinstance(items, list) else None
    return None


def dead_letter_bytes(row: Any) -> bytes:
    """`row` as JSON bytes, however deep it nests; bytes values are taken as the JSON text they hold."""
    out: list[str] = []
    stack: list[Any] = [row]
    while stack:
        item = stack.pop()
        if isinstance(item, _Text):
            out.append(item)
            continue
        if isinstance(item, bytes | bytearray | memoryview):
            out.append(bytes(item).decode("utf-8", "replace"))
            continue
        items = _children(item)
        if items is None:
            out.append(_scalar(item))
            continue
        pairs = list(items.items()) if isinstance(items, dict) else list(enumerate(items))
        is_dict = isinstance(items, dict)
        out.append("{" if is_dict else "[")
        stack.append(_Text("}" if is_dict else "]"))
        for j in range(len(pairs) - 1, -1, -1):  # pushed backwards: popped in order
            key, value = pairs[j]
            stack.append(value)
            if is_dict:
                stack.append(_Text(json.dumps(str(key)) + ":"))
            if j > 0:
                stack.append(_Text(","))
    return "".join(out).encode("utf-8", "surrogatepass")
