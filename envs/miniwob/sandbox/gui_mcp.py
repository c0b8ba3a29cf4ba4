#!/usr/bin/env python3
"""`gui-mcp`: the sandbox's `gui` CLI as an MCP server over stdio, for harnesses that take MCP tools.

Speaks MCP's JSON-RPC 2.0, one message per line: `initialize`, `tools/list`, `tools/call`. Each tool
runs one `gui` command (the same CLI the instruction files describe); `observe` also returns the
screenshot as MCP image content. Python stdlib only; installed next to `gui` in the miniwob and
desktop images.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

PROTOCOL_VERSION = "2025-06-18"
_ID = {"type": "integer", "description": "An element (or window) id from observe."}
_NUM = {"type": "number"}
TOOLS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "observe": ("The screen: the task, its elements or windows with ids and positions, and a screenshot.", {}, []),
    "click": ("Click an element by id (desktop: focus a window).", {"id": _ID}, ["id"]),
    "click_xy": ("Click at screen coordinates (pixels of the screenshot).", {"x": _NUM, "y": _NUM}, ["x", "y"]),
    "drag": ("Drag with the left button from (x1, y1) to (x2, y2).", {"x1": _NUM, "y1": _NUM, "x2": _NUM, "y2": _NUM}, ["x1", "y1", "x2", "y2"]),
    "type_text": ("Type text into the focused element, or into element `into`.", {"text": {"type": "string"}, "into": _ID}, ["text"]),
    "press_key": ("Press a key or combination (Enter, Tab, ctrl+a).", {"key": {"type": "string"}}, ["key"]),
    "scroll": ("Scroll by dy pixels (positive = down), optionally inside element `at`.", {"dy": {"type": "integer"}, "at": _ID}, ["dy"]),
    "select_option": ("Choose an option (by its text) of a select element.", {"id": _ID, "option": {"type": "string"}}, ["id", "option"]),
}


def argv(name: str, args: dict[str, Any]) -> list[str]:
    """The `gui` command line for one tool call."""
    opt = [*(["--into", str(int(args["into"]))] if args.get("into") is not None else []), *(["--at", str(int(args["at"]))] if args.get("at") is not None else [])]
    return {
        "observe": lambda: ["observe"],
        "click": lambda: ["click", str(int(args["id"]))],
        "click_xy": lambda: ["click-xy", str(float(args["x"])), str(float(args["y"]))],
        "drag": lambda: ["drag", *(str(float(args[k])) for k in ("x1", "y1", "x2", "y2"))],
        "type_text": lambda: ["type", str(args["text"]), *opt],
        "press_key": lambda: ["key", str(args["key"])],
        "scroll": lambda: ["scroll", str(int(args["dy"])), *opt],
        "select_option": lambda: ["select", str(int(args["id"])), str(args["option"])],
    }[name]()


def call_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """An MCP tools/call result: the command's output as text (and the screenshot for observe)."""
    if name not in TOOLS:
        return {"content": [{"type": "text", "text": f"unknown tool {name!r}; tools: {', '.join(TOOLS)}"}], "isError": True}
    try:
        command = ["gui", *argv(name, args or {})]
    except (KeyError, TypeError, ValueError) as exc:
        return {"content": [{"type": "text", "text": f"bad arguments for {name}: {exc}"}], "isError": True}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    text = (proc.stdout + proc.stderr).strip()
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    shot = next((ln.split(":", 1)[1].strip() for ln in proc.stdout.splitlines() if ln.startswith("screenshot:")), None)
    if shot:
        try:
            with open(shot, "rb") as fh:
                content.append({"type": "image", "data": base64.b64encode(fh.read()).decode(), "mimeType": "image/png"})
        except OSError:
            pass
    return {"content": content, "isError": proc.returncode != 0}


def handle(message: dict[str, Any]) -> dict[str, Any] | None:
    """The reply to one JSON-RPC message (None for notifications)."""
    method, mid = message.get("method"), message.get("id")
    if mid is None:
        return None
    if method == "initialize":
        result: Any = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {"tools": {}}, "serverInfo": {"name": "forgetui-gui", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": n, "description": d, "inputSchema": {"type": "object", "properties": p, "required": r}} for n, (d, p, r) in TOOLS.items()]}
    elif method == "tools/call":
        params = message.get("params") or {}
        result = call_tool(str(params.get("name")), params.get("arguments") or {})
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": f"method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": mid, "result": result}


def main() -> int:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = handle(json.loads(line))
        except ValueError as exc:
            reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": f"parse error: {exc}"}}
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
