"""OpenAI Chat Completions (`/v1/chat/completions`), streaming and not.

Our own translator, not LiteLLM's: importing LiteLLM costs seconds and ~200 MB, and the proxy must stay fast.
"""

from __future__ import annotations

import logging
from typing import Any

from core.chat import Api, ChatRequest, Completion, ImagePart, content_fields
from core.errors import ProtocolError
from core.protocols.base import answer_from
from core.protocols.checks import FieldNames, check_sampling, refuse_logprobs, single_choice, stream_flag
from core.protocols.images import part_image
from core.protocols.sse import (
    DONE,
    content_pieces,
    data_frame,
    dump_args,
    function_tool,
    model_name,
    now,
    object_list,
    opt_float,
    opt_int,
    require_dict,
    stop_list,
    text_remainder,
    tool_call,
)

log = logging.getLogger(__name__)

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_PLACEHOLDERS = {"image_url": "[image]", "input_image": "[image]", "input_audio": "[audio]", "file": "[file]"}

_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "too_large": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "method_not_allowed": "invalid_request_error",
    "rate_limit": "rate_limit_error",
}
_ERROR_CODES: dict[str, str | None] = {
    "context_length": "context_length_exceeded",
    "authentication": "invalid_api_key",
    "not_found": None,  # OpenAI's own 404 for an unknown URL has no code (model_not_found is for a model)
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_exceeded",
    "overloaded": "server_overloaded",
}


def openai_error(kind: str, message: str) -> dict[str, Any]:
    """The OpenAI `{"error": {...}}` object (shared with the Responses protocol)."""
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(kind, "server_error"),
            "param": None,
            "code": _ERROR_CODES.get(kind, kind),
        }
    }


def _image_of(part: dict[str, Any], where: str) -> ImagePart | None:
    return part_image(part, "chat", where)


def _content(content: Any, where: str) -> dict[str, Any]:
    """Chat message content (string, list of parts or null) as canonical `content` (and `parts` with images)."""
    return content_fields(content_pieces(content, f"{where}.content", ("text", "input_text", "output_text"), _PLACEHOLDERS, _image_of))


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise ProtocolError(f"{where}.tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ProtocolError(f"{where}.tool_calls[{j}] must have a function with a string 'name'")
        args = fn.get("arguments")
        args = args if isinstance(args, str) else dump_args(args if args is not None else {}, f"{where}.tool_calls[{j}].function.arguments")
        out.append(tool_call(str(call.get("id") or f"call_{j}"), fn["name"], args))
    return out


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate chat `messages` and return them in canonical form."""
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("'messages' is required and must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ProtocolError(f"{where} must be an object")
        role = msg.get("role")
        if role == "function":  # legacy function result
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(msg.get("name") or ""),
                    **_content(msg.get("content"), where),
                }
            )
            continue
        if role not in _ROLES:
            raise ProtocolError(f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}")
        canon: dict[str, Any] = {"role": _ROLES[role], **_content(msg.get("content"), where)}
        if role == "assistant" and msg.get("tool_calls"):
            canon["tool_calls"] = _tool_calls(msg["tool_calls"], where)
        if role == "tool":
            canon["tool_call_id"] = str(msg.get("tool_call_id") or "")
        out.append(canon)
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools")
    if tools is None:
        tools = [
            {"type": "function", "function": f} for f in body.get("functions") or [] if isinstance(f, dict)
        ]
    out = []
    for i, tool in enumerate(object_list(tools, "tools")):
        if tool.get("type", "function") != "function":
            continue
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise ProtocolError(f"tools[{i}].function must be an object with a 'name'")
        out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), f"tools[{i}]"))
    return out


def _finish_reason(completion: Completion) -> str:
    if completion.tool_calls:
        return "tool_calls"
    return "length" if completion.finish_reason == "length" else "stop"


def _usage(completion: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": completion.prompt_tokens + completion.completion_tokens,
    }


class _ChatStream:
    """Chat Completions SSE: `data: {chat.completion.chunk}` frames, then `data: [DONE]`."""

    def __init__(self, request: ChatRequest, response_id: str) -> None:
        self.request = request
        self.id = response_id
        self.created = now()
        self.streamed = ""
        self.thought = ""

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return data_frame(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.request.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
        )

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def text(self, delta: str) -> bytes:
        if not delta:
            return b""
        self.streamed += delta
        return self._chunk({"content": delta})

    def reasoning(self, delta: str) -> bytes:
        if not delta:
            return b""
        self.thought += delta
        return self._chunk({"reasoning_content": delta})

    def finish(self, completion: Completion) -> bytes:
        frames = [self.reasoning(text_remainder(self.thought, completion.reasoning))]
        rest = text_remainder(self.streamed, completion.text)
        if rest:
            frames.append(self.text(rest))
        for i, tc in enumerate(completion.tool_calls):
            call = {
                "index": i,
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments},
            }
            frames.append(self._chunk({"tool_calls": [call]}))
        frames.append(self._chunk({}, _finish_reason(completion)))
        if self.request.include_usage:
            frames.append(
                data_frame(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.request.model,
                        "choices": [],
                        "usage": _usage(completion),
                    }
                )
            )
        frames.append(DONE)
        return b"".join(frames)

    def error(self, kind: str, message: str) -> bytes:
        return data_frame(openai_error(kind, message)) + DONE


class OpenAIChat:
    """OpenAI Chat Completions."""

    api: Api = "chat"

    def parse_request(
        self, body: Any, *, model: str | None = None, stream: bool | None = None
    ) -> ChatRequest:
        body = require_dict(body)
        opts = body.get("stream_options")
        tool_choice = body.get("tool_choice")
        if tool_choice is None and body.get("function_call") is not None:
            fc = body["function_call"]
            tool_choice = (
                {"type": "function", "function": {"name": fc.get("name")}} if isinstance(fc, dict) else fc
            )
        single_choice(body, "n")
        refuse_logprobs(body, "logprobs", "top_logprobs")
        request = ChatRequest(
            api="chat",
            model=model_name(body, model),
            messages=parse_messages(body.get("messages")),
            tools=_tools(body),
            stream=stream_flag(body, stream),
            max_tokens=opt_int(body, "max_completion_tokens", "max_tokens"),
            temperature=opt_float(body, "temperature"),
            top_p=opt_float(body, "top_p"),
            stop=stop_list(body.get("stop"), "stop"),
            tool_choice=tool_choice,
            include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        )
        limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        return check_sampling(request, FieldNames(max_tokens=limit))

    def render_response(
        self, request: ChatRequest, completion: Completion, response_id: str
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": completion.text if completion.text or not completion.tool_calls else None,
            "refusal": None,
        }
        if completion.reasoning:
            message["reasoning_content"] = completion.reasoning
        if completion.tool_calls:
            message["tool_calls"] = [tool_call(tc.id, tc.name, tc.arguments) for tc in completion.tool_calls]
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": now(),
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _finish_reason(completion),
                }
            ],
            "usage": _usage(completion),
        }

    def stream_renderer(self, request: ChatRequest, response_id: str) -> _ChatStream:
        return _ChatStream(request, response_id)

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return openai_error(kind, message)

    def answer_message(self, response: dict[str, Any]) -> dict[str, Any]:
        """The assistant message a recorded response carried, in canonical form (see `answer_from`)."""
        message = {**(response.get("choices") or [{}])[0].get("message", {}), "role": "assistant"}
        return answer_from(self, {"model": "recorded", "messages": [message]})


protocol = OpenAIChat()
