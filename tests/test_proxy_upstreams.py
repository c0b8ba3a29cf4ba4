"""Upstream behaviour the client must see as it is: a 429 with its Retry-After, a per-backend timeout, keys from the environment."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import httpx
import orjson
import pytest

from core.backends.spec import PolicySpec
from core.errors import ConfigError
from core.proxy.factory import make_policy
from core.proxy.server import BackgroundServer
from tests.test_proxy_faults import ROUTES, error_message

USER = [{"role": "user", "content": "hi"}]


class Upstream:
    """An OpenAI-compatible (and vLLM token-id) upstream whose answer each test sets; it notes every request's headers."""

    def __init__(self, status: int = 200, headers: list | None = None, hang: bool = False) -> None:
        self.status, self.headers, self.hang = status, headers or [], hang
        self.seen: list[dict[str, str]] = []
        self.release = threading.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()
        self.seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        if self.hang:  # accepts the request and never answers
            while not self.release.is_set():
                await asyncio.sleep(0.05)
            return
        if self.status != 200:
            body = orjson.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}})
            await send({"type": "http.response.start", "status": self.status, "headers": [(b"content-type", b"application/json"), *self.headers]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["path"].endswith("/chat/completions"):  # a server that answers chat without streaming
            choice = {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": orjson.dumps({"choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})})
            return
        choice = {"index": 0, "text": "x", "token_ids": [90], "logprobs": {"token_logprobs": [-0.1]}, "finish_reason": "stop"}  # vLLM's token-id stream
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\ndata: [DONE]\n\n"})


@contextlib.contextmanager
def silent_upstream() -> Iterator[str]:
    """The URL of an upstream that takes requests and never answers (released when the block ends)."""
    upstream = Upstream(hang=True)
    with BackgroundServer(upstream) as up:
        try:
            yield up.url
        finally:
            upstream.release.set()


def spec_for(kind: str, url: str, opts: str = "") -> str:
    if kind == "vllm":
        return f"vllm:{url}?tokenizer=tiny{'&' + opts if opts else ''}"
    return f"litellm:hosted_vllm/m?api_base={url}/v1{'&' + opts if opts else ''}"


@pytest.mark.parametrize("api", ["chat", "messages", "gemini"])
@pytest.mark.parametrize("kind", ["litellm", "vllm"])
def test_an_upstream_429_reaches_the_client_with_its_retry_after(live_proxy, kind, api):
    with BackgroundServer(Upstream(429, [(b"retry-after", b"7")])) as up:
        proxy = live_proxy(spec_for(kind, up.url))
        body = {"model": "m", "messages": USER, "max_tokens": 8} if api != "gemini" else {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        resp = httpx.post(proxy.base + ROUTES[api], json=body, timeout=30)
        assert resp.status_code == 429
        assert resp.headers["retry-after"] == "7"
        assert "rate limited" in error_message(api, resp.json())
        if api == "messages":
            assert resp.json()["error"]["type"] == "rate_limit_error"
        if api == "gemini":
            assert resp.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
        ((status, error),) = proxy.rows("SELECT status, error FROM calls")
        assert status == "error" and "rate limited" in error


@pytest.mark.parametrize("kind", ["litellm", "vllm"])
def test_the_spec_timeout_bounds_a_silent_upstream(live_proxy, kind):
    with silent_upstream() as url:
        proxy = live_proxy(spec_for(kind, url, "timeout=0.5"))
        resp = httpx.post(proxy.base + ROUTES["chat"], json={"model": "m", "messages": USER, "max_tokens": 8}, timeout=60)
        assert resp.status_code == 502
        assert "timed out" in error_message("chat", resp.json())
        ((status, error),) = proxy.rows("SELECT status, error FROM calls")
        assert status == "error" and "timed out" in error


def test_a_bad_timeout_is_a_config_error():
    with pytest.raises(ConfigError, match="timeout"):
        make_policy(PolicySpec.parse("litellm:hosted_vllm/m?api_base=http://127.0.0.1:9/v1&timeout=soon"))


@pytest.mark.parametrize("kind", ["litellm", "vllm"])
def test_the_key_comes_from_the_environment(live_proxy, monkeypatch, kind):
    monkeypatch.setenv("FORGETUI_TEST_UPSTREAM_KEY", "sk-from-env-123")
    upstream = Upstream()
    with BackgroundServer(upstream) as up:
        proxy = live_proxy(spec_for(kind, up.url, "api_key_env=FORGETUI_TEST_UPSTREAM_KEY"))
        assert httpx.post(proxy.base + ROUTES["chat"], json={"model": "m", "messages": USER, "max_tokens": 8}, timeout=30).status_code == 200
    assert upstream.seen[-1]["authorization"] == "Bearer sk-from-env-123"


def test_an_unset_key_variable_is_a_config_error_naming_it(monkeypatch):
    monkeypatch.delenv("FORGETUI_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="FORGETUI_TEST_NO_SUCH_KEY is not set"):
        make_policy(PolicySpec.parse("litellm:openai/gpt-4o?api_key_env=FORGETUI_TEST_NO_SUCH_KEY"))


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("litellm:openai/gpt-4o?api_key=sk-secret&api_base=http://127.0.0.1:9/v1", "openai/gpt-4o"),
        ("scripted:/home/someone/private/teacher.json", "teacher.json"),
        ("builtin:/srv/models/qwen3-8b?device=cpu", "qwen3-8b"),
        ("vllm:http://user:pw@10.0.0.5:8000?tokenizer=tiny&model=qwen", "qwen"),
    ],
)
def test_public_model_names_carry_no_keys_or_host_paths(spec, shown):
    assert PolicySpec.parse(spec).public_name == shown


