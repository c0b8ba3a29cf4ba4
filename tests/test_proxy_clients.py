"""The proxy against the official SDKs: every protocol, streaming and not, tools round-tripped, rows checked."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from core.protocols.registry import get_protocol
from core.tokens.template import encode, render_chat

SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
TURNS = [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "Created hello.txt."}]


def rendered_ids(tokenizer, api: str, body: dict, **kw) -> list[int]:
    """What the policy's tokenizer makes of a request body: the prompt the proxy must have sent."""
    req = get_protocol(api).parse_request(body, **kw)
    return encode(tokenizer, render_chat(tokenizer, req.messages, req.tools, add_generation_prompt=True))


def test_chat_non_streaming_tool_round_trip(live_proxy, script_file, tiny_tokenizer):
    proxy = live_proxy(f"scripted:{script_file(TURNS)}")
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "make hello.txt"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[SHELL_TOOL])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "echo hi > hello.txt"}

    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": ""}]
    second = client.chat.completions.create(model="policy", messages=messages, tools=[SHELL_TOOL])
    assert second.choices[0].message.content == "Created hello.txt."
    assert second.usage.prompt_tokens > first.usage.prompt_tokens

    rows = proxy.rows(
        "SELECT seq, api, status, token_ids(prompt_token_ids), token_ids(completion_token_ids), completion_logprobs, branch, extends_parent, parent_call_id, call_id "
        "FROM calls ORDER BY seq"
    )
    assert [(r[0], r[1], r[2]) for r in rows] == [(0, "chat", "ok"), (1, "chat", "ok")]
    p1, c1, lp1 = rows[0][3], rows[0][4], rows[0][5]
    body1 = {"model": "policy", "messages": messages[:2], "tools": [SHELL_TOOL]}
    assert p1 == rendered_ids(tiny_tokenizer, "chat", body1)
    assert len(lp1) == len(c1) > 0
    assert c1[-1] == tiny_tokenizer.eos_token_id
    # token-exact continuation: call 2's prompt starts with call 1's prompt + completion
    p2 = rows[1][3]
    assert p2[: len(p1) + len(c1)] == p1 + c1
    assert rows[1][6] == 0 and rows[1][7] is True and rows[1][8] == rows[0][9]


def test_chat_streaming_with_usage(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file(TURNS)}")
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "go"}], tools=[SHELL_TOOL], stream=True, stream_options={"include_usage": True}
    )
    names, args, finish, usage = [], "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                if tc.function.name:
                    names.append(tc.function.name)
                args += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert names == ["bash"] and json.loads(args) == {"command": "echo hi > hello.txt"}
    assert finish == "tool_calls" and usage.completion_tokens > 0
    (row,) = proxy.rows("SELECT status, stream, len(completion_token_ids), ttft_ms FROM calls")
    assert row[0] == "ok" and row[1] is True and row[2] == usage.completion_tokens and row[3] is not None


def test_responses_streaming_function_call(live_proxy, script_file, tiny_tokenizer):
    proxy = live_proxy(f"scripted:{script_file(TURNS)}")
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    tools = [{"type": "function", "name": "exec_command", "description": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
    body = {"model": "policy", "instructions": "Be brief.", "input": "make hello.txt", "tools": tools}
    events = list(client.responses.create(stream=True, **body))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    final = events[-1].response
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "exec_command"
    assert json.loads(calls[0].arguments) == {"cmd": "echo hi > hello.txt"}

    follow = client.responses.create(
        model="policy",
        instructions="Be brief.",
        tools=tools,
        input=[
            {"role": "user", "content": "make hello.txt"},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "exec_command", "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "done"},
        ],
    )
    assert follow.output_text == "Created hello.txt."
    rows = proxy.rows("SELECT api, token_ids(prompt_token_ids), token_ids(completion_token_ids), extends_parent FROM calls ORDER BY seq")
    assert rows[0][0] == "responses" and rows[0][1] == rendered_ids(tiny_tokenizer, "responses", {**body, "stream": True})
    assert rows[1][1][: len(rows[0][1]) + len(rows[0][2])] == rows[0][1] + rows[0][2] and rows[1][3] is True


def test_messages_streaming_tool_use(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file(TURNS)}")
    client = anthropic.Anthropic(base_url=proxy.base, api_key="unused")
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    msgs = [{"role": "user", "content": "make hello.txt"}]
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=512, system="terse", messages=msgs, tools=tools) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (tool_use,) = [b for b in final.content if b.type == "tool_use"]
    assert tool_use.name == "Bash" and tool_use.input == {"command": "echo hi > hello.txt"}

    msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "ok"}]},
    ]
    second = client.messages.create(model="claude-sonnet-4-5", max_tokens=512, system="terse", messages=msgs, tools=tools)
    assert second.content[0].text == "Created hello.txt." and second.stop_reason == "end_turn"
    count = client.messages.count_tokens(model="claude-sonnet-4-5", system="terse", messages=msgs, tools=tools)
    rows = proxy.rows("SELECT api, len(prompt_token_ids), extends_parent FROM calls ORDER BY seq")
    assert [r[0] for r in rows] == ["messages", "messages"] and rows[1][2] is True
    assert count.input_tokens == rows[1][1]


