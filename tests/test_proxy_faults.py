"""Bad input and faults: each gets the protocol's own error, nothing crashes, no call is lost."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import orjson
import pytest

from core.proxy.server import BackgroundServer

CHAT = "/v1/chat/completions"
ROUTES = {
    "chat": CHAT,
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "gemini": "/v1beta/models/m:generateContent",
}
USER = [{"role": "user", "content": "hi"}]


def error_message(api: str, body: dict) -> str:
    """The message inside each protocol's own error shape (fails if the shape is wrong)."""
    if api == "messages":
        assert body["type"] == "error"
        return body["error"]["message"]
    if api == "gemini":
        assert isinstance(body["error"]["code"], int) and body["error"]["status"]
        return body["error"]["message"]
    assert "type" in body["error"]
    return body["error"]["message"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def scripted(live_proxy, script_file):
    return live_proxy(f"scripted:{script_file([{'text': 'ok'}])}", max_body_bytes=64 * 1024)


@pytest.mark.parametrize("api", list(ROUTES))
def test_malformed_json_is_400_in_protocol_shape(scripted, api):
    resp = httpx.post(scripted.base + ROUTES[api], content=b'{"model": "m", "messages": [', headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert "not valid JSON" in error_message(api, resp.json())


@pytest.mark.parametrize(
    ("api", "body"),
    [
        ("chat", {"model": "m", "messages": "hi"}),
        ("chat", {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}),
        ("responses", {"model": "m", "input": 42}),
        ("messages", {"model": "m", "max_tokens": 5, "messages": {"role": "user"}}),
        ("gemini", {"contents": "hi"}),
        ("chat", [1, 2, 3]),
    ],
)
def test_wrong_types_are_400(scripted, api, body):
    resp = httpx.post(scripted.base + ROUTES[api], json=body)
    assert resp.status_code == 400
    assert error_message(api, resp.json())
    assert scripted.rows("SELECT count(*) FROM calls") == [(0,)]


@pytest.mark.parametrize("api", list(ROUTES))
def test_body_over_limit_is_413(scripted, api):
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}
    resp = httpx.post(scripted.base + ROUTES[api], json=big)
    assert resp.status_code == 413
    assert "limit" in error_message(api, resp.json())
    # the server is still fine afterwards
    assert httpx.post(scripted.base + CHAT, json={"model": "m", "messages": USER}).status_code == 200


@pytest.mark.parametrize("api", list(ROUTES))
def test_unknown_token_is_401(scripted, api):
    resp = httpx.post(f"{scripted.url}/r/not-a-token{ROUTES[api]}", json={"model": "m", "messages": USER})
    assert resp.status_code == 401
    assert "unknown rollout token" in error_message(api, resp.json())
    assert httpx.post(scripted.url + CHAT, json={"model": "m", "messages": USER}).status_code == 401  # no token at all


def test_backend_unreachable_is_502_and_recorded(live_proxy):
    proxy = live_proxy(f"vllm:http://127.0.0.1:{free_port()}?tokenizer=tiny")
    for stream in (False, True):
        resp = httpx.post(proxy.base + CHAT, json={"model": "m", "messages": USER, "stream": stream})
        assert resp.status_code == 502
        assert "cannot reach" in error_message("chat", resp.json()).lower()
    rows = proxy.rows("SELECT status, error, len(prompt_token_ids) FROM calls ORDER BY seq")
    assert [r[0] for r in rows] == ["error", "error"] and all(r[2] > 0 for r in rows)


class DyingVllm:
    """A stand-in for vLLM's streaming /v1/completions that sends three tokens and then drops the connection."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for tok in (101, 102, 103):
            chunk = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [{"index": 0, "text": "x", "token_ids": [tok], "logprobs": {"tokens": ["x"], "token_logprobs": [-0.5]}, "finish_reason": None}]}
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(chunk) + b"\n\n", "more_body": True})
            await asyncio.sleep(0.01)
        raise RuntimeError("the inference server died")


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_backend_dying_mid_stream_ends_with_error_event(live_proxy, api):
    with BackgroundServer(DyingVllm()) as dying:
        proxy = live_proxy(f"vllm:{dying.url}?tokenizer=tiny")
        body = {"model": "m", "messages": USER, "stream": True, "max_tokens": 50} if api != "responses" else {"model": "m", "input": "hi", "stream": True}
        resp = httpx.post(proxy.base + ROUTES[api], json=body, timeout=30)
        assert resp.status_code == 200
        text = resp.text
        if api == "chat":
            assert '"error"' in text and text.rstrip().endswith("data: [DONE]")
        elif api == "messages":
            assert "event: error" in text
        else:
            assert "response.failed" in text
        (row,) = proxy.rows("SELECT status, error, token_ids(completion_token_ids) FROM calls")
        assert row[0] == "error" and row[1]
        assert row[2] == [101, 102, 103]  # the partial completion is kept


def test_openai_sdk_raises_on_mid_stream_error(live_proxy):
    with BackgroundServer(DyingVllm()) as dying:
        proxy = live_proxy(f"vllm:{dying.url}?tokenizer=tiny")
        client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError):
            for _ in client.chat.completions.create(model="m", messages=USER, stream=True):
                pass


def test_client_disconnect_cancels_generation(live_proxy):
    proxy = live_proxy("builtin:tiny")
    body = {"model": "m", "messages": USER, "stream": True, "max_tokens": 5000, "temperature": 1.0}
    with httpx.stream("POST", proxy.base + CHAT, json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if '"content"' in line and '"content":""' not in line:
                break
    deadline = time.monotonic() + 30
    rows = []
    while time.monotonic() < deadline:
        rows = proxy.rows("SELECT status, error, len(completion_token_ids) FROM calls")
        if rows:
            break
        time.sleep(0.05)
    (row,) = rows
    assert row[0] == "cancelled" and "disconnected" in row[1]
    assert 0 < row[2] < 5000
    # the model is free again: a new call completes
    ok = httpx.post(proxy.base + CHAT, json={"model": "m", "messages": USER, "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 4


@pytest.mark.parametrize("api", list(ROUTES))
def test_prompt_over_context_gets_protocol_error(live_proxy, api):
    proxy = live_proxy("builtin:tiny")
    proxy.app.policy.backend.context_length = 64
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 200}]}
    if api == "responses":
        body = {"model": "m", "input": "word " * 200}
    if api == "gemini":
        body = {"contents": [{"role": "user", "parts": [{"text": "word " * 200}]}]}
    resp = httpx.post(proxy.base + ROUTES[api], json=body)
    assert resp.status_code == 400
    assert "too long" in error_message(api, resp.json())
    if api == "chat":
        assert resp.json()["error"]["code"] == "context_length_exceeded"


def test_malformed_tool_call_text_is_plain_text_and_flagged(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'let me try <tool_call>{not json</tool_call>'}])}")
    resp = httpx.post(proxy.base + CHAT, json={"model": "m", "messages": USER, "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}]})
    assert resp.status_code == 200
    msg = resp.json()["choices"][0]["message"]
    assert "<tool_call>{not json</tool_call>" in msg["content"] and not msg.get("tool_calls")
    (row,) = proxy.rows("SELECT status, tool_parse_error FROM calls")
    assert row[0] == "ok" and "not valid JSON" in row[1]


def test_rewritten_history_starts_a_new_branch(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'first answer'}, {'text': 'second'}, {'text': 'third'}])}")
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="x")
    first = client.chat.completions.create(model="m", messages=USER).choices[0].message.content
    history = USER + [{"role": "assistant", "content": first}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="m", messages=history)
    compacted = [{"role": "user", "content": "Summary of the conversation so far: the user said hi."}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="m", messages=compacted)
    rows = proxy.rows("SELECT seq, branch, extends_parent FROM calls ORDER BY seq")
    assert rows == [(0, 0, False), (1, 0, True), (2, 1, False)]


def test_concurrent_calls_all_recorded(scripted):
    async def fire() -> list[int]:
        async with httpx.AsyncClient(timeout=60) as client:
            resps = await asyncio.gather(*(client.post(scripted.base + CHAT, json={"model": "m", "messages": USER}) for _ in range(40)))
        return [r.status_code for r in resps]

    assert asyncio.run(fire()) == [200] * 40
    assert scripted.rows("SELECT count(*), count(DISTINCT seq) FROM calls") == [(40, 40)]


def test_adhoc_sessions_each_get_a_rollout(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}", adhoc=True)
    for name in ("alpha", "beta"):
        assert httpx.post(f"{proxy.url}/r/{name}{CHAT}", json={"model": "m", "messages": USER}).status_code == 200
    assert httpx.post(proxy.url + CHAT, json={"model": "m", "messages": USER}).status_code == 200
    sessions = sorted(s.rollout_id for s in proxy.sessions.all())
    assert sessions == ["rollout-1", "run-test-alpha", "run-test-beta", "run-test-default"]
    assert json.dumps(proxy.rows("SELECT DISTINCT rollout_id FROM calls ORDER BY 1")) == json.dumps([["run-test-alpha"], ["run-test-beta"], ["run-test-default"]])


def test_the_proxy_exposes_no_sql_to_harnesses(scripted):
    """Harnesses reach the proxy; the store is read only through its own token-guarded endpoint."""
    for method in ("GET", "POST"):
        resp = httpx.request(method, f"{scripted.url}/_forgetui/sql", params={"q": "SELECT * FROM calls"}, json={"sql": "SELECT * FROM calls"})
        assert resp.status_code == 404


def test_calls_wait_for_a_policy_still_loading(live_proxy, script_file):
    """A run's policy loads while its sandboxes start: a call that comes first waits and is answered."""
    import threading

    from core.backends.spec import PolicySpec
    from core.proxy.factory import make_policy
    from core.proxy.policy import DeferredPolicy

    release = threading.Event()
    spec = f"scripted:{script_file([{'text': 'late but here'}])}"

    def build():
        release.wait(10)
        return make_policy(PolicySpec.parse(spec))

    policy = DeferredPolicy(build)
    proxy = live_proxy(spec, policy=policy)
    threading.Timer(0.5, release.set).start()
    t = time.monotonic()
    r = httpx.post(f"{proxy.url}/r/{proxy.token}{CHAT}", json={"model": "m", "messages": USER}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "late but here"
    assert time.monotonic() - t >= 0.4
    proxy.store.flush()
    ((backend, status),) = proxy.store.cursor().execute("SELECT backend, status FROM calls").fetchall()
    assert backend.startswith("scripted:") and status == "ok"  # the built policy's name, not a placeholder


async def test_a_cancelled_wait_does_not_cancel_the_policy_build():
    import threading

    from core.proxy.policy import DeferredPolicy

    class Closable:
        name = "p"
        closed = False

        async def aclose(self):
            self.closed = True

    release = threading.Event()
    built = Closable()
    policy = DeferredPolicy(lambda: (release.wait(10), built)[1])
    waiter = asyncio.ensure_future(policy.ready())
    await asyncio.sleep(0.05)
    waiter.cancel()
    release.set()
    assert await policy.ready() is built
    await policy.aclose()
    assert built.closed

    def fail():
        raise ValueError("no such model")

    broken = DeferredPolicy(fail)
    with pytest.raises(ValueError, match="no such model"):
        await broken.ready()
    await broken.aclose()  # nothing to close, and no error
