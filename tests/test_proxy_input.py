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
}


@pytest.mark.parametrize("case", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_values_in_range_are_served(live_proxy, script_file, case):
    api, body = case
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    resp = httpx.post(proxy.base + ROUTES[api], json=body)
    assert resp.status_code == 200, resp.text
    assert proxy.rows("SELECT status FROM calls") == [("ok",)]