def test_gemini_stream_and_function_response(live_proxy, script_file):
    proxy = live_proxy(f"scripted:{script_file(TURNS)}")
    tools = [{"functionDeclarations": [{"name": "run_shell_command", "description": "run", "parametersJsonSchema": {"type": "object", "properties": {"command": {"type": "string"}}}}]}]
    body = {"contents": [{"role": "user", "parts": [{"text": "make hello.txt"}]}], "tools": tools, "systemInstruction": {"parts": [{"text": "terse"}]}}
    url = f"{proxy.url}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    with httpx.stream("POST", url, json=body, headers={"x-goog-api-key": proxy.token}, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        frames = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
    parts = [p for f in frames for c in f.get("candidates", []) for p in c["content"].get("parts", [])]
    (fc,) = [p["functionCall"] for p in parts if "functionCall" in p]
    assert fc["name"] == "run_shell_command" and fc["args"] == {"command": "echo hi > hello.txt"}
    assert frames[-1]["candidates"][0]["finishReason"] == "STOP"

    body["contents"] += [{"role": "model", "parts": [{"functionCall": fc}]}, {"role": "user", "parts": [{"functionResponse": {"name": fc["name"], "response": {"output": "ok"}}}]}]
    resp = httpx.post(f"{proxy.url}/r/{proxy.token}/v1beta/models/gemini-2.5-pro:generateContent", json=body, timeout=60)
    assert resp.status_code == 200
    assert resp.json()["candidates"][0]["content"]["parts"][0]["text"] == "Created hello.txt."
    rows = proxy.rows("SELECT api, model, stream, extends_parent FROM calls ORDER BY seq")
    assert rows == [("gemini", "gemini-2.5-pro", True, False), ("gemini", "gemini-2.5-pro", False, True)]


@pytest.mark.parametrize("api_key_header", ["authorization", "x-api-key"])
def test_token_accepted_as_api_key(live_proxy, script_file, api_key_header):
    proxy = live_proxy(f"scripted:{script_file(TURNS)}")
    value = f"Bearer {proxy.token}" if api_key_header == "authorization" else proxy.token
    resp = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, headers={api_key_header: value})
    assert resp.status_code == 200
    assert proxy.rows("SELECT rollout_id FROM calls") == [("rollout-1",)]


def test_template_without_tool_support_gets_hermes_tools_in_system(tiny_tokenizer):
    """A chat template that drops `tools` (SmolLM2's) still shows the model the tools, and the prefix property holds."""
    from transformers import AutoTokenizer

    from core.tokens.template import template_renders_tools

    plain = AutoTokenizer.from_pretrained(tiny_tokenizer.name_or_path)
    plain.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert template_renders_tools(tiny_tokenizer) and not template_renders_tools(plain)
    msgs = [{"role": "user", "content": "hi"}]
    first = render_chat(plain, msgs, [SHELL_TOOL], add_generation_prompt=True)
    assert '"name": "bash"' in first and "<tool_call>" in first and first.startswith("<|im_start|>system\n# Tools")
    longer = render_chat(plain, [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}], [SHELL_TOOL], add_generation_prompt=True)
    assert longer.startswith(render_chat(plain, msgs, [SHELL_TOOL], add_generation_prompt=False))


def test_a_cap_the_proxy_imposed_is_not_incomplete_for_codex(live_proxy):
    """Codex fails a turn on `response.incomplete`: only a limit the client asked for may surface as one."""
    proxy = live_proxy("builtin:tiny?max_tokens=3")
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    ours = list(client.responses.create(model="m", input="hi", stream=True, temperature=0))
    assert ours[-1].type == "response.completed" and ours[-1].response.status == "completed"
    theirs = list(client.responses.create(model="m", input="hi", stream=True, temperature=0, max_output_tokens=3))
    assert theirs[-1].type == "response.incomplete" and theirs[-1].response.incomplete_details.reason == "max_output_tokens"
    rows = proxy.rows("SELECT finish_reason, len(completion_token_ids) FROM calls ORDER BY seq")
    assert rows == [("length", 3), ("length", 3)]  # the store keeps the truth either way
