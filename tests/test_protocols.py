"""Wire protocols: parsing real harness requests, rendering answers, and SSE frames the official SDKs accept."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from core.chat import ChatRequest, Completion, ImagePart, ToolCall
from core.errors import ProtocolError
from core.protocols.registry import get_protocol
from tests.conftest import HARNESS_REQUESTS  # noqa: E402
from tests.test_gui_images import b64, png

PNG = png()
PNG_PART = ImagePart(hashlib.sha256(PNG).hexdigest(), "image/png", PNG)

FIXTURES = HARNESS_REQUESTS
FIXTURE_API = {"codex": "responses", "claude-code": "messages", "gemini-cli": "gemini"}

chat = get_protocol("chat")
responses = get_protocol("responses")
messages = get_protocol("messages")
gemini = get_protocol("gemini")


def fixture_bodies(name: str) -> list[dict[str, Any]]:
    path = FIXTURES / f"{name}.jsonl"
    if not path.exists():
        pytest.skip(f"fixture {path} not present")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["body"] for r in rows if isinstance(r.get("body"), dict)]


def parse_fixture(name: str) -> list[ChatRequest]:
    api = FIXTURE_API.get(name, "chat")
    if api == "gemini":
        return [gemini.parse_request(b, model="mock-model", stream=True) for b in fixture_bodies(name)]
    return [get_protocol(api).parse_request(b) for b in fixture_bodies(name)]


# ---------------------------------------------------------------- fixtures from real harnesses


def test_codex_fixture_parses() -> None:
    (req,) = parse_fixture("codex")
    assert req.api == "responses" and req.stream and req.model == "mock-model"
    assert [m["role"] for m in req.messages] == ["system", "system", "user", "user"]
    assert req.messages[0]["content"].startswith("You are a coding agent running in the Codex CLI")
    assert req.messages[-1]["content"] == "Say hi"
    assert (
        "<skills_instructions>" in req.messages[1]["content"]
        and "\n<permissions" in req.messages[1]["content"]
    )
    names = [t["function"]["name"] for t in req.tools]
    assert len(names) >= 4 and "exec_command" in names
    assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in req.tools)
    assert req.tool_choice == "auto" and req.max_tokens is None


def test_claude_code_fixture_parses() -> None:
    (req,) = parse_fixture("claude-code")
    assert req.api == "messages" and req.stream and req.max_tokens == 32000
    assert req.messages[0]["role"] == "system"
    assert "You are a Claude agent" in req.messages[0]["content"]
    assert [m["role"] for m in req.messages[1:]] == ["user", "system"]
    assert req.messages[1]["content"].endswith("Say hi")
    assert all(isinstance(m["content"], str) for m in req.messages)
    names = {t["function"]["name"] for t in req.tools}
    assert {"Bash", "Agent"} <= names
    bash = next(t for t in req.tools if t["function"]["name"] == "Bash")
    assert bash["function"]["parameters"]["required"] == ["command"]


def test_gemini_cli_fixture_parses() -> None:
    (req,) = parse_fixture("gemini-cli")
    body = fixture_bodies("gemini-cli")[0]
    declared = [d["name"] for t in body["tools"] for d in t.get("functionDeclarations", [])]
    assert [t["function"]["name"] for t in req.tools] == declared
    read_file = next(t for t in req.tools if t["function"]["name"] == "read_file")
    assert read_file["function"]["parameters"]["required"] == ["file_path"]
    assert [m["role"] for m in req.messages] == ["system", "user"]
    assert req.messages[0]["content"].startswith("You are Gemini CLI")
    assert req.messages[1]["content"].endswith("Say hi")
    assert req.temperature == 1.0 and req.top_p == 0.95 and req.model == "mock-model" and req.stream


@pytest.mark.parametrize("name", ["mini-swe-agent", "openclaw-chat", "opencode", "pi"])
def test_chat_fixtures_parse(name: str) -> None:
    for body, req in zip(fixture_bodies(name), parse_fixture(name), strict=True):
        assert req.api == "chat"
        assert req.messages[0]["role"] == "system" and req.messages[-1]["role"] == "user"
        assert all(isinstance(m["content"], str) for m in req.messages)
        assert len(req.tools) == len([t for t in body.get("tools", []) if t.get("type") == "function"])
        assert req.stream == bool(body.get("stream"))
        assert req.include_usage == bool((body.get("stream_options") or {}).get("include_usage"))
        assert req.max_tokens == body.get("max_completion_tokens", body.get("max_tokens"))


# ---------------------------------------------------------------- multi-turn tool round trips

EXPECTED_TOOL_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "List files"},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"dir": "."}'}},
            {"id": "c2", "type": "function", "function": {"name": "pwd", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    {"role": "tool", "tool_call_id": "c2", "content": "/w"},
    {"role": "user", "content": "Thanks"},
]


def test_chat_tool_round_trip() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "List files"},
            {"role": "assistant", "content": "Looking.", "tool_calls": EXPECTED_TOOL_TURN[2]["tool_calls"]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
            {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "/w"}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Thanks"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(PNG)}"}}],
            },
        ],
        "tools": [
            {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
            {"type": "custom", "custom": {"name": "x"}},
        ],
        "stop": "END",
    }
    req = chat.parse_request(body)
    assert req.messages[:5] == EXPECTED_TOOL_TURN[:5]
    # the text form keeps a placeholder; `parts` carries the image itself, for backends that take images
    assert req.messages[5] == {"role": "user", "content": "Thanks\n[image]", "parts": ["Thanks", PNG_PART]}
    assert [t["function"]["name"] for t in req.tools] == ["ls"] and req.stop == ["END"]


def test_responses_tool_round_trip() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"type": "reasoning", "summary": [], "encrypted_content": "xx"},
            {"role": "user", "content": "List files"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Looking."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": '{"dir": "."}'},
            {"type": "function_call", "call_id": "c2", "name": "pwd", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "/w"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ],
        "tools": [
            {"type": "function", "name": "ls", "description": "list", "parameters": {"type": "object"}},
            {"type": "web_search"},
            {"type": "namespace", "name": "mcp"},
        ],
        "max_output_tokens": 77,
    }
    req = responses.parse_request(body)
    assert req.messages == EXPECTED_TOOL_TURN
    assert req.tools == [
        {
            "type": "function",
            "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}},
        }
    ]
    assert req.max_tokens == 77 and req.extra["instructions"] == "Be brief."


def test_responses_function_call_without_preceding_message_and_string_input() -> None:
    req = responses.parse_request(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "go"},
                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
                {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"},
            ],
        }
    )
    assert req.messages[1]["role"] == "assistant" and req.messages[1]["content"] == ""
    assert [c["id"] for c in req.messages[1]["tool_calls"]] == ["c1", "c2"]
    assert json.loads(req.messages[1]["tool_calls"][1]["function"]["arguments"]) == {"input": "*** Begin"}
    assert req.messages[2] == {"role": "tool", "tool_call_id": "c2", "content": "ok"}
    assert responses.parse_request({"model": "m", "input": "hi"}).messages == [
        {"role": "user", "content": "hi"}
    ]


def test_messages_tool_round_trip() -> None:
    body = {
        "model": "m",
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "List files"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "c1", "name": "ls", "input": {"dir": "."}},
                    {"type": "tool_use", "id": "c2", "name": "pwd", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "a.txt"},
                    {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": "/w"}]},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
        "tools": [
            {"name": "ls", "description": "list", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        ],
        "tool_choice": {"type": "any"},
        "stop_sequences": ["END"],
    }
    req = messages.parse_request(body)
    assert req.messages == EXPECTED_TOOL_TURN
    assert [t["function"]["name"] for t in req.tools] == ["ls"]
    assert req.tool_choice == "required" and req.stop == ["END"] and req.max_tokens is None


def test_messages_error_tool_result_and_image() -> None:
    req = messages.parse_request(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}, {"type": "text", "text": "what?"}],
                },
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "is_error": True, "content": "boom"}
                    ],
                },
            ],
        }
    )
    assert req.messages[0] == {"role": "user", "content": "[image]\nwhat?", "parts": [PNG_PART, "what?"]}
    assert req.messages[-1] == {"role": "tool", "tool_call_id": "t", "content": "Error: boom"}


def test_gemini_tool_round_trip_generates_matching_ids() -> None:
    body = {
        "systemInstruction": {"role": "user", "parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "List files"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "thinking...", "thought": True},
                    {"text": "Looking."},
                    {"functionCall": {"name": "ls", "args": {"dir": "."}}, "thoughtSignature": "zz"},
                    {"functionCall": {"name": "pwd", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "pwd", "response": {"output": "/w"}}},
                    {"functionResponse": {"name": "ls", "response": {"output": "a.txt"}}},
                ],
            },
            {"role": "user", "parts": [{"text": "Thanks"}]},
        ],
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "ls",
                        "parameters": {"type": "OBJECT", "properties": {"dir": {"type": "STRING"}}},
                    }
                ]
            },
            {"googleSearch": {}},
        ],
        "generationConfig": {
            "maxOutputTokens": 99,
            "stopSequences": ["END"],
            "topK": 3,
            "thinkingConfig": {},
        },
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
        "safetySettings": [{"category": "x", "threshold": "y"}],
    }
    req = gemini.parse_request(body, model="models/gem", stream=False)
    calls = req.messages[2]["tool_calls"]
    assert req.messages[2]["content"] == "Looking." and [c["function"]["name"] for c in calls] == [
        "ls",
        "pwd",
    ]
    ids = {c["function"]["name"]: c["id"] for c in calls}
    assert len(set(ids.values())) == 2
    assert req.messages[3] == {"role": "tool", "tool_call_id": ids["pwd"], "content": '{"output": "/w"}'}
    assert req.messages[4] == {"role": "tool", "tool_call_id": ids["ls"], "content": '{"output": "a.txt"}'}
    assert (
        req.messages[0] == {"role": "system", "content": "Be brief."}
        and req.messages[-1]["content"] == "Thanks"
    )
    assert req.tools[0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"dir": {"type": "string"}},
    }
    assert (
        len(req.tools) == 1 and req.max_tokens == 99 and req.stop == ["END"] and req.tool_choice == "required"
    )
    assert req.model == "gem" and req.stream is False


def test_gemini_response_id_matches_given_call_id() -> None:
    req = gemini.parse_request(
        {
            "contents": [
                {"role": "user", "parts": [{"text": "go"}]},
                {"role": "model", "parts": [{"functionCall": {"id": "abc", "name": "ls", "args": {}}}]},
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"id": "abc", "name": "ls", "response": {}}}],
                },
            ]
        },
        model="g",
    )
    assert req.messages[1]["tool_calls"][0]["id"] == "abc" and req.messages[2]["tool_call_id"] == "abc"


# ---------------------------------------------------------------- malformed and lenient


@pytest.mark.parametrize(
    ("api", "body", "needle"),
    [
        ("chat", [1, 2], "JSON object"),
        ("chat", {"model": "m"}, "'messages'"),
        ("chat", {"model": "m", "messages": "hi"}, "'messages'"),
        ("chat", {"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "'model'"),
        (
            "chat",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "a"},
            "max_tokens",
        ),
        ("responses", {"model": "m"}, "'input'"),
        ("responses", {"model": "m", "input": 3}, "'input'"),
        (
            "responses",
            {"model": "m", "input": [{"type": "message", "role": "bot", "content": "x"}]},
            "input[0].role",
        ),
        ("responses", {"model": "m", "input": [{"role": "user", "content": 7}]}, "input[0].content"),
        ("messages", {"model": "m", "messages": {}}, "'messages'"),
        ("messages", {"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ("messages", {"model": "m", "messages": [{"role": "user", "content": 1}]}, "messages[0].content"),
        (
            "messages",
            {"model": "m", "messages": [{"role": "user", "content": ["x"]}]},
            "messages[0].content[0]",
        ),
        ("gemini", {}, "'contents'"),
        ("gemini", {"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ("gemini", {"contents": [{"role": "user", "parts": "x"}]}, "contents[0].parts"),
    ],
)
def test_malformed_bodies_raise_protocol_error(api: str, body: Any, needle: str) -> None:
    with pytest.raises(ProtocolError) as err:
        get_protocol(api).parse_request(body, model="g" if api == "gemini" else None)
    assert needle in str(err.value)
    assert err.value.status == 400


def test_ignored_fields_are_accepted() -> None:
    req = chat.parse_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "reasoning_effort": "high",
            "metadata": {"a": 1},
            "store": False,
            "parallel_tool_calls": True,
            "service_tier": "auto",
            "prompt_cache_key": "k",
            "stream_options": {"include_usage": True, "include_obfuscation": False},
            "logit_bias": {},
        }
    )
    assert req.include_usage and req.messages == [{"role": "user", "content": "x"}]
    req = messages.parse_request(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}],
                }
            ],
            "thinking": {"type": "enabled", "budget_tokens": 10},
            "betas": ["x"],
            "context_management": {},
            "output_config": {"effort": "high"},
            "metadata": {"user_id": "u"},
            "top_k": 5,
        }
    )
    assert req.messages == [{"role": "user", "content": "x"}]
    req = responses.parse_request(
        {
            "model": "m",
            "input": "x",
            "reasoning": {"effort": "high"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "client_metadata": {},
            "text": {"verbosity": "low"},
        }
    )
    assert req.messages == [{"role": "user", "content": "x"}]


def test_unknown_protocol() -> None:
    with pytest.raises(ValueError, match="unknown wire protocol"):
        get_protocol("soap")


# ---------------------------------------------------------------- render_response

CALLS = [
    ToolCall(id="call_1", name="ls", arguments='{"dir": "."}'),
    ToolCall(id="call_2", name="pwd", arguments="{}"),
]


def completion(text: str = "Hello", calls: list[ToolCall] | None = None, **kw: Any) -> Completion:
    return Completion(text=text, tool_calls=list(calls or []), prompt_tokens=11, completion_tokens=5, **kw)


def req_for(api: str, **kw: Any) -> ChatRequest:
    return ChatRequest(api=api, model="policy", messages=[{"role": "user", "content": "hi"}], **kw)  # type: ignore[arg-type]


def test_render_chat() -> None:
    out = chat.render_response(
        req_for("chat"), completion("", CALLS, finish_reason="tool_calls"), "chatcmpl-1"
    )
    choice = out["choices"][0]
    assert out["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["ls", "pwd"]
    assert out["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    parsed = openai.types.chat.ChatCompletion.model_validate(out)
    assert parsed.choices[0].message.tool_calls[0].id == "call_1"
    plain = chat.render_response(req_for("chat"), completion(finish_reason="length"), "x")
    assert (
        plain["choices"][0]["message"]["content"] == "Hello"
        and plain["choices"][0]["finish_reason"] == "length"
    )


def test_render_responses() -> None:
    out = responses.render_response(req_for("responses"), completion("Hi", CALLS), "resp_1")
    assert out["object"] == "response" and out["status"] == "completed"
    assert [i["type"] for i in out["output"]] == ["message", "function_call", "function_call"]
    assert out["output"][0]["content"][0] == {
        "type": "output_text",
        "text": "Hi",
        "annotations": [],
        "logprobs": [],
    }
    assert out["output"][1]["call_id"] == "call_1" and out["output"][1]["arguments"] == '{"dir": "."}'
    assert out["usage"]["input_tokens"] == 11 and out["usage"]["total_tokens"] == 16
    parsed = openai.types.responses.Response.model_validate(out)
    assert parsed.output_text == "Hi"
    only_calls = responses.render_response(req_for("responses"), completion("", CALLS), "resp_1")
    assert [i["type"] for i in only_calls["output"]] == ["function_call", "function_call"]


def test_render_responses_incomplete_only_when_client_limit() -> None:
    asked = responses.render_response(req_for("responses"), completion(finish_reason="length"), "resp_1")
    assert asked["status"] == "incomplete" and asked["incomplete_details"] == {"reason": "max_output_tokens"}
    ours = responses.render_response(
        req_for("responses"), completion(finish_reason="length", truncated_by_proxy=True), "resp_1"
    )
    assert ours["status"] == "completed" and ours["incomplete_details"] is None


def test_render_messages() -> None:
    out = messages.render_response(req_for("messages"), completion("Hi", CALLS), "msg_1")
    assert out["type"] == "message" and out["stop_reason"] == "tool_use"
    assert out["content"][0] == {"type": "text", "text": "Hi"}
    assert out["content"][1] == {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"dir": "."}}
    assert out["usage"]["input_tokens"] == 11 and out["usage"]["output_tokens"] == 5
    anthropic.types.Message.model_validate(out)
    cut = messages.render_response(req_for("messages"), completion(finish_reason="length"), "msg_1")
    assert cut["stop_reason"] == "max_tokens"
    ours = messages.render_response(
        req_for("messages"), completion(finish_reason="length", truncated_by_proxy=True), "m"
    )
    assert ours["stop_reason"] == "end_turn"


def test_render_gemini() -> None:
    out = gemini.render_response(req_for("gemini"), completion("Hi", CALLS), "r1")
    cand = out["candidates"][0]
    assert cand["finishReason"] == "STOP" and cand["content"]["role"] == "model"
    assert cand["content"]["parts"][0] == {"text": "Hi"}
    assert cand["content"]["parts"][1]["functionCall"] == {"id": "call_1", "name": "ls", "args": {"dir": "."}}
    assert out["usageMetadata"] == {"promptTokenCount": 11, "candidatesTokenCount": 5, "totalTokenCount": 16}
    cut = gemini.render_response(req_for("gemini"), completion(finish_reason="length"), "r1")
    assert cut["candidates"][0]["finishReason"] == "MAX_TOKENS"


def test_error_bodies() -> None:
    assert chat.error_body("context_length", "too long") == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": None,
            "code": "context_length_exceeded",
        }
    }
    assert responses.error_body("authentication", "bad")["error"]["type"] == "authentication_error"
    assert messages.error_body("too_large", "big") == {
        "type": "error",
        "error": {"type": "request_too_large", "message": "big"},
    }
    assert messages.error_body("backend", "down")["error"]["type"] == "api_error"
    assert messages.error_body("authentication", "x")["error"]["type"] == "authentication_error"
    assert gemini.error_body("not_found", "nope") == {
        "error": {"code": 404, "message": "nope", "status": "NOT_FOUND"}
    }
    assert gemini.error_body("invalid_request", "x")["error"]["status"] == "INVALID_ARGUMENT"


# ---------------------------------------------------------------- streams, read back by the official SDKs


def stream_bytes(
    api: str,
    req: ChatRequest,
    deltas: list[str],
    done: Completion | None,
    error: tuple[str, str] | None = None,
) -> bytes:
    r = get_protocol(api).stream_renderer(
        req, {"chat": "chatcmpl-1", "responses": "resp_1"}.get(api, "msg_1")
    )
    out = r.start() + b"".join(r.text(d) for d in deltas)
    out += r.error(*error) if error else r.finish(done or Completion())
    return out


def sse_client(body: bytes) -> httpx2.Client:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def openai_client(body: bytes) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="k", base_url="http://127.0.0.1:9/v1", http_client=sse_client(body), max_retries=0
    )


def anthropic_client(body: bytes) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="k", base_url="http://127.0.0.1:9", http_client=sse_client(body), max_retries=0
    )


def test_chat_stream_with_openai_sdk() -> None:
    req = req_for("chat", stream=True, include_usage=True)
    body = stream_bytes("chat", req, ["Hel", "lo"], completion("Hello", CALLS, finish_reason="tool_calls"))
    assert body.endswith(b"data: [DONE]\n\n")
    with openai_client(body).chat.completions.stream(
        model="policy", messages=[{"role": "user", "content": "hi"}]
    ) as s:
        final = s.get_final_completion()
    choice = final.choices[0]
    assert choice.message.content == "Hello" and choice.finish_reason == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("call_1", "ls", '{"dir": "."}'),
        ("call_2", "pwd", "{}"),
    ]
    assert final.usage is not None and final.usage.total_tokens == 16


def test_chat_stream_text_not_streamed_is_sent_at_finish() -> None:
    body = stream_bytes("chat", req_for("chat"), [], completion("All at once"))
    chunks = list(openai_client(body).chat.completions.create(model="p", messages=[], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "All at once"


def test_chat_stream_error_makes_sdk_raise() -> None:
    body = stream_bytes("chat", req_for("chat"), ["par"], None, ("backend", "policy server down"))
    with pytest.raises(openai.APIError, match="policy server down"):
        list(openai_client(body).chat.completions.create(model="p", messages=[], stream=True))


def test_responses_stream_with_openai_sdk() -> None:
    body = stream_bytes("responses", req_for("responses"), ["Hel", "lo"], completion("Hello", CALLS))
    client = openai_client(body)
    with client.responses.stream(model="policy", input="hi") as s:
        events = [e.type for e in s]
        final = s.get_final_response()
    assert events[:2] == ["response.created", "response.in_progress"] and events[-1] == "response.completed"
    assert final.output_text == "Hello" and final.status == "completed"
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("call_1", "ls", '{"dir": "."}'),
        ("call_2", "pwd", "{}"),
    ]
    assert final.usage is not None and final.usage.output_tokens == 5
    seqs = [
        json.loads(line[6:])["sequence_number"]
        for line in body.decode().splitlines()
        if line.startswith("data: ")
    ]
    assert seqs == list(range(len(seqs)))


def test_responses_stream_only_tool_calls_and_empty_answer() -> None:
    body = stream_bytes("responses", req_for("responses"), [], completion("", CALLS[:1]))
    with openai_client(body).responses.stream(model="p", input="hi") as s:
        final = s.get_final_response()
    assert [o.type for o in final.output] == ["function_call"]
    body = stream_bytes("responses", req_for("responses"), [], completion(""))
    with openai_client(body).responses.stream(model="p", input="hi") as s:
        final = s.get_final_response()
    assert [o.type for o in final.output] == ["message"] and final.output_text == ""


def test_responses_stream_proxy_limit_is_completed() -> None:
    body = stream_bytes(
        "responses",
        req_for("responses"),
        ["x"],
        completion("x", finish_reason="length", truncated_by_proxy=True),
    )
    assert b"event: response.completed\n" in body and b"response.incomplete" not in body
    body = stream_bytes("responses", req_for("responses"), ["x"], completion("x", finish_reason="length"))
    assert b"event: response.incomplete\n" in body


def test_responses_stream_error_makes_sdk_raise() -> None:
    body = stream_bytes(
        "responses", req_for("responses"), ["par"], None, ("context_length", "prompt is too long")
    )
    assert b"event: response.failed\n" in body
    failed = [json.loads(line[6:]) for line in body.decode().splitlines() if '"response.failed"' in line]
    assert failed[0]["response"]["status"] == "failed"
    assert failed[0]["response"]["error"] == {
        "code": "context_length_exceeded",
        "message": "prompt is too long",
    }
    with pytest.raises(openai.APIError, match="prompt is too long"):
        list(openai_client(body).responses.create(model="p", input="hi", stream=True))


def test_messages_stream_with_anthropic_sdk() -> None:
    req = req_for("messages", extra={"prompt_tokens": 11})
    body = stream_bytes("messages", req, ["Hel", "lo"], completion("Hello", CALLS))
    with anthropic_client(body).messages.stream(
        model="policy", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        texts = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(texts) == "Hello" and final.stop_reason == "tool_use"
    assert final.content[0].type == "text" and final.content[0].text == "Hello"
    tools = [(b.id, b.name, b.input) for b in final.content if b.type == "tool_use"]
    assert tools == [("call_1", "ls", {"dir": "."}), ("call_2", "pwd", {})]
    assert final.usage.input_tokens == 11 and final.usage.output_tokens == 5


def test_messages_stream_bad_arguments_still_parse() -> None:
    body = stream_bytes("messages", req_for("messages"), [], completion("", [ToolCall("t", "x", "not json")]))
    with anthropic_client(body).messages.stream(model="p", max_tokens=10, messages=[]) as s:
        final = s.get_final_message()
    assert final.content[0].input == {"raw_arguments": "not json"}


def test_messages_stream_error_makes_sdk_raise() -> None:
    body = stream_bytes("messages", req_for("messages"), ["par"], None, ("overloaded", "busy"))
    with pytest.raises(anthropic.APIStatusError, match="busy") as err:
        with anthropic_client(body).messages.stream(model="p", max_tokens=10, messages=[]) as s:
            list(s)
    assert err.value.body["error"]["type"] == "overloaded_error"


def gemini_events(body: bytes) -> list[dict[str, Any]]:
    """Split like @google/genai's processStreamResponse: events end at \\n\\n, \\r\\r or \\r\\n\\r\\n."""
    text, events = body.decode(), []
    while True:
        found = [(text.find(d), d) for d in ("\n\n", "\r\r", "\r\n\r\n") if text.find(d) != -1]
        if not found:
            break
        idx, delim = min(found)
        event, text = text[:idx].strip(), text[idx + len(delim) :]
        assert event.startswith("data:")
        events.append(json.loads(event[5:].strip()))
    assert text.strip() == ""
    return events


