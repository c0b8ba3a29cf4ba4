"""Values the proxy cannot honour are a 400 in the caller's own protocol, before any generation, and nothing is recorded."""

from __future__ import annotations

import httpx
import pytest

from tests.test_proxy_faults import ROUTES, error_message

TOOL = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}


def chat(**extra):
    return "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def responses(**extra):
    return "responses", {"model": "m", "input": "hi", **extra}


def messages(**extra):
    return "messages", {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


def gemini(config=None, **extra):
    return "gemini", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": config or {}, **extra}


REFUSED = {
    "chat-temperature<0": (chat(temperature=-0.5), "temperature"),
    "chat-top_p=0": (chat(top_p=0), "top_p"),
    "chat-top_p>1": (chat(top_p=1.5), "top_p"),
    "chat-max_tokens=0": (chat(max_tokens=0), "max_tokens"),
    "chat-max_completion_tokens<0": (chat(max_completion_tokens=-3), "max_completion_tokens"),
    "chat-max_tokens-over-int32": (chat(max_tokens=2**40), "max_tokens"),
    "chat-n=3": (chat(n=3), "'n'"),
    "chat-stream-yes": (chat(stream="yes"), "stream"),
    "chat-tool_choice-unoffered": (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "rm_rf"}}), "rm_rf"),
    "chat-function_call-unoffered": (chat(functions=[TOOL["function"]], function_call={"name": "nope"}), "nope"),
    "responses-max_output_tokens-1e30": (responses(max_output_tokens=1e30), "max_output_tokens"),
    "responses-temperature<0": (responses(temperature=-1), "temperature"),
    "responses-stream-1": (responses(stream=1), "stream"),
    "responses-tool_choice-unoffered": (responses(tools=[{"type": "function", "name": "bash", "parameters": {}}], tool_choice={"type": "function", "name": "ls"}), "'ls'"),
    "messages-max_tokens=0": (messages(max_tokens=0), "max_tokens"),
    "messages-top_p>1": (messages(top_p=2), "top_p"),
    "messages-stream-string": (messages(stream="true"), "stream"),
    "messages-tool_choice-unoffered": (messages(tools=[{"name": "bash", "input_schema": {"type": "object"}}], tool_choice={"type": "tool", "name": "edit"}), "edit"),
    "gemini-maxOutputTokens=0": (gemini({"maxOutputTokens": 0}), "maxOutputTokens"),
    "gemini-temperature<0": (gemini({"temperature": -0.1}), "temperature"),
    "gemini-topP=0": (gemini({"topP": 0}), "topP"),
    "gemini-candidateCount=2": (gemini({"candidateCount": 2}), "candidateCount"),
    # issue 23 item 9: the README says unsupported values are refused; these were 200s with `logprobs: null` / `[]`
    "chat-logprobs": (chat(logprobs=True, top_logprobs=5), "'logprobs'"),
    "chat-top_logprobs": (chat(top_logprobs=2), "'top_logprobs'"),
    "responses-include-logprobs": (responses(include=["message.output_text.logprobs"], top_logprobs=3), "top_logprobs"),
    "responses-include-logprobs-alone": (responses(include=["reasoning.encrypted_content", "message.output_text.logprobs"]), "message.output_text.logprobs"),
    "gemini-responseLogprobs": (gemini({"responseLogprobs": True, "logprobs": 3}), "responseLogprobs"),
    "gemini-generationConfig-a-list": (gemini(config=None, generationConfig=[]), "generationConfig"),  # [] was taken as absent
    "chat-history-args-lone-surrogate": (
        chat(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}]}]),
        "lone surrogate",
    ),  # a 500 ("surrogates not allowed") once the proxy compared it with its own turns
    "gemini-allowed-unoffered": (
        gemini(
            tools=[{"functionDeclarations": [{"name": "bash", "parameters": {"type": "OBJECT"}}]}],
            toolConfig={"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["bash", "edit"]}},
        ),
        "edit",
    ),
}


@pytest.mark.parametrize(("case", "needle"), list(REFUSED.values()), ids=list(REFUSED))
def test_out_of_range_values_are_a_400_before_generation(live_proxy, script_file, case, needle):
    api, body = case
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    resp = httpx.post(proxy.base + ROUTES[api], json=body)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert needle in error_message(api, resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


ACCEPTED = {
    "chat-n=1-temperature=0-top_p=1": chat(n=1, temperature=0, top_p=1, stream=False),
    "chat-stream-null": chat(stream=None),
    "chat-named-offered-tool": chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "bash"}}),
    "chat-tool_choice-required": chat(tools=[TOOL], tool_choice="required"),
    "responses-big-but-int32": responses(max_output_tokens=2**31 - 1),
    "gemini-candidateCount=1": gemini({"candidateCount": 1, "topP": 1, "temperature": 0}),
    "chat-logprobs-false": chat(logprobs=False, top_logprobs=0),
    "responses-include-other": responses(include=["reasoning.encrypted_content"]),
}


@pytest.mark.parametrize("case", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_values_in_range_are_served(live_proxy, script_file, case):
    api, body = case
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    resp = httpx.post(proxy.base + ROUTES[api], json=body)
    assert resp.status_code == 200, resp.text
    assert proxy.rows("SELECT status FROM calls") == [("ok",)]


# ---------------------------------------------------------------- issue 23 item 6: a key said twice
DUPLICATES = {
    "chat-messages": ("chat", b'{"model":"m","messages":[{"role":"user","content":"A"}],"messages":[{"role":"user","content":"B"}]}', "'messages'"),
    "chat-stream": ("chat", b'{"model":"m","stream":true,"stream":false,"messages":[{"role":"user","content":"A"}]}', "'stream'"),
    "chat-nested-role": ("chat", b'{"model":"m","messages":[{"role":"system","role":"user","content":"A"}]}', "'role'"),
    "chat-escaped-key": ("chat", b'{"model":"m","messages":[{"role":"user","content":"A"}],"\\u006dodel":"n"}', "'model'"),
    "responses-input": ("responses", b'{"model":"m","input":"A","input":"B"}', "'input'"),
    "messages-max_tokens": ("messages", b'{"model":"m","max_tokens":5,"max_tokens":9,"messages":[{"role":"user","content":"A"}]}', "'max_tokens'"),
    "gemini-contents": ("gemini", b'{"contents":[{"parts":[{"text":"A"}]}],"contents":[{"parts":[{"text":"B"}]}]}', "'contents'"),
}


@pytest.mark.parametrize(("api", "body", "key"), list(DUPLICATES.values()), ids=list(DUPLICATES))
def test_a_key_said_twice_is_a_400_naming_it_and_nothing_is_answered(live_proxy, script_file, api, body, key):
    """The model answered the last `messages` while the stored request showed the first (DuckDB reads the first key):
    the proxy refuses the body rather than guess, so the record is always what the model saw."""
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    resp = httpx.post(proxy.base + ROUTES[api], content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "repeats the key" in error_message(api, resp.json()) and key in error_message(api, resp.json())
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","messages":[{"role":"user","content":"a: b"}],"metadata":{"model":"x","messages":1}}',
        b'{"model":"m","messages":[{"role":"user","content":"\\u003a\\u003A::"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"\\\\u003a"}],"stream":false}',
    ],
    ids=["same-key-in-another-object", "escaped-colons", "an-escaped-backslash"],
)
def test_keys_said_once_are_served_and_stored_as_sent(live_proxy, script_file, body):
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    resp = httpx.post(proxy.base + ROUTES["chat"], content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
    assert proxy.rows("SELECT status, strlen(request::VARCHAR) FROM calls") == [("ok", len(body))]
