"""A scripted policy: replays given assistant turns through the real token path.

Each turn is rendered as the text a hermes-style model would sample (`text`, then
``<tool_call>\\n{json}\\n</tool_call>`` blocks, then eos), tokenized with a real tokenizer
and streamed as tokens, so templating, splicing and tool-call parsing run as with a model.

Script (JSON or TOML)::

    {"turns": [{"text": "..."},
               {"think": "...", "tool": "shell", "command": "ls"},
               {"tool": "shell", "command": "echo hi > hello.txt"},
               {"tool": "write_file", "path": "a.txt", "content": "x"},
               {"tool_call": {"name": "...", "arguments": {...}}},
               {"text": "...", "tool_call": {...}}],
     "loop": false}

or a plain list of turns. A turn's `think` is sampled first as ``<think>\\n...\\n</think>\\n\\n`` (a thinking
model's reasoning, Qwen3 style). Turn i answers a session's i-th call; past the end the last
text-only turn is repeated (or "done"), unless ``loop`` is true.

A teacher for many tasks gives each task its own turns, picked by a text its user message contains
(the first match wins; sessions matching none play the top-level ``turns``)::

    {"tasks": [{"match": "hello.txt", "turns": [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "done"}]}],
     "turns": [{"text": "I cannot help with that."}]}
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import tomllib
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from core.backends.base import GenerationContext, SamplingParams, TokenChunk
from core.backends.kinds import Capabilities
from core.backends.spec import PolicySpec
from core.errors import ConfigError, ModelError
from core.models.resolve import load_tokenizer, resolve_model

log = logging.getLogger(__name__)

SHELL_TOOL_NAMES = (
    "bash",
    "shell",
    "exec_command",
    "run_shell_command",
    "execute_command",
    "terminal",
    "run",
    "cmd",
    "exec",
    "run_command",
    "execute_bash",
    "shell_command",
    "local_shell",
)
WRITE_TOOL_NAMES = (
    "write_file",
    "write",
    "create_file",
    "writefile",
    "write_to_file",
    "file_write",
    "createfile",
)
COMMAND_PARAMS = ("command", "cmd", "script")
PATH_PARAMS = ("path", "file_path", "filePath", "absolute_path", "filename", "file")
CONTENT_PARAMS = ("content", "contents", "text", "file_text")
CHUNK_TOKENS = 4
SCRIPTED_CONTEXT = 131072


def load_script(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """Read a script file: returns (turns, loop)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
        data: Any = tomllib.loads(raw) if path.suffix.lower() == ".toml" else json.loads(raw)
    except FileNotFoundError:
        raise ConfigError(f"script file {path} does not exist") from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"script file {path} is not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}"
        ) from exc
    if isinstance(data, list):
        turns, loop = data, False
    elif isinstance(data, dict) and isinstance(data.get("turns", []), list) and ("turns" in data or "tasks" in data):
        turns, loop = data.get("turns", []), bool(data.get("loop", False))
    else:
        raise ConfigError(f"script {path} must be a list of turns or an object with a `turns` list")
    _check_turns(path, turns)
    return turns, loop


def _check_turns(path: Path, turns: list[Any], where: str = "") -> None:
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not ({"text", "think", "tool", "tool_call", "tool_calls"} & turn.keys()):
            raise ConfigError(
                f"script {path}{where}, turn {i}: expected an object with text, think, tool or tool_call, got {turn!r}"
            )
        bad = _lone_surrogate(turn)
        if bad is not None:
            raise ConfigError(
                f"script {path}{where}, turn {i}: {bad!r} holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair), "
                "which no tokenizer or client can take; write the character itself or a valid surrogate pair"
            )