def test_gemini_stream_frames() -> None:
    body = stream_bytes("gemini", req_for("gemini"), ["Hel", "lo"], completion("Hello", CALLS))
    assert body.startswith(b"data: {") and body.endswith(b"}\r\n\r\n")
    events = gemini_events(body)
    text = "".join(p.get("text", "") for e in events for p in e["candidates"][0]["content"]["parts"])
    assert text == "Hello"
    last = events[-1]
    assert (
        last["candidates"][0]["finishReason"] == "STOP" and "finishReason" not in events[0]["candidates"][0]
    )
    assert [p["functionCall"]["name"] for p in last["candidates"][0]["content"]["parts"]] == ["ls", "pwd"]
    assert last["usageMetadata"]["totalTokenCount"] == 16
    err = gemini_events(stream_bytes("gemini", req_for("gemini"), [], None, ("backend", "down")))
    assert err == [{"error": {"code": 502, "message": "down", "status": "UNAVAILABLE"}}]


def test_codex_namespace_tools_are_flat_for_the_policy_and_namespaced_again_for_codex() -> None:
    """Codex sends an MCP server's tools as one `namespace` tool and runs only calls that name the namespace."""
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "look"},
            {"type": "function_call", "call_id": "c0", "namespace": "mcp__gui", "name": "observe", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c0", "output": "a button"},
        ],
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "mcp__gui", "tools": [
                {"type": "function", "name": "observe", "description": "Look", "parameters": {"type": "object"}},
                {"type": "function", "name": "click", "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}}},
            ]},
        ],
    }  # fmt: skip
    req = responses.parse_request(body)
    assert [t["function"]["name"] for t in req.tools] == ["shell", "mcp__gui__observe", "mcp__gui__click"]
    assert req.messages[1]["tool_calls"][0]["function"]["name"] == "mcp__gui__observe"  # history: the same flat name
    done = completion("", [ToolCall(id="c1", name="mcp__gui__click", arguments='{"id": 4}'), ToolCall(id="c2", name="shell", arguments="{}")])
    items = [i for i in responses.render_response(req, done, "resp_1")["output"] if i["type"] == "function_call"]
    assert [(i.get("namespace"), i["name"]) for i in items] == [("mcp__gui", "click"), (None, "shell")]
    streamed = [json.loads(line[6:]) for line in stream_bytes("responses", req, [], done).decode().splitlines() if line.startswith("data: ")]
    finished = [e["item"] for e in streamed if e.get("type") == "response.output_item.done" and e["item"]["type"] == "function_call"]
    assert [(i.get("namespace"), i["name"]) for i in finished] == [("mcp__gui", "click"), (None, "shell")]
