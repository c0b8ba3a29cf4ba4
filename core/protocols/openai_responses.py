"""OpenAI Responses (`/v1/responses`, what Codex speaks), streaming and not.

Our own translator, not LiteLLM's: its Responses bridge is slow to import and makes network calls.
"""

from __future__ import annotations

import logging
from typing import Any

from core.chat import Api, ChatRequest, Completion, ImagePart, content_fields
from core.errors import ProtocolError
from core.protocols.base import answer_from
from core.protocols.checks import FieldNames, check_sampling, logprobs_refused, refuse_logprobs, stream_flag
from core.protocols.images import part_image
from core.protocols.openai_chat import openai_error
from core.protocols.sse import (
    content_pieces,
    dump_args,
    event_frame,
    function_tool,
    model_name,
    now,
    object_list,
    opt_float,
    opt_int,
    require_dict,
    text_remainder,
    tool_call,
)

log = logging.getLogger(__name__)

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_PLACEHOLDERS = {"input_image": "[image]", "input_file": "[file]", "input_audio": "[audio]"}
_CALL_TYPES = ("function_call", "custom_tool_call")
_OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _image_of(part: dict[str, Any], where: str) -> ImagePart | None:
    return part_image(part, "responses", where)


def _content(content: Any, where: str) -> dict[str, Any]:
    """Message content or tool output (string or list of parts) as canonical `content` (and `parts` with images)."""
    return content_fields(content_pieces(content, where, _TEXT_PARTS, _PLACEHOLDERS, _image_of))


def _flat_name(namespace: str, name: str) -> str:
    """A namespaced tool's name as the policy sees it (Codex's MCP tools: mcp__gui + observe → mcp__gui__observe)."""
    return f"{namespace}{name}" if namespace.endswith("__") else f"{namespace}__{name}"


def _call_arguments(item: dict[str, Any], where: str) -> str:
    if item.get("type") == "custom_tool_call":
        raw = item.get("input")
        return dump_args({"input": raw if isinstance(raw, str) else ""})
    args = item.get("arguments")
    return args if isinstance(args, str) else dump_args(args if args is not None else {}, f"{where}.arguments")


def parse_input(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """`instructions` + `input` as canonical chat messages."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ProtocolError("'instructions' must be a string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list):
        raise ProtocolError("'input' is required and must be a string or a list of input items")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ProtocolError(f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise ProtocolError(f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}")
            messages.append(
                {"role": _ROLES[role], **_content(item.get("content"), f"{where}.content")}
            )
        elif kind in _CALL_TYPES:
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise ProtocolError(f"{where}.name must be a non-empty string")
            if isinstance(item.get("namespace"), str) and item["namespace"]:
                name = _flat_name(item["namespace"], name)
            call = tool_call(
                str(item.get("call_id") or item.get("id") or f"call_{i}"), name, _call_arguments(item, where)
            )
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in _OUTPUT_TYPES:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id") or ""),
                    **_content(item.get("output"), f"{where}.output"),
                }
            )
        else:
            log.debug("ignoring input item of type %r", kind)
    if not messages:
        raise ProtocolError("'input' has no messages: send at least one message")
    return messages


def _namespaced(tools: Any) -> dict[str, tuple[str, str]]:
    """flat name → (namespace, name) for every function inside a `namespace` tool."""
    out = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            for sub in tool.get("tools") or []:
                if isinstance(sub, dict) and sub.get("type") == "function" and isinstance(sub.get("name"), str):
                    out[_flat_name(tool["name"], sub["name"])] = (tool["name"], sub["name"])
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(object_list(tools, "tools")):
        if tool.get("type") == "namespace":  # Codex's MCP servers: each function under its flat name
            for j, sub in enumerate(tool.get("tools") or []):
                if isinstance(sub, dict) and sub.get("type") == "function":
                    name = _flat_name(str(tool.get("name")), str(sub.get("name")))
                    out.append(function_tool(name, sub.get("description"), sub.get("parameters"), f"tools[{i}].tools[{j}]"))
            continue
        if tool.get("type") != "function":
            continue  # web_search, custom, local_shell, ...: nothing a local policy can serve
        out.append(
            function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{i}]")
        )
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _incomplete(completion: Completion) -> bool:
    """Only a limit the client asked for shows as incomplete (Codex fails the turn on it)."""
    return (
        completion.finish_reason == "length"
        and not completion.truncated_by_proxy
        and not completion.tool_calls
    )


def _suffix(response_id: str) -> str:
    return response_id.split("_", 1)[-1]


def _message_item(msg_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [_text_part(text)] if status == "completed" else [],
    }


def _reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A `reasoning` output item: the reasoning as raw `reasoning_text` content (no summary, nothing encrypted)."""
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content, "encrypted_content": None}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed", request: ChatRequest | None = None
) -> dict[str, Any]:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    where = (request.extra.get("namespaced") or {}).get(name) if request is not None else None
    if where:  # a namespaced tool is called by its namespace and own name
        item["namespace"], item["name"] = where
    return item


