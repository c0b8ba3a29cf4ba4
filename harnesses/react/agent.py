#!/usr/bin/env python3
"""forgetui's built-in ReAct agent: an OpenAI Chat Completions tool loop, Python stdlib only.

Runs inside the sandbox. Exit codes: 0 the model answered without a tool call (the answer is
printed on stdout), 2 bad arguments, 3 the step limit was reached, 4 the model endpoint failed.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

EXIT_DONE, EXIT_USAGE, EXIT_STEPS, EXIT_ENDPOINT = 0, 2, 3, 4

SYSTEM_PROMPT = """You are an autonomous agent working in a Linux shell. Your working directory is {workdir}.
Complete the user's task by calling tools; each tool call's result comes back to you.
Tools:
- bash(command): run a bash command in the working directory; returns its exit code and output.
- read_file(path): return a file's text.
- write_file(path, content): create or overwrite a file with content.
- edit_file(path, old, new): replace the one occurrence of the text old in a file with new.
Relative paths are relative to the working directory.
When the task is done, reply with a short final answer and no tool call."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the working directory and return its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "The file to read."}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a file with the given content.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file to write."},
                    "content": {"type": "string", "description": "The full new content."},
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace the single occurrence of `old` in a file with `new`.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file to edit."},
                    "old": {"type": "string", "description": "The exact text to replace (must occur once)."},
                    "new": {"type": "string", "description": "The replacement text."},
                },
                "required": ["path", "old", "new"],
            },
        },
    },
]


GUI_SYSTEM_PROMPT = """You are an autonomous agent operating a graphical interface (a web page or a desktop) in a sandbox.
Each turn you are shown the screen: the task, its elements as [id] tag "text" @ x,y, and/or a screenshot.
Act with the tools (click an element by its id, click at x,y, type, press a key, scroll, select, drag).
After each action you see the screen again. The episode ends when the interface judges your work;
when you believe the task is done, reply with a short final answer and no tool call."""


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


_ID = {"type": "integer", "description": "An element id from the screen's element list."}
_NUM = {"type": "number"}
GUI_TOOLS: list[dict[str, Any]] = [
    _fn("click", "Click an element by its id.", {"id": _ID}, ["id"]),
    _fn("click_xy", "Click at screen coordinates (pixels of the screenshot).", {"x": _NUM, "y": _NUM}, ["x", "y"]),
    _fn("type_text", "Type text into the focused element, or into element `into` (clicked first).",
        {"text": {"type": "string"}, "into": _ID}, ["text"]),
    _fn("press_key", "Press a key or combination: Enter, Tab, Backspace, ctrl+a, ...", {"key": {"type": "string"}}, ["key"]),
    _fn("scroll", "Scroll by dy pixels (positive = down), optionally inside element `at`.", {"dy": {"type": "integer"}, "at": _ID}, ["dy"]),
    _fn("select_option", "Choose an option (by its text) of a select/list element.", {"id": _ID, "option": {"type": "string"}}, ["id", "option"]),
    _fn("drag", "Drag with the left button from (x1, y1) to (x2, y2).", {"x1": _NUM, "y1": _NUM, "x2": _NUM, "y2": _NUM}, ["x1", "y1", "x2", "y2"]),
]  # fmt: skip


class EndpointError(Exception):
    """The model endpoint failed for good (after retries, or with a non-retryable status)."""