async def test_litellm_providers_rate_limit_keeps_its_retry_after(monkeypatch):
    """Providers LiteLLM serves itself (not the native OpenAI-compatible path): its RateLimitError becomes a 429."""
    import core.backends.litellm_backend as lb
    from core.backends.base import GenerationContext
    from core.chat import ChatRequest
    from core.errors import RateLimitedError

    class RateLimitError(Exception):
        response = httpx.Response(429, headers={"retry-after": "12"})

    class FakeLiteLLM:
        provider_list = ["anthropic"]
        ContextWindowExceededError = type("ContextWindowExceededError", (Exception,), {})

        @staticmethod
        async def acompletion(**kwargs):
            raise RateLimitError("anthropic: 429 too many requests")

    FakeLiteLLM.RateLimitError = RateLimitError
    monkeypatch.setattr(lb, "_litellm", lambda: FakeLiteLLM)
    backend = lb.LiteLLMBackend("anthropic/claude-sonnet-4-5", api_key="k")
    request = ChatRequest(api="chat", model="m", messages=USER)
    with pytest.raises(RateLimitedError) as caught:
        [e async for e in backend.complete(request, GenerationContext(session="s", call_seq=0, request=request))]
    assert caught.value.retry_after == "12" and caught.value.status == 429


def test_upstream_errors_show_no_url_password(live_proxy):
    with BackgroundServer(Upstream(500)) as up:
        host = up.url.removeprefix("http://")
        proxy = live_proxy(f"litellm:hosted_vllm/m?api_base=http://user:hunter2@{host}/v1")
        resp = httpx.post(proxy.base + ROUTES["chat"], json={"model": "m", "messages": USER}, timeout=30)
        assert resp.status_code == 502
        message = error_message("chat", resp.json())
        assert "user:***@" in message and "hunter2" not in message
        ((error,),) = proxy.rows("SELECT error FROM calls")
        assert "hunter2" not in error


@pytest.mark.parametrize("stream", [False, True])
def test_the_call_timeout_of_a_run_bounds_every_call(live_proxy, stream):
    """`run.call_timeout_s` (and `forgetui proxy --call-timeout`): a call that takes longer fails with a 502 and is recorded."""
    with silent_upstream() as url:
        proxy = live_proxy(spec_for("litellm", url), call_timeout_s=0.5)
        resp = httpx.post(proxy.base + ROUTES["chat"], json={"model": "m", "messages": USER, "stream": stream}, timeout=60)
        assert resp.status_code == 502
        assert "call timeout of 0.5 s" in error_message("chat", resp.json())
        ((status, error),) = proxy.rows("SELECT status, error FROM calls")
        assert status == "error" and "call timeout" in error


# ---------------------------------------------------------------- issue 23 items 2, 7 and 8: what an upstream sends


class EventUpstream:
    """An OpenAI-compatible upstream that streams given SSE `data:` payloads, `gap_s` apart, then a finish and [DONE]."""

    def __init__(self, events: list[bytes], gap_s: float = 0.0) -> None:
        self.events, self.gap_s = events, gap_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for event in self.events:
            await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n", "more_body": True})
            await asyncio.sleep(self.gap_s)
        finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        await send({"type": "http.response.body", "body": finish})


