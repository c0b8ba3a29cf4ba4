"""Gemini API (`/v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`).

Our own translator, not LiteLLM's: importing LiteLLM costs seconds and ~200 MB, and the proxy must stay fast.
Both camelCase and snake_case field names are accepted, as the REST API does.
"""

from __future__ import annotations

import logging
from typing import Any

from core.chat import Api, ChatRequest, Completion, Piece, content_fields
from core.errors import ProtocolError, status_of
from core.protocols.base import answer_from
from core.protocols.checks import FieldNames, check_depth, check_offered, check_sampling, refuse_logprobs
from core.protocols.images import part_image
from core.protocols.sse import (
    data_frame,
    dump_args,
    function_tool,
    load_args,
    object_list,
    stop_list,
    text_remainder,
    tool_call,
)

log = logging.getLogger(__name__)

EOL = b"\r\n\r\n"  # the real API ends each SSE event with CRLF CRLF; every Gemini SDK accepts it

_ROLES = {"user": "user", "model": "assistant", "function": "tool", "tool": "tool"}
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def gemini_error(kind: str, message: str) -> dict[str, Any]:
    """The Google `{"error": {code, message, status}}` object for an error kind."""
    status = status_of(kind)
    return {"error": {"code": status, "message": message, "status": _STATUS_NAMES.get(status, "UNKNOWN")}}


def _get(d: dict[str, Any], camel: str, snake: str) -> Any:
    value = d.get(camel)
    return d.get(snake) if value is None else value


def _lower_types(schema: Any) -> Any:
    """OpenAPI-style Gemini schemas (`"type": "OBJECT"`) as JSON Schema (`"type": "object"`)."""
    if isinstance(schema, dict):
        return {
            k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v))
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, dict):
        raise ProtocolError(f"{where} must be an object with 'parts'")
    parts = content.get("parts")
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise ProtocolError(f"{where}.parts must be a list")
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise ProtocolError(f"{where}.parts[{i}] must be an object")
    return parts


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    texts = [p["text"] for p in _parts(system, "systemInstruction") if isinstance(p.get("text"), str)]
    return "\n".join(texts)


class _CallIds:
    """Gives function calls ids and matches each functionResponse to its call (by id, else by name, in order)."""

    def __init__(self) -> None:
        self.count = 0
        self.pending: list[tuple[str, str]] = []

    def call(self, name: str, given: Any) -> str:
        call_id = given if isinstance(given, str) and given else f"call_{self.count}"
        self.count += 1
        self.pending.append((call_id, name))
        return call_id

    def response(self, name: str, given: Any) -> str:
        for key in (0, 1):  # first by id, then by name
            for j, (call_id, call_name) in enumerate(self.pending):
                if (key == 0 and call_id == given) or (key == 1 and call_name == name):
                    del self.pending[j]
                    return call_id
        if isinstance(given, str) and given:
            return given
        self.count += 1
        return f"call_{self.count - 1}"


