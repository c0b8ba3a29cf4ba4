"""A call the proxy answered is always in the store, whatever the request nests; failures are JSON in the protocol's shape."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.test_proxy_faults import ROUTES, error_message

USER = [{"role": "user", "content": "hi"}]


def nested(depth: int) -> bytes:
    """A JSON value `depth` objects deep (built as text: orjson cannot write one this deep)."""
    return b'{"a":' * depth + b"1" + b"}" * depth


def schema(depth: int) -> dict:
    d: dict = {"type": "string"}
    for _ in range(depth):
        d = {"type": "object", "properties": {"x": d}}
    return d


BODIES = {
    "chat": b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":%s}',
    "responses": b'{"model":"m","input":"hi","metadata":%s}',
    "messages": b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"extra_field":%s}',
    "gemini": b'{"contents":[{"role":"user","parts":[{"text":"hi","x":%s}]}]}',
}


@pytest.mark.parametrize("api", list(BODIES))
def test_a_request_nesting_300_deep_is_answered_and_recorded(live_proxy, script_file, api):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    body = BODIES[api] % nested(300)
    resp = httpx.post(proxy.base + ROUTES[api], content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    ((status, depth_ok, stored),) = proxy.rows("SELECT status, json_valid(request), strlen(request::VARCHAR) FROM calls")
    assert status == "ok" and depth_ok and stored == len(body)
    assert proxy.rows("SELECT count(*) FROM store_errors") == [(0,)]


@pytest.mark.parametrize("api", ["chat", "gemini"])
def test_tool_schemas_too_deep_to_serialise_are_a_400_not_a_plain_500(live_proxy, script_file, api):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    if api == "chat":
        body = {"model": "m", "messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": schema(130)}}]}
    else:
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [{"functionDeclarations": [{"name": "f", "parametersJsonSchema": schema(130)}]}]}
    resp = httpx.post(proxy.base + ROUTES[api], json=body)
    assert resp.status_code == 400
    assert "nest too deep" in error_message(api, resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


def test_a_gemini_parameters_schema_deeper_than_the_stack_is_a_400(live_proxy, script_file):
    """`parameters` (OpenAPI types, lowered recursively) ~900 JSON levels deep: a 400, not the safety net's 500."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    params = b'{"type":"OBJECT","properties":{"x":' * 450 + b'{"type":"STRING"}' + b"}}" * 450
    body = b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[{"name":"f","parameters":' + params + b"}]}]}"
    resp = httpx.post(proxy.base + ROUTES["gemini"], content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert "nest too deep" in error_message("gemini", resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


def test_an_answer_that_cannot_be_rendered_is_a_protocol_error_and_recorded(live_proxy, script_file):
    """Tool-call arguments 300 deep break Gemini's rendering (orjson's depth limit): a JSON 500 and an `error` row, not a plain-text 500 and nothing."""
    args = orjson.loads(nested(300))
    proxy = live_proxy(f"scripted:{script_file([{'tool_calls': [{'name': 'f', 'arguments': args}]}])}")
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "tools": [{"functionDeclarations": [{"name": "f"}]}]}
    resp = httpx.post(proxy.base + ROUTES["gemini"], json=body)
    assert resp.status_code == 500
    assert resp.headers["content-type"].startswith("application/json")
    assert "Recursion" in error_message("gemini", resp.json())
    ((status, error, n),) = proxy.rows("SELECT status, error, len(completion_token_ids) FROM calls")
    assert status == "error" and "Recursion" in error and n > 300


@pytest.mark.parametrize("stream", [False, True])
def test_a_render_failure_after_generation_is_recorded(live_proxy, script_file, monkeypatch, stream):
    """The safety net: whatever breaks rendering after the model answered, the call is a row and the client gets JSON."""
    from core.protocols import openai_chat

    def broken(*args, **kwargs):
        raise OverflowError("Integer exceeds 64-bit range")

    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    monkeypatch.setattr(openai_chat.protocol, "render_response", broken)
    resp = httpx.post(proxy.base + ROUTES["chat"], json={"model": "m", "messages": USER, "stream": stream})
    if stream:  # the stream was already sent whole; the store keeps the call and says what failed
        assert resp.status_code == 200 and resp.text.rstrip().endswith("data: [DONE]")
    else:
        assert resp.status_code == 500 and "64-bit" in error_message("chat", resp.json())
    ((status, error, text),) = proxy.rows("SELECT status, error, response->>'partial_text' FROM calls")
    assert status == "error" and "64-bit" in error and text == "ok"


def test_an_unexpected_failure_anywhere_is_json_in_the_routes_protocol(live_proxy, script_file, monkeypatch):
    from core.proxy import app as app_module

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    monkeypatch.setattr(app_module, "_tools_hash", broken)
    resp = httpx.post(proxy.base + ROUTES["messages"], json={"model": "m", "max_tokens": 8, "messages": USER})
    assert resp.status_code == 500 and resp.headers["content-type"].startswith("application/json")
    assert "boom" in error_message("messages", resp.json())


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_history_tool_arguments_too_deep_are_a_400_before_generation(live_proxy, script_file, api):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    args = nested(300).decode()
    if api == "chat":
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
        body = {"model": "m", "messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "done"}]}
    else:
        body = {"model": "m", "input": [{"role": "user", "content": "hi"}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": args}, {"type": "function_call_output", "call_id": "c1", "output": "done"}]}
    resp = httpx.post(proxy.base + ROUTES[api], json=body)
    assert resp.status_code == 400
    assert "nest too deep" in error_message(api, resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


def test_a_request_naming_images_and_nesting_1000_deep_is_answered_and_recorded(live_proxy, script_file):
    """The image scan walks the body without recursion: the word "image" in a deep request broke it (RecursionError, a 500, no row)."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    body = b'{"model":"m","messages":[{"role":"user","content":"describe the image"}],"metadata":%s}' % nested(1000)
    resp = httpx.post(proxy.base + ROUTES["chat"], content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    ((status, stored, hashes),) = proxy.rows("SELECT status, strlen(request::VARCHAR), len(coalesce(image_hashes, [])) FROM calls")
    assert status == "ok" and stored == len(body) and hashes == 0


def test_an_image_in_a_request_too_deep_to_record_is_a_400_before_generation(live_proxy, script_file):
    """Its blob references cannot be written back into a body orjson cannot serialise: refused, never answered and lost."""
    from tests.test_gui_images import b64, png

    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(png())}"}}
    head = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]})
    body = head[:-1] + b',"metadata":' + nested(300) + b"}"
    resp = httpx.post(proxy.base + ROUTES["chat"], content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "nests too deep" in error_message("chat", resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]
    assert proxy.rows("SELECT count(*) FROM blobs") == [(0,)]
