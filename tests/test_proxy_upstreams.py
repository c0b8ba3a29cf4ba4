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