def log(message: str) -> None:
    print(f"[react] {message}", file=sys.stderr, flush=True)


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail."""
    if len(text) <= limit:
        return text
    half = max(1, limit // 2)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters truncated ...]\n{text[-half:]}"


def rerooted(path: str) -> str:
    """Under the local runtime (FORGETUI_SANDBOX_ROOT set) sandbox-absolute paths live below that root."""
    root = os.environ.get("FORGETUI_SANDBOX_ROOT")
    if root and os.path.isabs(path) and not path.startswith(root.rstrip("/") + "/"):
        return os.path.join(root, path.lstrip("/"))
    return path


class Tools:
    """The tool implementations; every failure becomes a message for the model, never an exception."""

    def __init__(self, workdir: str, logical_workdir: str, command_timeout: float, max_output: int) -> None:
        self.workdir = workdir
        self.logical_workdir = logical_workdir.rstrip("/") or "/"
        self.command_timeout = command_timeout
        self.max_output = max_output

    def resolve(self, path: Any) -> str:
        if not isinstance(path, str) or not path:
            raise ValueError("path must be a non-empty string")
        if os.path.isabs(path):
            if path == self.logical_workdir or path.startswith(self.logical_workdir + "/"):
                return os.path.join(self.workdir, os.path.relpath(path, self.logical_workdir))
            return path
        return os.path.join(self.workdir, path)

    tools: list[dict[str, Any]] = TOOLS

    def run(self, name: str, raw_args: Any) -> str:
        known_names = [t["function"]["name"] for t in self.tools]
        handler = getattr(self, f"tool_{name}", None) if isinstance(name, str) and name in known_names else None
        if handler is None:
            known = ", ".join(known_names)
            return f"error: unknown tool {name!r}; available tools: {known}"
        if isinstance(raw_args, dict):
            args = raw_args
        else:
            try:
                args = json.loads(raw_args or "{}")
            except (TypeError, ValueError) as exc:
                return f"error: the arguments are not valid JSON ({exc}); send a JSON object"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        try:
            return handler(**args)
        except TypeError as exc:
            return f"error: bad arguments for {name}: {exc}"
        except (OSError, ValueError, UnicodeError) as exc:
            return f"error: {exc}"

    def tool_bash(self, command: Any) -> str:
        if not isinstance(command, str) or not command.strip():
            return "error: command must be a non-empty string"
        shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
        proc = subprocess.Popen(
            [shell, "-c", command],
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=self.command_timeout)
            head = f"exit code: {proc.returncode}"
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            out, _ = proc.communicate()
            head = f"error: the command timed out after {self.command_timeout:g}s and was killed"
        text = out.decode("utf-8", errors="replace")
        return head + ("\n" + clip(text, self.max_output) if text else "")

    def tool_read_file(self, path: Any) -> str:
        with open(self.resolve(path), encoding="utf-8", errors="replace") as fh:
            return clip(fh.read(), self.max_output)

    def tool_write_file(self, path: Any, content: Any) -> str:
        if not isinstance(content, str):
            content = json.dumps(content) if content is not None else ""
        target = self.resolve(path)
        parent = os.path.dirname(target)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(content)
        return f"wrote {len(content.encode('utf-8'))} bytes to {path}"

    def tool_edit_file(self, path: Any, old: Any, new: Any) -> str:
        if not isinstance(old, str) or not old or not isinstance(new, str):
            return "error: old must be a non-empty string and new a string"
        target = self.resolve(path)
        with open(target, encoding="utf-8") as fh:
            text = fh.read()
        count = text.count(old)
        if count != 1:
            what = "does not occur" if count == 0 else f"occurs {count} times"
            return f"error: the old text {what} in {path}; give text that occurs exactly once"
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text.replace(old, new, 1))
        return f"edited {path}"


class GuiTools(Tools):
    """The GUI tools: each one runs the sandbox's `gui` CLI (the same commands an external harness uses)."""

    tools = GUI_TOOLS
    gui_command = "gui"

    def gui(self, *args: Any) -> str:
        """Run `gui ARGS`; its output, with the exit status when it failed."""
        try:
            proc = subprocess.run(
                [self.gui_command, *map(str, args)], capture_output=True, text=True, timeout=self.command_timeout
            )
        except FileNotFoundError:
            return f"error: the `{self.gui_command}` command is not installed in this sandbox"
        except subprocess.TimeoutExpired:
            return f"error: the action did not finish within {self.command_timeout:g}s"
        out = (proc.stdout + proc.stderr).strip()
        return out if proc.returncode == 0 else f"{out}\n(exit code {proc.returncode})"

    def tool_click(self, id: Any) -> str:  # noqa: A002 - the tool's parameter name
        return self.gui("click", int(id))

    def tool_click_xy(self, x: Any, y: Any) -> str:
        return self.gui("click-xy", float(x), float(y))

    def tool_type_text(self, text: Any, into: Any = None) -> str:
        return self.gui("type", str(text), *(["--into", int(into)] if into is not None else []))

    def tool_press_key(self, key: Any) -> str:
        return self.gui("key", str(key))

    def tool_scroll(self, dy: Any, at: Any = None) -> str:
        return self.gui("scroll", int(dy), *(["--at", int(at)] if at is not None else []))

    def tool_select_option(self, id: Any, option: Any) -> str:  # noqa: A002
        return self.gui("select", int(id), str(option))

    def tool_drag(self, x1: Any, y1: Any, x2: Any, y2: Any) -> str:
        return self.gui("drag", float(x1), float(y1), float(x2), float(y2))

    def observation(self, mode: str) -> list[dict[str, Any]]:
        """The screen as chat content parts: the text form (modes text, both) and the screenshot (image, both)."""
        args = ["observe"] if mode in ("image", "both") else ["observe", "--no-screenshot"]
        text = self.gui(*args)
        parts: list[dict[str, Any]] = []
        shot = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("screenshot:")), None)
        if mode in ("text", "both"):
            parts.append({"type": "text", "text": text})
        else:
            task = next((ln for ln in text.splitlines() if ln.startswith("task:")), "")
            parts.append({"type": "text", "text": task or "The screen:"})
        if mode in ("image", "both") and shot:
            try:
                with open(rerooted(shot), "rb") as fh:
                    data = base64.b64encode(fh.read()).decode()
                parts.append({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}})
            except OSError as exc:
                parts.append({"type": "text", "text": f"(the screenshot {shot} could not be read: {exc})"})
        return parts

    def episode_over(self) -> bool:
        """Whether the interface has judged the episode (`gui status --json` says done)."""
        try:
            proc = subprocess.run([self.gui_command, "status", "--json"], capture_output=True, text=True, timeout=30)
            return bool(json.loads(proc.stdout).get("done")) if proc.returncode == 0 else False
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return False