def _base_response(request: ChatRequest, response_id: str, created: int, status: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.extra.get("instructions"),
        "max_output_tokens": request.max_tokens,
        "model": request.model,
        "output": [],
        "parallel_tool_calls": bool(request.extra.get("parallel_tool_calls", True)),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": request.temperature if request.temperature is not None else 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.extra.get("tool_choice", "auto"),
        "tools": [],
        "top_p": request.top_p if request.top_p is not None else 1.0,
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": {},
    }


def _final_response(
    request: ChatRequest, completion: Completion, response_id: str, created: int, output: list[dict[str, Any]]
) -> dict[str, Any]:
    incomplete = _incomplete(completion)
    resp = _base_response(request, response_id, created, "incomplete" if incomplete else "completed")
    if incomplete:
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    resp["output"] = output
    resp["usage"] = {
        "input_tokens": completion.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }
    return resp


def _output_items(completion: Completion, response_id: str, request: ChatRequest | None = None) -> list[dict[str, Any]]:
    sfx = _suffix(response_id)
    items = [_reasoning_item(f"rs_{sfx}", completion.reasoning)] if completion.reasoning else []
    if completion.text or not completion.tool_calls:
        items.append(_message_item(f"msg_{sfx}", completion.text))
    for i, tc in enumerate(completion.tool_calls):
        items.append(_call_item(f"fc_{sfx}_{i}", tc.id, tc.name, tc.arguments, request=request))
    return items


class _ResponsesStream:
    """Responses SSE: `event: <type>` + `data: <json with sequence_number>` frames; items in order: reasoning, message, calls."""

    def __init__(self, request: ChatRequest, response_id: str) -> None:
        self.request = request
        self.id = response_id
        self.created = now()
        self.seq = 0
        self.msg_id = f"msg_{_suffix(response_id)}"
        self.rs_id = f"rs_{_suffix(response_id)}"
        self.streamed = ""
        self.thought = ""
        self.message_open = False
        self.reasoning_open = False
        self.output: list[dict[str, Any]] = []  # the finished output items
        self.msg_index = 0

    def _ev(self, kind: str, payload: dict[str, Any]) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **payload}
        self.seq += 1
        return event_frame(kind, data)

    def start(self) -> bytes:
        base = _base_response(self.request, self.id, self.created, "in_progress")
        return self._ev("response.created", {"response": base}) + self._ev(
            "response.in_progress", {"response": base}
        )

    def reasoning(self, delta: str) -> bytes:
        if not delta:
            return b""
        head = b""
        if not self.reasoning_open:
            self.reasoning_open = True
            item = _reasoning_item(self.rs_id, "", "in_progress")
            head = self._ev("response.output_item.added", {"output_index": len(self.output), "item": item})
        self.thought += delta
        ids = {"item_id": self.rs_id, "output_index": len(self.output), "content_index": 0}
        return head + self._ev("response.reasoning_text.delta", {**ids, "delta": delta})

    def _close_reasoning(self) -> bytes:
        if not self.reasoning_open:
            return b""
        self.reasoning_open = False
        ids = {"item_id": self.rs_id, "output_index": len(self.output), "content_index": 0}
        item = _reasoning_item(self.rs_id, self.thought)
        frames = self._ev("response.reasoning_text.done", {**ids, "text": self.thought})
        frames += self._ev("response.output_item.done", {"output_index": len(self.output), "item": item})
        self.output.append(item)
        return frames

    def _open_message(self) -> bytes:
        head = self._close_reasoning()
        self.message_open, self.msg_index = True, len(self.output)
        ids = {"item_id": self.msg_id, "output_index": self.msg_index, "content_index": 0}
        return head + self._ev(
            "response.output_item.added",
            {"output_index": self.msg_index, "item": _message_item(self.msg_id, "", "in_progress")},
        ) + self._ev("response.content_part.added", {**ids, "part": _text_part("")})

    def text(self, delta: str) -> bytes:
        if not delta:
            return b""
        head = b"" if self.message_open else self._open_message()
        self.streamed += delta
        ids = {"item_id": self.msg_id, "output_index": self.msg_index, "content_index": 0}
        return head + self._ev("response.output_text.delta", {**ids, "delta": delta, "logprobs": []})

    def finish(self, completion: Completion) -> bytes:
        frames = [self.reasoning(text_remainder(self.thought, completion.reasoning)), self.text(text_remainder(self.streamed, completion.text))]
        frames.append(self._close_reasoning())
        if not self.message_open and not completion.tool_calls:
            frames.append(self._open_message())
        if self.message_open:
            text = self.streamed
            ids = {"item_id": self.msg_id, "output_index": self.msg_index, "content_index": 0}
            item = _message_item(self.msg_id, text)
            frames.append(self._ev("response.output_text.done", {**ids, "text": text, "logprobs": []}))
            frames.append(self._ev("response.content_part.done", {**ids, "part": _text_part(text)}))
            frames.append(self._ev("response.output_item.done", {"output_index": self.msg_index, "item": item}))
            self.output.append(item)
        output = self.output
        sfx = _suffix(self.id)
        for i, tc in enumerate(completion.tool_calls):
            index = len(output)
            item_id = f"fc_{sfx}_{i}"
            ids = {"item_id": item_id, "output_index": index}
            added = _call_item(item_id, tc.id, tc.name, "", "in_progress", self.request)
            frames.append(self._ev("response.output_item.added", {"output_index": index, "item": added}))
            frames.append(self._ev("response.function_call_arguments.delta", {**ids, "delta": tc.arguments}))
            frames.append(
                self._ev(
                    "response.function_call_arguments.done",
                    {**ids, "name": added["name"], "arguments": tc.arguments},
                )
            )
            item = _call_item(item_id, tc.id, tc.name, tc.arguments, request=self.request)
            frames.append(self._ev("response.output_item.done", {"output_index": index, "item": item}))
            output.append(item)
        final = _final_response(self.request, completion, self.id, self.created, output)
        frames.append(self._ev(f"response.{final['status']}", {"response": final}))
        return b"".join(frames)

    def error(self, kind: str, message: str) -> bytes:
        err = openai_error(kind, message)["error"]
        # `error` carries the nested object too, so the OpenAI SDKs raise at once; Codex reads response.failed
        first = self._ev("error", {"code": err["code"], "message": message, "param": None, "error": err})
        failed = _base_response(self.request, self.id, self.created, "failed")
        failed["error"] = {"code": err["code"], "message": message}
        return first + self._ev("response.failed", {"response": failed})


