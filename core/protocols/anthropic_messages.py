"""Anthropic Messages (`/v1/messages`, what Claude Code speaks), streaming and not.

Our own translator, not LiteLLM's: importing LiteLLM costs seconds and ~200 MB, and the proxy must stay fast.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any

from core.chat import Api, ChatRequest, Completion, Piece, content_fields
from core.errors import ProtocolError
from core.protocols.base import answer_from
from core.protocols.checks import FieldNames, check_sampling, stream_flag
from core.protocols.images import part_image
from core.protocols.sse import (
    args_json,
    dump_args,
    event_frame,
    function_tool,
    load_args,
    model_name,
    object_list,
    opt_float,
    opt_int,
    require_dict,
    stop_list,
    text_remainder,
    tool_call,
)

log = logging.getLogger(__name__)

_ROLES = ("user", "assistant", "system")
_PLACEHOLDERS = {"image": "[image]", "document": "[document]", "search_result": "[search result]"}
_IGNORED = ("thinking", "redacted_thinking")

_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "method_not_allowed": "invalid_request_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "overloaded": "overloaded_error",
    "timeout": "timeout_error",
}


def anthropic_error(kind: str, message: str) -> dict[str, Any]:
    """The Anthropic `{"type": "error", "error": {...}}` object."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(kind, "api_error"), "message": message}}


def _block_piece(block: dict[str, Any], where: str) -> Piece | None:
    """A text-like block's text, an image block's image; None for blocks that carry neither."""
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise ProtocolError(f"{where}.text must be a string")
        return text
    image = part_image(block, "messages", where)
    if image is not None:
        return image
    if kind in _PLACEHOLDERS:
        return _PLACEHOLDERS[kind]
    if kind not in _IGNORED:
        log.debug("ignoring %s block of type %r", where, kind)
    return None


def _blocks(content: Any, where: str) -> list[Piece]:
    """A string or a list of blocks (system prompt, tool_result content) as its pieces."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ProtocolError(f"{where} must be a string or a list of content blocks")
    pieces: list[Piece] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise ProtocolError(f"{where}[{i}] must be an object with a 'type'")
        piece = _block_piece(block, f"{where}[{i}]")
        if piece is not None:
            pieces.append(piece)
    return pieces


def _blocks_text(content: Any, where: str) -> str:
    """A string or a list of blocks as one string (the system prompt: images there are placeholders)."""
    return content_fields(_blocks(content, where))["content"]


def _message(msg: Any, where: str) -> list[dict[str, Any]]:
    """One Messages turn as canonical messages (tool results become `tool` messages before the text)."""
    if not isinstance(msg, dict):
        raise ProtocolError(f"{where} must be an object")
    role = msg.get("role")
    if role not in _ROLES:
        raise ProtocolError(f"{where}.role must be one of {list(_ROLES)}, got {role!r}")
    content = msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ProtocolError(f"{where}.content must be a string or a list of content blocks")
    texts: list[Piece] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        bwhere = f"{where}.content[{i}]"
        if not isinstance(block, dict):
            raise ProtocolError(f"{bwhere} must be an object with a 'type'")
        kind = block.get("type")
        if kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                raise ProtocolError(f"{bwhere}.name must be a non-empty string")
            args = block.get("input")
            calls.append(
                tool_call(
                    str(block.get("id") or f"toolu_{i}"), name, dump_args(args if args is not None else {}, f"{bwhere}.input")
                )
            )
        elif kind == "tool_result":
            pieces = _blocks(block.get("content"), f"{bwhere}.content")
            if block.get("is_error"):
                pieces = _error_pieces(pieces)
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), **content_fields(pieces)})
        else:
            piece = _block_piece(block, bwhere)
            if piece is not None:
                texts.append(piece)
    out = list(results)
    if calls:
        out.append({"role": role, **content_fields(texts), "tool_calls": calls})
    elif texts or not results:
        out.append({"role": role, **content_fields(texts)})
    return out


def _error_pieces(pieces: list[Piece]) -> list[Piece]:
    """A failed tool result's pieces, its text starting with "Error: " as the text-only form always did."""
    if pieces and isinstance(pieces[0], str):
        return [f"Error: {pieces[0]}", *pieces[1:]]
    return ["Error: ", *pieces]


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(object_list(tools, "tools")):
        if tool.get("type") not in (None, "custom") and "input_schema" not in tool:
            continue  # server tools (web_search, bash_2025..., text_editor...) run on Anthropic's side
        out.append(
            function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), f"tools[{i}]")
        )
    return out


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind, choice)


def thinking_signature(thinking: str) -> str:
    """A thinking block's `signature`: clients send it back with the block; here it only names the text
    (the proxy reads no reasoning from a history: the sampled ids hold it)."""
    return base64.b64encode(hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).digest()).decode()


def _stop_reason(completion: Completion) -> str:
    if completion.tool_calls:
        return "tool_use"
    if completion.finish_reason == "length" and not completion.truncated_by_proxy:
        return "max_tokens"
    return "end_turn"


def _message_shell(request: ChatRequest, response_id: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": int(request.extra.get("prompt_tokens") or 0),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        },
    }