def parse_contents(system: Any, contents: Any) -> list[dict[str, Any]]:
    """`systemInstruction` + `contents` as canonical chat messages."""
    if not isinstance(contents, list) or not contents:
        raise ProtocolError("'contents' is required and must be a non-empty list")
    messages: list[dict[str, Any]] = []
    system_text = _system_text(system)
    if system_text:
        messages.append({"role": "system", "content": system_text})
    ids = _CallIds()
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        parts = _parts(content, where)
        role = content.get("role") or "user"
        if role not in _ROLES:
            raise ProtocolError(f"{where}.role must be 'user', 'model' or 'function', got {role!r}")
        texts: list[Piece] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for j, part in enumerate(parts):
            pwhere = f"{where}.parts[{j}]"
            call = _get(part, "functionCall", "function_call")
            response = _get(part, "functionResponse", "function_response")
            if part.get("thought"):
                continue
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif call is not None:
                if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                    raise ProtocolError(f"{pwhere}.functionCall must have a string 'name'")
                args = call.get("args")
                calls.append(
                    tool_call(ids.call(call["name"], call.get("id")), call["name"], dump_args(args or {}, f"{pwhere}.functionCall.args"))
                )
            elif response is not None:
                if not isinstance(response, dict) or not isinstance(response.get("name"), str):
                    raise ProtocolError(f"{pwhere}.functionResponse must have a string 'name'")
                call_id = ids.response(response["name"], response.get("id"))
                results.append(
                    {
                        "role": "tool",
                        "tool_call_id": call_id,
                        "content": dump_args(response.get("response") or {}, f"{pwhere}.functionResponse.response"),
                    }
                )
            elif _get(part, "inlineData", "inline_data") is not None:
                texts.append(part_image(part, "gemini", pwhere) or "[file]")
            elif _get(part, "fileData", "file_data") is not None:
                texts.append("[file]")
            else:
                log.debug("ignoring %s with keys %s", pwhere, sorted(part))
        chat_role = _ROLES[role]
        messages.extend(results)
        if chat_role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", **content_fields(texts)}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
        elif texts or (not results and chat_role == "user"):
            messages.append({"role": "user", **content_fields(texts)})
    return messages


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(object_list(tools, "tools")):
        decls = _get(tool, "functionDeclarations", "function_declarations")
        if decls is None:
            continue  # googleSearch, codeExecution, urlContext, ...
        if not isinstance(decls, list):
            raise ProtocolError(f"tools[{i}].functionDeclarations must be a list")
        for j, decl in enumerate(decls):
            where = f"tools[{i}].functionDeclarations[{j}]"
            if not isinstance(decl, dict):
                raise ProtocolError(f"{where} must be an object")
            params = _get(decl, "parametersJsonSchema", "parameters_json_schema")
            if params is None:
                check_depth(decl.get("parameters"), f"{where}.parameters")  # before lowering it recursively
                params = _lower_types(decl.get("parameters"))
            out.append(function_tool(decl.get("name"), decl.get("description"), params, where))
    return out


def _tool_choice(config: Any) -> Any:
    if not isinstance(config, dict):
        return None
    fcc = _get(config, "functionCallingConfig", "function_calling_config")
    if not isinstance(fcc, dict):
        return None
    mode = str(fcc.get("mode") or "AUTO").upper()
    names = _get(fcc, "allowedFunctionNames", "allowed_function_names") or []
    if mode == "ANY" and isinstance(names, list) and len(names) == 1:
        return {"type": "function", "function": {"name": names[0]}}
    return {"AUTO": "auto", "ANY": "required", "NONE": "none"}.get(mode, "auto")


def _allowed_names(config: Any) -> list[Any]:
    """`allowedFunctionNames` of a tool config (empty when it has none)."""
    fcc = _get(config, "functionCallingConfig", "function_calling_config") if isinstance(config, dict) else None
    names = _get(fcc, "allowedFunctionNames", "allowed_function_names") if isinstance(fcc, dict) else None
    if names is None:
        return []
    if not isinstance(names, list):
        raise ProtocolError("toolConfig.functionCallingConfig.allowedFunctionNames must be a list of names")
    return names


def _number(config: dict[str, Any], camel: str, snake: str, kind: type) -> Any:
    value = _get(config, camel, snake)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"generationConfig.{camel} must be a number, got {value!r}")
    return kind(value)


def _usage(completion: Completion) -> dict[str, int]:
    return {
        "promptTokenCount": completion.prompt_tokens,
        "candidatesTokenCount": completion.completion_tokens,
        "totalTokenCount": completion.prompt_tokens + completion.completion_tokens,
    }


def _call_parts(completion: Completion) -> list[dict[str, Any]]:
    return [
        {"functionCall": {"id": tc.id, "name": tc.name, "args": load_args(tc.arguments)}}
        for tc in completion.tool_calls
    ]


def _finish_reason(completion: Completion) -> str:
    return "MAX_TOKENS" if completion.finish_reason == "length" and not completion.tool_calls else "STOP"


