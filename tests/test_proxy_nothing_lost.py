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
    assert "nested too deep" in error_message(api, resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


def test_a_gemini_parameters_schema_deeper_than_the_stack_is_a_400(live_proxy, script_file):
    """`parameters` (OpenAPI types, lowered recursively) ~900 JSON levels deep: a 400, not the safety net's 500."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    params = b'{"type":"OBJECT","properties":{"x":' * 450 + b'{"type":"STRING"}' + b"}}" * 450
    body = b'{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[{"name":"f","parameters":' + params + b"}]}]}"
    resp = httpx.post(proxy.base + ROUTES["gemini"], content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert "nested too deep" in error_message("gemini", resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


@pytest.mark.parametrize("depth", [300, 1100])
@pytest.mark.parametrize("api", list(ROUTES))
def test_a_sampled_tool_call_too_deep_to_re_serialise_is_text_and_a_parse_error(live_proxy, script_file, api, depth):
    """Item 3 of issue 23: arguments 300 deep broke rendering (orjson: "Recursion limit reached"), 1,100 deep broke
    parsing (RecursionError) — a 500 in every protocol. The model's output is plain text with a `tool_parse_error`."""
    sampled = '<tool_call>{"name": "f", "arguments": ' + nested(depth).decode() + "}</tool_call>"
    proxy = live_proxy(f"scripted:{script_file([{'text': sampled}])}")
    body = {"model": "m", "max_tokens": 8192, "messages": USER} if api != "gemini" else {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    if api == "responses":
        body = {"model": "m", "input": "hi"}
    resp = httpx.post(proxy.base + ROUTES[api], json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    assert f"{depth + 1} levels deep" in proxy.rows("SELECT tool_parse_error FROM calls")[0][0]
    ((status, n),) = proxy.rows("SELECT status, len(completion_token_ids) FROM calls")
    assert status == "ok" and n > depth
    assert "<tool_call>" in resp.text  # the text, as sampled


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
    monkeypatch.setattr(app_module, "check_nesting", broken)
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
    assert "nested too deep" in error_message(api, resp.json())
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
    assert "nested too deep" in error_message("chat", resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]
    assert proxy.rows("SELECT count(*) FROM blobs") == [(0,)]


def deep_history(api: str, depth: int) -> bytes:
    """A request whose history holds one tool call with arguments `depth` objects deep, in `api`'s own fields."""
    args = nested(depth)
    if api == "chat":  # arguments as JSON text
        call = b'{"id":"c1","type":"function","function":{"name":"f","arguments":' + orjson.dumps(args.decode()) + b"}}"
        return b'{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[' + call + b']},{"role":"tool","tool_call_id":"c1","content":"ok"}]}'
    if api == "responses":
        call = b'{"type":"function_call","call_id":"c1","name":"f","arguments":' + orjson.dumps(args.decode()) + b"}"
        return b'{"model":"m","input":[{"role":"user","content":"hi"},' + call + b',{"type":"function_call_output","call_id":"c1","output":"ok"}]}'
    if api == "messages":  # arguments as an object: `tool_use.input`
        use = b'{"type":"tool_use","id":"t1","name":"f","input":' + args + b"}"
        return b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[' + use + b']},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}'
    call = b'{"functionCall":{"name":"f","args":' + args + b"}}"
    return b'{"contents":[{"role":"user","parts":[{"text":"hi"}]},{"role":"model","parts":[' + call + b']},{"role":"user","parts":[{"functionResponse":{"name":"f","response":{"ok":1}}}]}]}'


@pytest.mark.parametrize(
    ("api", "depth"),
    [("chat", 1100), ("chat", 201), ("responses", 3000), ("messages", 1015), ("messages", 300), ("gemini", 1015), ("gemini", 201)],
)
def test_history_nested_past_the_one_limit_is_a_400_in_every_protocol(live_proxy, script_file, api, depth):
    """Issue 23 item 4: these were 500s (RecursionError, orjson's "Recursion limit reached"). One limit (200 levels), one 400."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    resp = httpx.post(proxy.base + ROUTES[api], content=deep_history(api, depth), headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    message = error_message(api, resp.json())
    assert "nested too deep" in message and f"({depth} levels" in message and "at most 200" in message
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


@pytest.mark.parametrize("api", list(ROUTES))
def test_history_at_the_limit_is_answered(live_proxy, script_file, api):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    resp = httpx.post(proxy.base + ROUTES[api], content=deep_history(api, 199), headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    assert proxy.rows("SELECT status FROM calls") == [("ok",)]