class _MessagesStream:
    """Messages SSE: message_start, content blocks (thinking, text, tool_use), message_delta, message_stop."""

    def __init__(self, request: ChatRequest, response_id: str) -> None:
        self.request = request
        self.id = response_id
        self.streamed = ""
        self.thought = ""
        self.index = 0  # the open block's index, or the next block's when none is open
        self.open: str | None = None  # "thinking" or "text"

    def start(self) -> bytes:
        return event_frame(
            "message_start", {"type": "message_start", "message": _message_shell(self.request, self.id)}
        ) + event_frame("ping", {"type": "ping"})

    def _block(self, kind: str) -> bytes:
        """Close the open block and start one of `kind`."""
        head = self._close()
        self.open = kind
        block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {"type": "text", "text": ""}
        return head + event_frame(
            "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event_frame("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _close(self) -> bytes:
        """Stop the open block (a thinking block gets its signature first)."""
        if self.open is None:
            return b""
        head = self._delta({"type": "signature_delta", "signature": thinking_signature(self.thought)}) if self.open == "thinking" else b""
        frame = event_frame("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.open, self.index = None, self.index + 1
        return head + frame

    def reasoning(self, delta: str) -> bytes:
        if not delta:
            return b""
        head = b"" if self.open == "thinking" else self._block("thinking")
        self.thought += delta
        return head + self._delta({"type": "thinking_delta", "thinking": delta})

    def text(self, delta: str) -> bytes:
        if not delta:
            return b""
        head = b"" if self.open == "text" else self._block("text")
        self.streamed += delta
        return head + self._delta({"type": "text_delta", "text": delta})

    def finish(self, completion: Completion) -> bytes:
        frames = [self.reasoning(text_remainder(self.thought, completion.reasoning)), self.text(text_remainder(self.streamed, completion.text)), self._close()]
        for tc in completion.tool_calls:
            block = {"type": "tool_use", "id": tc.id, "name": tc.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": args_json(tc.arguments)}
            frames.append(
                event_frame(
                    "content_block_start",
                    {"type": "content_block_start", "index": self.index, "content_block": block},
                )
            )
            frames.append(self._delta(delta))
            frames.append(event_frame("content_block_stop", {"type": "content_block_stop", "index": self.index}))
            self.index += 1
        usage = {"input_tokens": completion.prompt_tokens, "output_tokens": completion.completion_tokens}
        frames.append(
            event_frame(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _stop_reason(completion), "stop_sequence": None},
                    "usage": usage,
                },
            )
        )
        frames.append(event_frame("message_stop", {"type": "message_stop"}))
        return b"".join(frames)

    def error(self, kind: str, message: str) -> bytes:
        return event_frame("error", anthropic_error(kind, message))


class AnthropicMessages:
    """Anthropic Messages."""

    api: Api = "messages"

    def parse_request(
        self, body: Any, *, model: str | None = None, stream: bool | None = None
    ) -> ChatRequest:
        body = require_dict(body)
        messages_in = body.get("messages")
        if not isinstance(messages_in, list) or not messages_in:
            raise ProtocolError("'messages' is required and must be a non-empty list")
        messages: list[dict[str, Any]] = []
        system = _blocks_text(body.get("system"), "system")
        if system:
            messages.append({"role": "system", "content": system})
        for i, msg in enumerate(messages_in):
            messages.extend(_message(msg, f"messages[{i}]"))
        request = ChatRequest(
            api="messages",
            model=model_name(body, model),
            messages=messages,
            tools=_tools(body.get("tools")),
            stream=stream_flag(body, stream),
            max_tokens=opt_int(body, "max_tokens"),
            temperature=opt_float(body, "temperature"),
            top_p=opt_float(body, "top_p"),
            stop=stop_list(body.get("stop_sequences"), "stop_sequences"),
            tool_choice=_tool_choice(body.get("tool_choice")),
        )
        return check_sampling(request, FieldNames())

    def render_response(
        self, request: ChatRequest, completion: Completion, response_id: str
    ) -> dict[str, Any]:
        msg = _message_shell(request, response_id)
        if completion.reasoning:
            msg["content"].append({"type": "thinking", "thinking": completion.reasoning, "signature": thinking_signature(completion.reasoning)})
        if completion.text:
            msg["content"].append({"type": "text", "text": completion.text})
        for tc in completion.tool_calls:
            msg["content"].append(
                {"type": "tool_use", "id": tc.id, "name": tc.name, "input": load_args(tc.arguments)}
            )
        msg["stop_reason"] = _stop_reason(completion)
        msg["usage"]["input_tokens"] = completion.prompt_tokens
        msg["usage"]["output_tokens"] = completion.completion_tokens
        return msg

    def stream_renderer(self, request: ChatRequest, response_id: str) -> _MessagesStream:
        return _MessagesStream(request, response_id)

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return anthropic_error(kind, message)

    def answer_message(self, response: dict[str, Any]) -> dict[str, Any]:
        """The assistant message a recorded response carried, in canonical form (see `answer_from`)."""
        turn = {"role": "assistant", "content": response.get("content") or ""}
        return answer_from(self, {"model": "recorded", "max_tokens": 1, "messages": [turn]})


protocol = AnthropicMessages()