class _GeminiStream:
    """`alt=sse`: one `data: <GenerateContentResponse>` event per chunk; the last has finishReason and usage."""

    def __init__(self, request: ChatRequest, response_id: str) -> None:
        self.request = request
        self.id = response_id
        self.streamed = ""
        self.thought = ""

    def _frame(
        self, parts: list[dict[str, Any]], finish: str | None = None, usage: dict[str, int] | None = None
    ) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        resp: dict[str, Any] = {"candidates": [candidate]}
        if usage:
            resp["usageMetadata"] = usage
        resp["modelVersion"] = self.request.model
        resp["responseId"] = self.id
        return data_frame(resp, EOL)

    def start(self) -> bytes:
        return b""

    def text(self, delta: str) -> bytes:
        if not delta:
            return b""
        self.streamed += delta
        return self._frame([{"text": delta}])

    def reasoning(self, delta: str) -> bytes:
        if not delta:
            return b""
        self.thought += delta
        return self._frame([{"text": delta, "thought": True}])

    def finish(self, completion: Completion) -> bytes:
        thought = text_remainder(self.thought, completion.reasoning)
        rest = text_remainder(self.streamed, completion.text)
        parts = ([{"text": thought, "thought": True}] if thought else []) + ([{"text": rest}] if rest else []) + _call_parts(completion)
        if not parts:
            parts = [{"text": ""}]
        return self._frame(parts, _finish_reason(completion), _usage(completion))

    def error(self, kind: str, message: str) -> bytes:
        return data_frame(gemini_error(kind, message), EOL)


class Gemini:
    """Gemini generateContent / streamGenerateContent."""

    api: Api = "gemini"

    def parse_request(
        self, body: Any, *, model: str | None = None, stream: bool | None = None
    ) -> ChatRequest:
        if not isinstance(body, dict):
            raise ProtocolError(f"request body must be a JSON object, got {type(body).__name__}")
        config = _get(body, "generationConfig", "generation_config")
        config = {} if config is None else config
        if not isinstance(config, dict):
            raise ProtocolError("'generationConfig' must be an object")
        if model is None:
            model = body.get("model") if isinstance(body.get("model"), str) else ""
        refuse_logprobs(config, "responseLogprobs", "response_logprobs", "logprobs", where="generationConfig.")
        count = _get(config, "candidateCount", "candidate_count")
        if count is not None and count != 1:
            raise ProtocolError(f"generationConfig.candidateCount must be 1 (the proxy samples one candidate per call), got {count!r}")
        request = ChatRequest(
            api="gemini",
            model=model.removeprefix("models/"),
            messages=parse_contents(
                _get(body, "systemInstruction", "system_instruction"), body.get("contents")
            ),
            tools=_tools(body.get("tools")),
            stream=bool(stream),
            max_tokens=_number(config, "maxOutputTokens", "max_output_tokens", int),
            temperature=_number(config, "temperature", "temperature", float),
            top_p=_number(config, "topP", "top_p", float),
            stop=stop_list(_get(config, "stopSequences", "stop_sequences"), "generationConfig.stopSequences"),
            tool_choice=_tool_choice(_get(body, "toolConfig", "tool_config")),
        )
        check_offered(_allowed_names(_get(body, "toolConfig", "tool_config")), request.tools, "toolConfig.functionCallingConfig.allowedFunctionNames")
        names = FieldNames(max_tokens="generationConfig.maxOutputTokens", temperature="generationConfig.temperature", top_p="generationConfig.topP", tool_choice="toolConfig")
        return check_sampling(request, names)

    def render_response(
        self, request: ChatRequest, completion: Completion, response_id: str
    ) -> dict[str, Any]:
        thought = [{"text": completion.reasoning, "thought": True}] if completion.reasoning else []
        parts = thought + ([{"text": completion.text}] if completion.text else []) + _call_parts(completion)
        return {
            "candidates": [
                {
                    "content": {"role": "model", "parts": parts or [{"text": ""}]},
                    "finishReason": _finish_reason(completion),
                    "index": 0,
                }
            ],
            "usageMetadata": _usage(completion),
            "modelVersion": request.model,
            "responseId": response_id,
        }

    def stream_renderer(self, request: ChatRequest, response_id: str) -> _GeminiStream:
        return _GeminiStream(request, response_id)

    def error_body(self, kind: str, message: str) -> dict[str, Any]:
        return gemini_error(kind, message)

    def answer_message(self, response: dict[str, Any]) -> dict[str, Any]:
        """The assistant message a recorded response carried, in canonical form (see `answer_from`)."""
        content = ((response.get("candidates") or [{}])[0]).get("content") or {"role": "model", "parts": [{"text": ""}]}
        return answer_from(self, {"contents": [{**content, "role": "model"}]})


protocol = Gemini()