class OpenAIResponses:
    """OpenAI Responses."""

    api: Api = "responses"

    def parse_request(
        self, body: Any, *, model: str | None = None, stream: bool | None = None
    ) -> ChatRequest:
        body = require_dict(body)
        refuse_logprobs(body, "top_logprobs")
        if isinstance(body.get("include"), list) and LOGPROBS_INCLUDE in body["include"]:
            raise logprobs_refused(f"'include': [{LOGPROBS_INCLUDE!r}]")
        instructions = body.get("instructions")
        extra: dict[str, Any] = {"instructions": instructions}
        for key in ("parallel_tool_calls", "tool_choice", "previous_response_id"):
            if body.get(key) is not None:
                extra[key] = body[key]
        namespaced = _namespaced(body.get("tools"))
        if namespaced:
            extra["namespaced"] = namespaced
        if body.get("previous_response_id"):
            log.warning("previous_response_id is not supported (nothing is stored); only 'input' is used")
        request = ChatRequest(
            api="responses",
            model=model_name(body, model),
            messages=parse_input(instructions, body.get("input")),
            tools=_tools(body.get("tools")),
            stream=stream_flag(body, stream),
            max_tokens=opt_int(body, "max_output_tokens"),
            temperature=opt_float(body, "temperature"),
            top_p=opt_float(body, "top_p"),
            tool_choice=_tool_choice(body.get("tool_choice")),
            extra=extra,
        )
        return check_sampling(request, FieldNames(max_tokens="max_output_tokens"))

    def render_response(
        self, request: ChatRequest, completion: Completion, response_id: str
    ) -> dict[str, Any]:
        return _final_response(
            request, completion, response_id, now(), _output_items(completion, response_id, request)
        )

    def stream_renderer(self, request: ChatRequest, response_id: str) -> _ResponsesStream:
        return _ResponsesStream(request, response_id)

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return openai_error(kind, message)

    def answer_message(self, response: dict[str, Any]) -> dict[str, Any]:
        """The assistant message a recorded response carried, in canonical form (see `answer_from`)."""
        items = [i for i in response.get("output") or [] if i.get("type") in ("message", "function_call", "custom_tool_call")]
        return answer_from(self, {"model": "recorded", "input": items})


protocol = OpenAIResponses()
