"""The native passthrough (`litellm:openai/...?api_base=`) against a loopback fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import orjson
import pytest

from core.backends.base import GenerationContext
from core.backends.litellm_backend import LiteLLMBackend
from core.backends.openai_compat import OpenAICompatBackend
from core.chat import ChatRequest, Finished, TextDelta
from core.errors import BackendError, ContextLengthError
from core.serving import read_body

CHAT = "/v1/chat/completions"
PIECES = ["Hel", "lo, ", "world", "!"]
TOOL_ARGS = ['{"comm', 'and": "ls', ' -la"}']
PROMPT_IDS = [1, 2, 3, 4, 5]
TOKEN_IDS = [[11], [12, 13], [14], [15]]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]


def _chunk(choice: dict[str, Any], **extra: Any) -> bytes:
    event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "fake", "choices": [choice], **extra}
    return b"data: " + orjson.dumps(event) + b"\n\n"


class FakeOpenAI:
    """A raw ASGI OpenAI-compatible server; the last user message picks the behaviour (text, tools, ids, bad, long, die)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(scope, receive, 1 << 30)
        req = orjson.loads(body)
        self.requests.append(req)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        mode = req["messages"][-1]["content"]
        if scope["path"] != CHAT:
            await self._send(send, 404, b'{"error": {"message": "no such route"}}')
            return
        if mode == "bad":
            await self._send(send, 400, b'{"error": {"message": "temperature must be at most 2", "type": "BadRequestError"}}')
            return
        if mode == "long":  # vLLM's wording
            message = b"This model's maximum context length is 2048 tokens. However, you requested 4100 tokens in the messages."
            await self._send(send, 400, b'{"error": {"message": "' + message + b'", "type": "BadRequestError", "code": 400}}')
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for frame in self._frames(mode, req):
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            if mode == "die":
                await asyncio.sleep(0.01)
        if mode == "die":
            raise RuntimeError("the inference server died")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    def _frames(self, mode: str, req: dict[str, Any]) -> list[bytes]:
        frames = [_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})]
        if mode == "tools":
            frames.append(_chunk({"index": 0, "delta": {"content": "Let me look."}, "finish_reason": None}))
            first = {"index": 0, "id": "call_abc", "type": "function", "function": {"name": "bash", "arguments": ""}}
            frames.append(_chunk({"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}))
            for piece in TOOL_ARGS:
                frames.append(_chunk({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, "finish_reason": None}))
            frames.append(_chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}))
        else:
            for i, piece in enumerate(PIECES[:2] if mode == "die" else PIECES):
                choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                extra: dict[str, Any] = {}
                if mode == "ids" and req.get("return_token_ids"):
                    choice["token_ids"] = TOKEN_IDS[i]
                    if i == 0:
                        extra["prompt_token_ids"] = PROMPT_IDS
                frames.append(_chunk(choice, **extra))
            if mode == "die":
                return frames
            frames.append(_chunk({"index": 0, "delta": {}, "finish_reason": "stop"}))
        if (req.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
            frames.append(b"data: " + orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}) + b"\n\n")
        return frames

    @staticmethod
    async def _send(send: Any, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sse_text(raw: str) -> str:
    out = []
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices") or ():
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def ask(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "whatever", "messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.parametrize("stream", [False, True])
def test_text_is_passed_through_and_recorded(live_proxy, fake, stream):
    proxy = live_proxy(f"litellm:openai/fake?api_base={fake.url}/v1&api_key=sk-test")
    assert isinstance(proxy.app.policy.backend._native, OpenAICompatBackend)
    resp = httpx.post(proxy.base + CHAT, json=ask("text", stream=stream, max_tokens=20, temperature=0.5), timeout=30)
    assert resp.status_code == 200
    text = sse_text(resp.text) if stream else resp.json()["choices"][0]["message"]["content"]
    assert text == "Hello, world!"
    (sent,) = fake.requests
    assert sent["model"] == "fake" and sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["max_tokens"] == 20 and sent["temperature"] == 0.5 and "return_token_ids" not in sent
    assert fake.headers[0]["authorization"] == "Bearer sk-test"
    (row,) = proxy.rows("SELECT status, finish_reason, backend, response, token_ids(completion_token_ids), token_ids(prompt_token_ids) FROM calls")
    assert row[:3] == ("ok", "stop", "litellm:openai/fake")
    response = json.loads(row[3])
    assert response["choices"][0]["message"]["content"] == "Hello, world!"
    assert response["usage"]["prompt_tokens"] == 12 and response["usage"]["completion_tokens"] == 5
    assert row[4] is None and row[5] is None


@pytest.mark.parametrize("stream", [False, True])
def test_streamed_tool_call_pieces_are_reassembled(live_proxy, fake, stream):
    proxy = live_proxy(f"litellm:hosted_vllm/fake?api_base={fake.url}/v1")
    resp = httpx.post(proxy.base + CHAT, json=ask("tools", stream=stream, tools=TOOLS, tool_choice="auto"), timeout=30)
    assert resp.status_code == 200
    assert fake.requests[0]["tools"] == TOOLS and fake.requests[0]["tool_choice"] == "auto"
    assert fake.requests[0]["model"] == "fake"
    (row,) = proxy.rows("SELECT status, finish_reason, response FROM calls")
    assert row[:2] == ("ok", "tool_calls")
    message = json.loads(row[2])["choices"][0]["message"]
    assert message["content"] == "Let me look."
    (call,) = message["tool_calls"]
    assert call["id"] == "call_abc" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -la"}
    if not stream:
        assert resp.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == call["function"]["arguments"]


def test_token_ids_are_recorded_when_returned(live_proxy, fake):
    proxy = live_proxy(f"litellm:openai/fake?api_base={fake.url}/v1&token_ids=1")
    resp = httpx.post(proxy.base + CHAT, json=ask("ids", stream=True), timeout=30)
    assert resp.status_code == 200 and sse_text(resp.text) == "Hello, world!"
    assert fake.requests[0]["return_token_ids"] is True
    (row,) = proxy.rows("SELECT status, token_ids(prompt_token_ids), token_ids(completion_token_ids) FROM calls")
    assert row == ("ok", PROMPT_IDS, [t for ids in TOKEN_IDS for t in ids])


@pytest.mark.parametrize("stream", [False, True])
def test_unreachable_upstream_is_502_and_recorded(live_proxy, stream):
    port = free_port()
    proxy = live_proxy(f"litellm:openai/fake?api_base=http://127.0.0.1:{port}/v1")
    resp = httpx.post(proxy.base + CHAT, json=ask("text", stream=stream), timeout=30)
    assert resp.status_code == 502
    assert f"cannot reach http://127.0.0.1:{port}/v1" in resp.json()["error"]["message"]
    (row,) = proxy.rows("SELECT status, error FROM calls")
    assert row[0] == "error" and "cannot reach" in row[1]
    session = proxy.sessions.get(proxy.token)  # the rollout's end is then not the policy's (rollout.attempt)
    assert session is not None and session.backend_failures == 1 and "cannot reach" in session.last_backend_failure


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_error_is_passed_on_with_its_message(live_proxy, fake, stream):
    proxy = live_proxy(f"litellm:openai/fake?api_base={fake.url}/v1")
    resp = httpx.post(proxy.base + CHAT, json=ask("bad", stream=stream), timeout=30)
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert "HTTP 400" in message and "temperature must be at most 2" in message
    (row,) = proxy.rows("SELECT status, error FROM calls")
    assert row[0] == "error" and "temperature must be at most 2" in row[1]


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_context_length_is_the_clients_400(live_proxy, fake, stream):
    """A prompt the upstream cannot fit is the harness's to shorten, as on the token path: not a 502."""
    proxy = live_proxy(f"litellm:openai/fake?api_base={fake.url}/v1")
    resp = httpx.post(proxy.base + CHAT, json=ask("long", stream=stream), timeout=30)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded" and "maximum context length is 2048" in error["message"]
    (row,) = proxy.rows("SELECT status, error FROM calls")
    assert row[0] == "error" and "too long" in row[1]
    assert proxy.sessions.get(proxy.token).backend_failures == 0  # a prompt too long is the harness's, not a backend failure


def test_upstream_dying_mid_stream_ends_with_error_event(live_proxy, fake):
    proxy = live_proxy(f"litellm:openai/fake?api_base={fake.url}/v1")
    resp = httpx.post(proxy.base + CHAT, json=ask("die", stream=True), timeout=30)
    assert resp.status_code == 200
    assert sse_text(resp.text) == "Hello, "
    assert '"error"' in resp.text and resp.text.rstrip().endswith("data: [DONE]")
    (row,) = proxy.rows("SELECT status, error, response FROM calls")
    assert row[0] == "error" and "broke mid-answer" in row[1]
    assert json.loads(row[2]) == {"partial_text": "Hello, "}


async def test_backend_events_and_cancellation(fake):
    backend = OpenAICompatBackend(fake.url + "/v1", "fake", token_ids=True)
    request = ChatRequest(api="chat", model="m", messages=[{"role": "user", "content": "ids"}])
    ctx = GenerationContext(session="s", call_seq=0, request=request)
    events = [e async for e in backend.complete(request, ctx)]
    assert [e.text for e in events if isinstance(e, TextDelta)] == PIECES
    done = events[-1]
    assert isinstance(done, Finished)
    assert done.completion.prompt_token_ids == PROMPT_IDS and done.completion.completion_token_ids == [11, 12, 13, 14, 15]
    assert done.completion.prompt_tokens == 12 and done.completion.completion_tokens == 5
    # a consumer that stops early closes the upstream response; the session stays usable
    gen = backend.complete(request, ctx)
    assert isinstance(await anext(gen), TextDelta)
    await gen.aclose()
    again = [e async for e in backend.complete(request, ctx)]
    assert isinstance(again[-1], Finished) and again[-1].completion.text == "Hello, world!"
    await backend.aclose()
    with pytest.raises(BackendError, match="cannot reach"):
        dead = OpenAICompatBackend(f"http://127.0.0.1:{free_port()}/v1", "fake")
        try:
            [e async for e in dead.complete(request, ctx)]
        finally:
            await dead.aclose()


@pytest.mark.parametrize(
    ("model", "api_base", "native"),
    [
        ("openai/fake", "http://127.0.0.1:1/v1", "fake"),
        ("hosted_vllm/org/model", "http://127.0.0.1:1/v1", "org/model"),
        ("custom_openai/m", "http://127.0.0.1:1/v1", "m"),
        ("openai_compatible/m", "http://127.0.0.1:1/v1", "m"),
        ("my-model", "http://127.0.0.1:1/v1", "my-model"),
        ("openai/gpt-4o", None, None),
        ("anthropic/claude-sonnet-4-5", None, None),
        ("anthropic/claude-sonnet-4-5", "http://127.0.0.1:1", None),
        ("gemini/gemini-2.5-pro", None, None),
    ],
)
def test_which_client_serves_a_spec(model, api_base, native):
    backend = LiteLLMBackend(model, api_base=api_base, api_key="k")
    assert backend.name == f"litellm:{model}"
    if native is None:
        assert backend._native is None  # served by litellm.acompletion
    else:
        assert isinstance(backend._native, OpenAICompatBackend)
        assert backend._native.model == native and backend._native.url == api_base + "/chat/completions"


async def test_other_providers_go_through_litellm(monkeypatch):
    import core.backends.litellm_backend as lb

    seen: list[dict[str, Any]] = []

    class ContextWindowExceededError(Exception):
        pass

    class FakeLiteLLM:
        provider_list = ["anthropic", "openai"]

        @staticmethod
        async def acompletion(**kwargs: Any) -> Any:
            seen.append(kwargs)
            if kwargs["messages"][-1]["content"] == "long":
                raise ContextWindowExceededError("prompt is 300000 tokens, over the 200000 window")
            raise RuntimeError("offline: no provider in tests")

    FakeLiteLLM.ContextWindowExceededError = ContextWindowExceededError  # type: ignore[attr-defined]

    monkeypatch.setattr(lb, "_litellm", lambda: FakeLiteLLM)
    backend = LiteLLMBackend("anthropic/claude-sonnet-4-5", api_base="http://127.0.0.1:1", api_key="k", token_ids=True)
    assert backend._native is None
    request = ChatRequest(api="chat", model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=7)
    with pytest.raises(BackendError, match="offline: no provider in tests"):
        [e async for e in backend.complete(request, GenerationContext(session="s", call_seq=0, request=request))]
    (kwargs,) = seen
    assert kwargs["model"] == "anthropic/claude-sonnet-4-5" and kwargs["api_base"] == "http://127.0.0.1:1"
    assert kwargs["max_tokens"] == 7 and kwargs["stream"] is True and kwargs["extra_body"] == {"return_token_ids": True}
    long = ChatRequest(api="chat", model="m", messages=[{"role": "user", "content": "long"}])
    with pytest.raises(ContextLengthError, match="over the 200000 window"):
        [e async for e in backend.complete(long, GenerationContext(session="s", call_seq=1, request=long))]
    await backend.aclose()