def _lone_surrogate(value: Any) -> str | None:
    """The first string (key or value) in `value` that is not encodable as UTF-8 (a lone surrogate), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return item
    return None


def load_task_scripts(path: Path) -> list[tuple[str, list[dict[str, Any]]]]:
    """A script's per-task turns: (text the user message contains, turns), in order."""
    path = Path(path)
    raw = path.read_text(encoding="utf-8")
    data: Any = tomllib.loads(raw) if path.suffix.lower() == ".toml" else json.loads(raw)
    tasks = data.get("tasks", []) if isinstance(data, dict) else []
    out = []
    for j, entry in enumerate(tasks):
        if not isinstance(entry, dict) or not isinstance(entry.get("match"), str) or not isinstance(entry.get("turns"), list):
            raise ConfigError(f"script {path}, tasks[{j}]: expected {{\"match\": TEXT, \"turns\": [...]}}")
        _check_turns(path, entry["turns"], f", tasks[{j}]")
        out.append((entry["match"], entry["turns"]))
    return out


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """The {name, parameters} part of a canonical (or flat) function tool."""
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def _props(fn: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    params = fn.get("parameters") or {}
    return params.get("properties") or {}, list(params.get("required") or [])


def _is_type(schema: dict[str, Any], kind: str) -> bool:
    t = schema.get("type")
    if isinstance(t, list):
        return kind in t
    if t is None and kind == "string":
        return "items" not in schema
    return t == kind


def find_shell_tool(tools: list[dict[str, Any]]) -> tuple[dict[str, Any], str] | None:
    """The offered tool that runs shell commands, with the name of its command parameter."""
    best: tuple[int, dict[str, Any], str] | None = None
    for tool in tools:
        fn = _function(tool)
        props, required = _props(fn)
        param = next((p for p in COMMAND_PARAMS if p in props), None)
        if param is None:
            continue
        name = str(fn.get("name", "")).lower()
        if name in SHELL_TOOL_NAMES:
            score = 3 + (len(SHELL_TOOL_NAMES) - SHELL_TOOL_NAMES.index(name)) / 100
        elif param in required and (_is_type(props[param], "string") or _is_type(props[param], "array")):
            score = 1
        else:
            continue
        if best is None or score > best[0]:
            best = (score, fn, param)
    return (best[1], best[2]) if best else None


def find_write_tool(tools: list[dict[str, Any]]) -> tuple[dict[str, Any], str, str] | None:
    """The offered tool that writes a whole file, with its path and content parameter names."""
    candidates = []
    for tool in tools:
        fn = _function(tool)
        props, _ = _props(fn)
        path = next((p for p in PATH_PARAMS if p in props), None)
        content = next((p for p in CONTENT_PARAMS if p in props), None)
        if path is None or content is None:
            continue
        name = str(fn.get("name", "")).lower()
        named = name in WRITE_TOOL_NAMES or ("write" in name or "create" in name)
        if named and len(props) <= 4:
            candidates.append((0 if name in WRITE_TOOL_NAMES else 1, fn, path, content))
    candidates.sort(key=lambda c: c[0])
    return (candidates[0][1], candidates[0][2], candidates[0][3]) if candidates else None


def _fill_required(fn: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """Give every other required parameter a harmless default so the call validates."""
    props, required = _props(fn)
    for name in required:
        if name in args:
            continue
        schema = props.get(name, {})
        if "enum" in schema and schema["enum"]:
            args[name] = schema["enum"][0]
        elif _is_type(schema, "boolean"):
            args[name] = False
        elif _is_type(schema, "integer") or _is_type(schema, "number"):
            args[name] = schema.get("minimum", 1) or 1
        elif _is_type(schema, "array"):
            args[name] = []
        elif _is_type(schema, "object"):
            args[name] = {}
        else:
            args[name] = "scripted"
    return args


def shell_call(tools: list[dict[str, Any]], command: str) -> dict[str, Any] | None:
    """A tool call {name, arguments} that runs `command` with the offered shell tool, or None."""
    found = find_shell_tool(tools)
    if found is None:
        return None
    fn, param = found
    props, _ = _props(fn)
    value: Any = ["bash", "-lc", command] if _is_type(props.get(param, {}), "array") else command
    return {"name": fn["name"], "arguments": _fill_required(fn, {param: value})}


def write_call(tools: list[dict[str, Any]], path: str, content: str) -> dict[str, Any] | None:
    """A tool call that writes `content` to `path`: a write-file tool, else the shell tool with printf."""
    found = find_write_tool(tools)
    if found is not None:
        fn, path_param, content_param = found
        return {
            "name": fn["name"],
            "arguments": _fill_required(fn, {path_param: path, content_param: content}),
        }
    return shell_call(tools, f"printf '%s' {shlex.quote(content)} > {shlex.quote(path)}")


def resolve_turn(turn: dict[str, Any], tools: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """A script turn → (text, [tool calls as {name, arguments}]) for the offered tools."""
    text = str(turn.get("text") or "")
    calls: list[dict[str, Any]] = []
    explicit = turn.get("tool_calls") or ([turn["tool_call"]] if turn.get("tool_call") else [])
    for call in explicit:
        calls.append({"name": call["name"], "arguments": call.get("arguments") or {}})
    kind = turn.get("tool")
    if kind in ("shell", "bash"):
        call = shell_call(tools, str(turn["command"]))
        if call is None:
            log.warning(
                "scripted: no shell tool among %s; answering with text",
                [_function(t).get("name") for t in tools],
            )
            text = (text + "\n" if text else "") + f"$ {turn['command']}"
        else:
            calls.append(call)
    elif kind == "write_file":
        call = write_call(tools, str(turn["path"]), str(turn.get("content", "")))
        if call is None:
            log.warning("scripted: no write-file or shell tool offered; answering with text")
            text = (text + "\n" if text else "") + f"{turn['path']}:\n{turn.get('content', '')}"
        else:
            calls.append(call)
    elif kind is not None:
        raise ConfigError(f"scripted turn has unknown tool kind {kind!r}; use shell, write_file or tool_call")
    return text, calls


def render_turn(text: str, calls: list[dict[str, Any]], think: str | None = None) -> str:
    """The hermes-format assistant text for one turn (without the eos token), its reasoning first when it has some."""
    blocks = [
        "<tool_call>\n"
        + json.dumps({"name": c["name"], "arguments": c["arguments"]}, ensure_ascii=False)
        + "\n</tool_call>"
        for c in calls
    ]
    answer = "\n".join(([text] if text else []) + blocks)
    return answer if think is None else f"<think>\n{think}\n</think>\n\n{answer}"


class ScriptedBackend:
    """A `TokenBackend` that plays a script, turn i for a session's i-th call."""

    # it takes image inputs (rendered as the "[image]" placeholder text): the stand-in for a
    # vision-language policy in GUI tests; the built-in models are text-only and refuse them
    capabilities = Capabilities(token_ids=True, logprobs=True, images=True)
    weights_version: int | None = None  # a script has no weights

    def __init__(self, script_path: Path, tokenizer_model: str = "tiny", context_length: int | None = None) -> None:
        self.script_path = Path(script_path)
        self.turns, self.loop = load_script(self.script_path)
        self.task_scripts = load_task_scripts(self.script_path)
        self.name = f"scripted:{self.script_path.name}"
        source = resolve_model(tokenizer_model)
        try:
            self.tokenizer = load_tokenizer(source)
        except Exception as exc:
            raise ModelError(f"cannot load tokenizer {tokenizer_model!r} from {source}: {exc}") from exc
        if self.tokenizer.eos_token_id is None:
            raise ModelError(
                f"tokenizer {tokenizer_model!r} has no eos token; the scripted backend needs one"
            )
        # no model runs here: `context` in the spec (scripted:FILE?context=N) lifts the tokenizer's limit for long histories
        self.context_length = context_length or min(
            int(getattr(self.tokenizer, "model_max_length", SCRIPTED_CONTEXT)), SCRIPTED_CONTEXT
        )
        self._calls: dict[str, int] = defaultdict(int)

    def turns_for(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The task script whose match the first user message contains, else the top-level turns."""
        if self.task_scripts:
            first_user = next((m for m in messages if m.get("role") == "user"), None)
            text = _text_of(first_user.get("content")) if first_user else ""
            for match, turns in self.task_scripts:
                if match in text:
                    return turns
        return self.turns

    def next_turn(self, session: str, turns: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The turn for this session's next call (advances its counter)."""
        turns = self.turns if turns is None else turns
        i = self._calls[session]
        self._calls[session] += 1
        if i < len(turns):
            return turns[i]
        if self.loop and turns:
            return turns[i % len(turns)]
        text_turns = [t for t in turns if set(t) == {"text"}]
        return text_turns[-1] if text_turns else {"text": "done"}

    def completion_ids(self, turn: dict[str, Any], tools: list[dict[str, Any]]) -> list[int]:
        text, calls = resolve_turn(turn, tools)
        think = turn.get("think")
        ids = self.tokenizer(render_turn(text, calls, None if think is None else str(think)), add_special_tokens=False)["input_ids"]
        return list(ids) + [int(self.tokenizer.eos_token_id)]

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext
    ) -> AsyncIterator[TokenChunk]:
        turn = self.next_turn(context.session, self.turns_for(list(context.request.messages or [])))
        ids = self.completion_ids(turn, list(context.request.tools or []))
        finish = "stop"
        if sampling.max_tokens and len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        for start in range(0, len(ids), CHUNK_TOKENS):
            part = ids[start : start + CHUNK_TOKENS]
            last = start + CHUNK_TOKENS >= len(ids)
            yield TokenChunk(
                token_ids=part, logprobs=[0.0] * len(part), finish_reason=finish if last else None
            )
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        return None


def _text_of(content: Any) -> str:
    """A message's text, whether a string or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def from_spec(spec: PolicySpec, *, tokenizer: str | None = None) -> ScriptedBackend:
    """`scripted:FILE` (option tokenizer=MODEL, else policy.tokenizer, else tiny; option context=N)."""
    path = Path(spec.target).expanduser()
    if not path.is_file():
        raise ConfigError(f"scripted backend: no script file at {path}")
    context = spec.options.get("context")
    if context is not None and (not context.isdigit() or int(context) < 1):
        raise ConfigError(f"context={context!r} in the backend spec must be a number of tokens > 0")
    return ScriptedBackend(path, tokenizer_model=spec.tokenizer_model(tokenizer) or "tiny", context_length=int(context) if context else None)