def body_for(api: str, stream: bool = False) -> dict:
    if api == "gemini":
        return {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    return {"model": "m", "messages": USER, "max_tokens": 8, "stream": stream}


@pytest.mark.parametrize("retry_after", ["中文".encode(), b"\xff\xfe", b"in a while", b"1e9"], ids=["cjk", "raw-bytes", "words", "float"])
@pytest.mark.parametrize("api", ["chat", "messages", "gemini"])
def test_a_retry_after_no_client_can_take_is_dropped_and_the_call_recorded(live_proxy, api, retry_after):
    """Item 2: a non-Latin-1 Retry-After gave the client a 500 (UnicodeEncodeError) and left no `calls` row."""
    with BackgroundServer(Upstream(429, [(b"retry-after", retry_after)])) as up:
        proxy = live_proxy(spec_for("litellm", up.url))
        resp = httpx.post(proxy.base + ROUTES[api], json=body_for(api), timeout=30)
        assert resp.status_code == 429, resp.text
        assert "retry-after" not in resp.headers
        assert "rate limited" in error_message(api, resp.json())
        ((status, error),) = proxy.rows("SELECT status, error FROM calls")
        assert status == "error" and "rate limited" in error


def test_an_http_date_retry_after_is_passed_on(live_proxy):
    date = b"Wed, 21 Oct 2026 07:28:00 GMT"
    with BackgroundServer(Upstream(429, [(b"retry-after", date)])) as up:
        proxy = live_proxy(spec_for("vllm", up.url))
        resp = httpx.post(proxy.base + ROUTES["chat"], json=body_for("chat"), timeout=30)
        assert resp.status_code == 429 and resp.headers["retry-after"] == date.decode()


MALFORMED = {
    "tool-call-index-string": b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":"x","function":{"name":"f","arguments":"{}"}}]}}]}',
    "tool-call-indices-mixed": b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"f"}},{"index":"1","function":{"name":"g"}}]}}]}',
    "content-a-number": b'{"choices":[{"index":0,"delta":{"content":5}}]}',
    "usage-a-string": b'{"choices":[],"usage":"lots"}',
    "usage-a-list": b'{"choices":[],"usage":[1,2]}',
    "choices-an-object": b'{"choices":{"a":1}}',
    "choice-a-string": b'{"choices":["hello"]}',
    "token-ids-strings": b'{"choices":[{"index":0,"delta":{"content":"a"},"token_ids":["1"]}]}',
    "prompt-tokens-negative": b'{"choices":[],"usage":{"prompt_tokens":-5}}',
    "arguments-1100-deep": b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":' + orjson.dumps('{"a":' * 1100 + "1" + "}" * 1100) + b"}}]}}]}",
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["chat", "messages", "gemini"])
@pytest.mark.parametrize("event", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_upstream_event_is_a_502_in_the_protocols_shape_and_recorded(live_proxy, api, event, stream):
    """Item 8: these were 500 "internal error" (TypeError, AttributeError, RecursionError); the status must say upstream."""
    with BackgroundServer(EventUpstream([b'{"choices":[{"index":0,"delta":{"content":"hel"}}]}', event])) as up:
        proxy = live_proxy(spec_for("litellm", up.url))
        route = ROUTES[api] if not (stream and api == "gemini") else "/v1beta/models/m:streamGenerateContent"
        resp = httpx.post(proxy.base + route, json=body_for(api, stream), timeout=30)
        if stream:  # the text before the bad event was streamed: the stream ends with the protocol's error event
            assert resp.status_code == 200 and "cannot serve" in resp.text
        else:
            assert resp.status_code == 502, resp.text
            assert "sent an answer the proxy cannot serve" in error_message(api, resp.json())
        ((status, error, partial),) = proxy.rows("SELECT status, error, response->>'partial_text' FROM calls")
        assert status == "error" and "cannot serve" in error and partial == "hel"


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_a_stream_is_bounded_by_the_call_timeout_as_a_whole(live_proxy, api):
    """Item 7: with a 1 s call timeout a stream that trickled for 60 s was stored `ok`; the timeout is the call's."""
    trickle = [b'{"choices":[{"index":0,"delta":{"content":"x"}}]}'] * 40
    with BackgroundServer(EventUpstream(trickle, gap_s=0.1)) as up:  # each event well inside the timeout, the whole 4 s past it
        proxy = live_proxy(spec_for("litellm", up.url), call_timeout_s=1.0)
        resp = httpx.post(proxy.base + ROUTES[api], json=body_for(api, stream=True), timeout=60)
        assert resp.status_code == 200 and "call timeout of 1 s" in resp.text
        ((status, error, partial, stream),) = proxy.rows("SELECT status, error, response->>'partial_text', stream FROM calls")
        assert status == "error" and "call timeout of 1 s" in error and stream
        assert 0 < len(partial) < len(trickle)