class Client:
    """A minimal Chat Completions client with retries on 5xx and connection errors."""

    def __init__(self, base_url: str, api_key: str, timeout: float, retries: int, env_proxy: bool) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        handlers = [] if env_proxy else [urllib.request.ProxyHandler({})]
        self.opener = urllib.request.build_opener(*handlers)

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The assistant message ({content, tool_calls}) for one request."""
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(4.0, 0.5 * 2 ** (attempt - 1)))
            request = urllib.request.Request(
                self.url,
                data=data,
                method="POST",
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {self.api_key}",
                    "Accept": "text/event-stream" if body.get("stream") else "application/json",
                },
            )
            try:
                with self.opener.open(request, timeout=self.timeout) as resp:
                    if body.get("stream"):
                        return read_stream(resp)
                    return read_message(json.loads(resp.read().decode("utf-8")))
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", errors="replace")[:1000]
                last = f"HTTP {exc.code}: {detail}"
                if exc.code < 500 and exc.code != 429:
                    raise EndpointError(
                        f"the model endpoint {self.url} refused the request ({last})"
                    ) from exc
            except (OSError, http.client.HTTPException) as exc:  # URLError, refused, reset, timeout
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            except ValueError as exc:  # malformed JSON or SSE from the endpoint
                last = f"malformed response: {exc}"
            log(f"model call attempt {attempt + 1} failed: {last}")
        raise EndpointError(f"the model endpoint {self.url} failed after {self.retries + 1} attempts: {last}")


def read_message(payload: Any) -> dict[str, Any]:
    """The assistant message of a non-streamed completion."""
    if not isinstance(payload, dict) or not payload.get("choices"):
        raise ValueError(f"no choices in response: {str(payload)[:300]}")
    message = payload["choices"][0].get("message") or {}
    return {"content": message.get("content"), "tool_calls": message.get("tool_calls") or []}


def read_stream(resp: Any) -> dict[str, Any]:
    """Assemble the assistant message from an SSE stream of chat.completion.chunk events."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for raw in resp:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk and not chunk.get("choices"):
            raise ValueError(f"error event in stream: {str(chunk['error'])[:300]}")
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for part in delta.get("tool_calls") or []:
                slot = calls.setdefault(
                    int(part.get("index", len(calls))),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if part.get("id"):
                    slot["id"] = part["id"]
                fn = part.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
    text = "".join(content)
    return {"content": text or None, "tool_calls": [calls[i] for i in sorted(calls)]}


def run_agent(args: argparse.Namespace, instruction: str) -> int:
    workdir = rerooted(args.workdir)
    if not os.path.isdir(workdir):
        log(f"working directory {workdir} does not exist")
        return EXIT_USAGE
    gui = GuiTools(workdir, args.workdir, args.command_timeout, args.max_output) if args.gui else None
    tools = gui or Tools(workdir, args.workdir, args.command_timeout, args.max_output)
    client = Client(args.base_url, args.api_key, args.request_timeout, args.retries, args.env_proxy)
    if gui is not None:
        first = [{"type": "text", "text": instruction}, *gui.observation(args.gui)]
        messages: list[dict[str, Any]] = [{"role": "system", "content": GUI_SYSTEM_PROMPT}, {"role": "user", "content": first}]
    else:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT.format(workdir=args.workdir)},
            {"role": "user", "content": instruction},
        ]
    for step in range(1, args.max_steps + 1):
        body: dict[str, Any] = {"model": args.model, "messages": messages, "tools": tools.tools}
        if args.temperature is not None:
            body["temperature"] = args.temperature
        if args.max_tokens is not None:
            body["max_tokens"] = args.max_tokens
        if args.stream:
            body["stream"] = True
        try:
            reply = client.complete(body)
        except EndpointError as exc:
            print(f"react agent: {exc}", file=sys.stderr, flush=True)
            return EXIT_ENDPOINT
        calls = [c for c in reply["tool_calls"] if isinstance(c, dict)]
        assistant: dict[str, Any] = {"role": "assistant", "content": reply["content"]}
        for i, call in enumerate(calls):
            if not call.get("id"):
                call["id"] = f"call_{step}_{i}"
            call.setdefault("type", "function")
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if not calls:
            answer = reply["content"] if isinstance(reply["content"], str) else ""
            log(f"step {step}: final answer")
            print(answer, flush=True)
            return EXIT_DONE
        for call in calls:
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            name, raw_args = fn.get("name"), fn.get("arguments")
            result = tools.run(name, raw_args)
            log(f"step {step}: {name}({clip(str(raw_args), 200)}) -> {clip(result, 200)!r}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        if gui is not None:
            if gui.episode_over():
                log(f"step {step}: the interface judged the episode; stopping")
                print("episode over", flush=True)
                return EXIT_DONE
            messages.append({"role": "user", "content": gui.observation(args.gui)})
    log(f"step limit of {args.max_steps} model calls reached without a final answer")
    return EXIT_STEPS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="react_agent", description=__doc__)
    p.add_argument("--base-url", required=True, help="OpenAI-compatible base URL (ending in /v1)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    p.add_argument("--model", default="policy")
    p.add_argument("--workdir", default=os.getcwd())
    p.add_argument("--instruction-file", help="file holding the task (default: read stdin)")
    p.add_argument("--max-steps", type=int, default=20, help="most model calls")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--stream", action="store_true", help="request SSE streaming")
    p.add_argument("--command-timeout", type=float, default=60.0, help="seconds per bash command")
    p.add_argument("--max-output", type=int, default=8000, help="characters of tool output kept")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per model call")
    p.add_argument("--retries", type=int, default=2, help="retries on 5xx and connection errors")
    p.add_argument("--env-proxy", action="store_true", help="honour HTTP(S)_PROXY for the model endpoint")
    p.add_argument("--gui", choices=("text", "image", "both"), default=None,
                   help="GUI mode: act through the sandbox's `gui` CLI; each turn shows the screen as text, image or both")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.instruction_file:
            with open(rerooted(args.instruction_file), encoding="utf-8") as fh:
                instruction = fh.read()
        else:
            instruction = sys.stdin.read()
    except OSError as exc:
        log(f"cannot read the instruction: {exc}")
        return EXIT_USAGE
    if not instruction.strip():
        log("the instruction is empty")
        return EXIT_USAGE
    return run_agent(args, instruction)


if __name__ == "__main__":
    sys.exit(main())
