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


# ---------------------------------------------------------------- issue 23 item 5: tokenizing a big prompt


def tokenizing_children() -> list:
    """The child processes encoding a big prompt for this (the test's own, in-process) proxy."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "core.tokens.encode_child" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass
    return found


def wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def big_text(chars: int) -> str:
    return "lorem, ipsum 12 dolor\n" * (chars // 22)


COUNT_ROUTES = {
    "messages": ("/v1/messages/count_tokens", lambda text: {"model": "m", "messages": [{"role": "user", "content": text}]}, "input_tokens"),
    "gemini": ("/v1beta/models/m:countTokens", lambda text: {"contents": [{"role": "user", "parts": [{"text": text}]}]}, "totalTokens"),
}


@pytest.mark.parametrize("api", list(COUNT_ROUTES))
def test_a_big_count_tokens_stalls_nobody_and_counts_exactly(live_proxy, script_file, api):
    """A 5 MB count_tokens held the event loop (and /health) for 8 s: it is tokenized by a child process now."""
    from core.tokens.template import encode, render_chat

    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    route, body, field = COUNT_ROUTES[api]
    text = big_text(600_000)
    answer: dict = {}

    def count() -> None:
        answer["resp"] = httpx.post(proxy.base + route, json=body(text), timeout=300)
        answer["at"] = time.monotonic()

    counting = threading.Thread(target=count)
    counting.start()
    wait_for(lambda: bool(tokenizing_children()) or "at" in answer)  # tokenizing has begun
    assert httpx.get(proxy.url + "/health", timeout=60).status_code == 200
    small = httpx.post(proxy.base + CHAT, json={"model": "m", "messages": USER}, timeout=60)
    answered_at = time.monotonic()
    counting.join()
    assert small.status_code == 200 and answered_at < answer["at"]  # answered while the big one was still tokenizing
    tokenizer = proxy.app.policy.tokenizer  # the same tokenizer, in this process
    expected = len(encode(tokenizer, render_chat(tokenizer, [{"role": "user", "content": text}], [], True)))
    assert answer["resp"].status_code == 200 and answer["resp"].json()[field] == expected


@pytest.mark.parametrize("route", ["count_tokens", "generation"])
def test_a_client_that_leaves_a_big_prompt_stops_its_tokenizing(live_proxy, script_file, route):
    """A cancelled 25 MB prompt kept tokenizing for ~26 CPU-seconds after its client left; its child is killed now."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    text = big_text(4_000_000)  # ~20 s of tokenizing here
    if route == "count_tokens":
        url, body = proxy.base + COUNT_ROUTES["messages"][0], COUNT_ROUTES["messages"][1](text)
    else:
        url, body = proxy.base + CHAT, {"model": "m", "messages": [{"role": "user", "content": text}]}
    leaving = threading.Thread(target=give_up_after, args=(url, body, 2.0))
    leaving.start()
    leaving.join()  # the client is gone, 2 s into tokenizing
    assert wait_for(lambda: not tokenizing_children(), timeout=10), "the child kept tokenizing after the client left"
    before = time.process_time()
    time.sleep(3.0)
    assert time.process_time() - before < 0.15  # nothing left tokenizing in this process either (it went on at ~0.35 CPU-s/s here)
    if route == "generation":
        assert wait_rows(proxy, "SELECT status FROM calls") == [("cancelled",)]
