"""A client that leaves stops its generation, streaming or not, on every backend; the call is recorded `cancelled`."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import pytest

from core.proxy.server import BackgroundServer

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def wait_rows(proxy, sql: str, timeout: float = 30.0) -> list[tuple]:
    deadline = time.monotonic() + timeout
    while True:
        rows = proxy.rows(sql)
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def give_up_after(url: str, body: dict, seconds: float) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=body, timeout=httpx.Timeout(60, read=seconds))


def test_a_non_streaming_client_that_leaves_cancels_the_builtin_model(live_proxy):
    proxy = live_proxy("builtin:tiny")
    backend = proxy.app.policy.backend
    body = {"model": "m", "messages": USER, "max_tokens": 5000, "temperature": 1.0}
    for _ in range(8):  # the tiny model may sample its end token within the second: that call just finished; ask again
        try:
            httpx.post(proxy.base + CHAT, json=body, timeout=httpx.Timeout(60, read=1.0))
        except httpx.ReadTimeout:
            break
    else:
        pytest.fail("every generation ended within 1 s: no client was left waiting")
    (row,) = wait_rows(proxy, "SELECT status, error, len(completion_token_ids) FROM calls WHERE status <> 'ok'")
    assert row[0] == "cancelled" and "disconnected" in row[1]
    assert 0 < row[2] < 5000
    asyncio.run(asyncio.wait_for(backend.wait_idle(), 10))  # the worker let the generation go
    ok = httpx.post(proxy.base + CHAT, json={"model": "m", "messages": USER, "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200


class EndlessUpstream:
    """An upstream that streams one event every 50 ms forever and notes when its client hangs up.

    Serves vLLM's token-id ``/v1/completions`` and OpenAI's ``/v1/chat/completions`` shapes.
    """

    def __init__(self) -> None:
        self.hung_up = threading.Event()
        self.sent = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        chat = scope["path"].endswith("/chat/completions")
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            while not gone.done():
                choice = {"index": 0, "delta": {"content": "x"}, "finish_reason": None} if chat else {"index": 0, "text": "x", "token_ids": [90], "logprobs": {"token_logprobs": [-0.1]}, "finish_reason": None}
                await send({"type": "http.response.body", "body": b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n", "more_body": True})
                self.sent += 1
                await asyncio.wait({gone}, timeout=0.05)
        except OSError:
            pass
        finally:
            gone.cancel()
            self.hung_up.set()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["vllm", "litellm"])
def test_a_client_that_leaves_closes_the_upstream_stream(live_proxy, kind, stream):
    upstream = EndlessUpstream()
    with BackgroundServer(upstream) as server:
        spec = f"vllm:{server.url}?tokenizer=tiny" if kind == "vllm" else f"litellm:hosted_vllm/m?api_base={server.url}/v1"
        proxy = live_proxy(spec)
        body = {"model": "m", "messages": USER, "stream": stream, "max_tokens": 100000 if kind == "litellm" else 1000}
        if stream:
            with httpx.stream("POST", proxy.base + CHAT, json=body, timeout=30) as resp:
                assert resp.status_code == 200
                frames = 0
                for line in resp.iter_lines():
                    frames += line.startswith("data:")
                    if frames >= 3:  # the role frame and answer text: the upstream is generating
                        break
        else:
            give_up_after(proxy.base + CHAT, body, 0.5)
        assert upstream.hung_up.wait(10), "the proxy kept the upstream generating for a client that left"
        (row,) = wait_rows(proxy, "SELECT status, error FROM calls")
        assert row[0] == "cancelled" and "disconnected" in row[1]
        sent = upstream.sent
        time.sleep(0.3)
        assert upstream.sent == sent


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_before_a_silent_upstream_answers_is_cancelled_at_once(live_proxy, stream):
    """No waiting out the upstream's timeout (600 s by default) to record a call whose client is long gone."""
    from tests.test_proxy_upstreams import silent_upstream

    with silent_upstream() as url:
        proxy = live_proxy(f"litellm:hosted_vllm/m?api_base={url}/v1")
        give_up_after(proxy.base + CHAT, {"model": "m", "messages": USER, "stream": stream}, 0.5)
        (row,) = wait_rows(proxy, "SELECT status, error FROM calls", timeout=20)
        assert row[0] == "cancelled"
        assert ("first token" if stream else "the answer") in row[1]
