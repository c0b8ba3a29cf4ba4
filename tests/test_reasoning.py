"""Reasoning models: the built-in `tiny-think`, reasoning split off the sampled text and returned in each
protocol's own form, and later calls whose history drops the reasoning still splicing onto the sampled ids."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from core.backends.spec import PolicySpec
from core.errors import ConfigError
from core.models.loading import load_tokenizer
from core.models.resolve import BUILTIN_MODELS, resolve_model
from core.models.tiny_think import THINK_TOKENS
from core.tokens.continuation import Continuation, probe_incremental
from core.tokens.reasoning import QWEN3, ReasoningStream, reasoning_tags, split_reasoning
from core.train.samples import samples_for_run
from tests.harness_e2e import run_hello

THINK1 = "The user wants the files listed."
THINK2 = "The listing shows a.txt."
TURNS = [{"think": THINK1, "tool": "shell", "command": "ls"}, {"think": THINK2, "text": "Found a.txt."}]
PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages", "gemini": "/v1beta/models/policy:generateContent"}


@pytest.fixture(scope="module")
def think_tok():
    return load_tokenizer(resolve_model("tiny-think"))


def think_proxy(live_proxy, script_file, turns: list[dict] = TURNS):
    return live_proxy(f"scripted:{script_file(turns)}?tokenizer=tiny-think")


# ----------------------------------------------------------------------------- the model
def test_tiny_think_is_tiny_with_single_think_tokens_and_a_template_that_drops_earlier_reasoning(think_tok) -> None:
    tiny = load_tokenizer(resolve_model("tiny"))
    assert "tiny-think" in BUILTIN_MODELS
    assert len(think_tok) == len(tiny) + 2 and think_tok.convert_tokens_to_ids(THINK_TOKENS) == [len(tiny), len(tiny) + 1]
    text = "<think>\nls the files\n</think>\n\nDone"
    ids = think_tok.encode(text, add_special_tokens=False)
    assert ids[0] == len(tiny) and len(tiny) + 1 in ids and think_tok.decode(ids) == text
    assert think_tok.encode("hello world ls -la", add_special_tokens=False) == tiny.encode("hello world ls -la", add_special_tokens=False)
    config = json.loads((resolve_model("tiny-think") / "config.json").read_text())
    assert config["vocab_size"] == len(think_tok)

    turn = {"role": "assistant", "content": "A", "reasoning_content": "why A"}
    before_query = [{"role": "user", "content": "q1"}, turn, {"role": "user", "content": "q2"}]
    assert "why A" not in think_tok.apply_chat_template(before_query, tokenize=False)  # before the last query: dropped
    after_query = [{"role": "user", "content": "q1"}, turn, {"role": "tool", "content": "out"}]
    assert "<think>\nwhy A\n</think>\n\nA<|im_end|>" in think_tok.apply_chat_template(after_query, tokenize=False)
    last = think_tok.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}], tokenize=False)
    assert last.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n")  # the last turn: an empty think block
    assert think_tok.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True).endswith("<|im_start|>assistant\n")


# ----------------------------------------------------------------------------- the parser
SAMPLED = [  # (sampled text, whether all of it streams before the end: held-back text is owed at the finish)
    ("<think>\nplan it\n</think>\n\nanswer", True),
    ("<think>\n\n</think>\n\n<tool_call>\n{}\n</tool_call>", True),
    ("<think>\nline one\n\nline two\n</think>answer\n", True),
    ("  <think>cut short by max_tokens\n", True),
    ("no reasoning at all </think> here", True),
    ("<thin", False),
    ("<think>\na </thin not the tag\n</think>\n\n\nx", True),
    ("<think>\nends inside the close tag </thi", False),
]


@pytest.mark.parametrize(("text", "whole"), SAMPLED)
def test_streamed_reasoning_and_answer_add_up_to_the_split(text: str, whole: bool) -> None:
    reasoning, answer = split_reasoning(text, QWEN3)
    stream = ReasoningStream(QWEN3)
    got_r = got_a = ""
    for ch in text:  # one character at a time: every hold-back is exercised
        r, a = stream.feed(ch)
        assert not (a and reasoning[len(got_r) :]), "answer text before the whole reasoning"
        got_r, got_a = got_r + r, got_a + a
        assert reasoning.startswith(got_r) and answer.startswith(got_a)  # nothing streamed is ever taken back
    assert ((got_r, got_a) == (reasoning, answer)) is whole


def test_split_reasoning_cases() -> None:
    assert split_reasoning("<think>\nplan it\n</think>\n\nanswer", QWEN3) == ("plan it", "answer")
    assert split_reasoning("<think>\nunfinished", QWEN3) == ("unfinished", "")
    assert split_reasoning("plain </think> text", QWEN3) == ("", "plain </think> text")


def test_reasoning_parser_is_on_by_default_only_for_a_thinking_template(think_tok, tiny_tokenizer) -> None:
    assert reasoning_tags(think_tok, None) == QWEN3 and reasoning_tags(think_tok, "auto") == QWEN3
    assert reasoning_tags(tiny_tokenizer, None) is None and reasoning_tags(think_tok, "none") is None
    assert reasoning_tags(tiny_tokenizer, "qwen3") == QWEN3
    with pytest.raises(ConfigError, match="unknown reasoning parser 'bogus'"):
        reasoning_tags(think_tok, "bogus")
    with pytest.raises(ConfigError, match="reasoning='bogus' in the backend spec"):
        PolicySpec.parse("builtin:tiny-think?reasoning=bogus")


def test_reasoning_none_keeps_the_think_block_in_the_answer_text(live_proxy, script_file) -> None:
    proxy = live_proxy(f"scripted:{script_file(TURNS[1:])}?tokenizer=tiny-think&reasoning=none")
    status, body = post(proxy, "chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    message = body["choices"][0]["message"]
    assert status == 200 and "reasoning_content" not in message
    assert message["content"] == f"<think>\n{THINK2}\n</think>\n\nFound a.txt."


# ----------------------------------------------------------------------------- each protocol's own form
def post(proxy, api: str, body: dict) -> tuple[int, dict]:
    reply = httpx.post(f"{proxy.base}{PATHS[api]}", json=body, headers={"x-api-key": proxy.token}, timeout=120)
    return reply.status_code, reply.json()


def first_body(api: str) -> dict[str, Any]:
    """The first request of a conversation in `api`: a system prompt, one user query, a bash tool."""
    if api == "chat":
        tools = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": PARAMS}}]
        return {"model": "m", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "list the files"}], "tools": tools}
    if api == "messages":
        tools = [{"name": "bash", "description": "run", "input_schema": PARAMS}]
        return {"model": "claude-sonnet-4-5", "max_tokens": 512, "system": "sys", "messages": [{"role": "user", "content": "list the files"}], "tools": tools}
    if api == "responses":
        tools = [{"type": "function", "name": "bash", "description": "run", "parameters": PARAMS}]
        return {"model": "m", "instructions": "sys", "input": [{"role": "user", "content": "list the files"}], "tools": tools}
    tools = [{"functionDeclarations": [{"name": "bash", "description": "run", "parametersJsonSchema": PARAMS}]}]
    return {"systemInstruction": {"parts": [{"text": "sys"}]}, "contents": [{"role": "user", "parts": [{"text": "list the files"}]}], "tools": tools}


def answer_of(api: str, body: dict) -> tuple[str, str, list[tuple[str, dict]]]:
    """(reasoning, text, [(tool name, arguments)]) of a non-streamed answer, read from the protocol's own fields."""
    if api == "chat":
        msg = body["choices"][0]["message"]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
        return msg.get("reasoning_content", ""), msg["content"] or "", calls
    if api == "messages":
        blocks = body["content"]
        assert [b["type"] for b in blocks if b["type"] == "thinking"] == [b["type"] for b in blocks[:1] if b["type"] == "thinking"]  # thinking first
        assert all(b["signature"] for b in blocks if b["type"] == "thinking")
        reasoning = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        return reasoning, "".join(b["text"] for b in blocks if b["type"] == "text"), [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    if api == "responses":
        items = body["output"]
        reasoning = [c["text"] for i in items if i["type"] == "reasoning" for c in i["content"]]
        assert not reasoning or items[0]["type"] == "reasoning"
        text = "".join(c["text"] for i in items if i["type"] == "message" for c in i["content"])
        return "".join(reasoning), text, [(i["name"], json.loads(i["arguments"])) for i in items if i["type"] == "function_call"]
    parts = body["candidates"][0]["content"]["parts"]
    reasoning = "".join(p["text"] for p in parts if p.get("thought"))
    text = "".join(p["text"] for p in parts if "text" in p and not p.get("thought"))
    return reasoning, text, [(p["functionCall"]["name"], p["functionCall"]["args"]) for p in parts if "functionCall" in p]


def resend(api: str, body: dict, answer: dict, keep: bool, then: str | None = None) -> dict[str, Any]:
    """`body` with the answer appended as a harness resends it (its reasoning kept in the protocol's form or dropped),
    then the tool's output (`then` None) or a new user query."""
    body = json.loads(json.dumps(body))
    if api == "chat":
        msg = answer["choices"][0]["message"]
        turn = {"role": "assistant", "content": msg["content"], **({"tool_calls": msg["tool_calls"]} if msg.get("tool_calls") else {})}
        if keep:
            turn["reasoning_content"] = msg["reasoning_content"]
        after = {"role": "user", "content": then} if then else {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "a.txt"}
        body["messages"] += [turn, after]
    elif api == "messages":
        blocks = [b for b in answer["content"] if keep or b["type"] != "thinking"]
        uses = [b for b in blocks if b["type"] == "tool_use"]
        after = then if then else [{"type": "tool_result", "tool_use_id": uses[0]["id"], "content": "a.txt"}]
        body["messages"] += [{"role": "assistant", "content": blocks}, {"role": "user", "content": after}]
    elif api == "responses":
        items = [i for i in answer["output"] if keep or i["type"] != "reasoning"]
        calls = [i for i in items if i["type"] == "function_call"]
        after = {"role": "user", "content": then} if then else {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "a.txt"}
        body["input"] += [*items, after]
    else:
        parts = [p for p in answer["candidates"][0]["content"]["parts"] if keep or not p.get("thought")]
        calls = [p["functionCall"] for p in parts if "functionCall" in p]
        after = [{"text": then}] if then else [{"functionResponse": {"name": calls[0]["name"], "id": calls[0]["id"], "response": {"output": "a.txt"}}}]
        body["contents"] += [{"role": "model", "parts": parts}, {"role": "user", "parts": after}]
    return body


def assert_one_sample(proxy, tok) -> list[tuple]:
    """The rollout's calls merged into one sample: the later prompt starts with the earlier prompt + sampled ids
    (think tokens included), the loss mask covers exactly the sampled ids."""
    rows = proxy.rows("SELECT call_id, branch, extends_parent, parent_call_id, prompt_token_ids, completion_token_ids FROM calls_full ORDER BY seq")
    assert len(rows) == 2
    (id1, b1, _, _, p1, c1), (_, b2, ext2, parent2, p2, c2) = rows
    assert (b2, ext2, parent2) == (b1, True, id1)
    assert p2[: len(p1) + len(c1)] == p1 + c1
    think_open, think_close = tok.convert_tokens_to_ids(THINK_TOKENS)
    assert c1[0] == think_open and think_close in c1 and c2[0] == think_open  # the sampled reasoning stays in the ids
    assert tok.decode(c1).startswith(f"<think>\n{THINK1}\n</think>\n\n")
    proxy.store.upsert_rollout({"rollout_id": "rollout-1", "run_id": "run-test", "status": "done", "reward": 1.0, "token": proxy.token})
    (sample,) = samples_for_run(proxy.store, "run-test")
    assert sample.n_calls == 2
    assert list(sample.token_ids) == p2 + c2
    new = len(p2) - len(p1) - len(c1)
    assert list(sample.loss_mask) == [0] * len(p1) + [1] * len(c1) + [0] * new + [1] * len(c2)
    return rows


@pytest.mark.parametrize("keep", [False, True], ids=["history-without-reasoning", "history-with-reasoning"])
@pytest.mark.parametrize("api", ["chat", "messages", "responses", "gemini"])
def test_reasoning_comes_back_in_the_protocols_form_and_calls_merge(api: str, keep: bool, live_proxy, script_file, think_tok) -> None:
    proxy = think_proxy(live_proxy, script_file)
    body = first_body(api)
    status, first = post(proxy, api, body)
    assert status == 200, first
    assert answer_of(api, first) == (THINK1, "", [("bash", {"command": "ls"})])
    status, second = post(proxy, api, resend(api, body, first, keep))
    assert status == 200, second
    assert answer_of(api, second) == (THINK2, "Found a.txt.", [])
    rows = assert_one_sample(proxy, think_tok)
    new_text = think_tok.decode(rows[1][4][len(rows[0][4]) + len(rows[0][5]) :])
    assert new_text.startswith("\n<|im_start|>user\n<tool_response>\n") and new_text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("api", ["chat", "messages", "responses", "gemini"])
def test_a_new_user_query_after_a_thinking_turn_still_merges(api: str, live_proxy, script_file, think_tok) -> None:
    # the template now drops the first turn's reasoning altogether (it is before the last query)
    turns = [{"think": THINK1, "text": "Hello."}, {"think": THINK2, "text": "Found a.txt."}]
    proxy = think_proxy(live_proxy, script_file, turns)
    body = first_body(api)
    status, first = post(proxy, api, body)
    assert status == 200 and answer_of(api, first) == (THINK1, "Hello.", [])
    status, second = post(proxy, api, resend(api, body, first, keep=False, then="and now?"))
    assert status == 200 and answer_of(api, second) == (THINK2, "Found a.txt.", [])
    rows = assert_one_sample(proxy, think_tok)
    assert think_tok.decode(rows[1][4]).endswith("Hello.<|im_end|>\n<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n")


# ----------------------------------------------------------------------------- streamed, read by the official clients
def test_chat_stream_sends_reasoning_content_first(live_proxy, script_file) -> None:
    proxy = think_proxy(live_proxy, script_file)
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    chunks = list(client.chat.completions.create(stream=True, **first_body("chat")))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [d.model_extra.get("reasoning_content") for d in deltas if d.model_extra.get("reasoning_content")]
    assert "".join(reasoning) == THINK1
    first_call = next(i for i, d in enumerate(deltas) if d.tool_calls)
    assert max(i for i, d in enumerate(deltas) if d.model_extra.get("reasoning_content")) < first_call


def test_messages_stream_has_a_signed_thinking_block_first_and_claude_codes_resend_merges(live_proxy, script_file, think_tok) -> None:
    proxy = think_proxy(live_proxy, script_file)
    client = anthropic.Anthropic(base_url=proxy.base, api_key="unused")
    body = first_body("messages")
    with client.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"] and final.stop_reason == "tool_use"
    assert final.content[0].thinking == THINK1 and final.content[0].signature
    # Claude Code sends its history back with the thinking block, signature and all
    resent = {"content": [b.model_dump(exclude_none=True) for b in final.content]}
    with client.messages.stream(**resend("messages", body, resent, keep=True)) as stream:
        second = stream.get_final_message()
    assert [b.type for b in second.content] == ["thinking", "text"] and second.content[1].text == "Found a.txt."
    assert_one_sample(proxy, think_tok)


def test_responses_stream_has_a_reasoning_item_first_and_codexs_resend_merges(live_proxy, script_file, think_tok) -> None:
    proxy = think_proxy(live_proxy, script_file)
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    body = first_body("responses")
    events = list(client.responses.create(stream=True, **body))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == THINK1
    final = events[-1].response
    assert [i.type for i in final.output] == ["reasoning", "function_call"]
    assert final.output[0].content[0].text == THINK1
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == [0, 1]
    resent = {"output": [i.model_dump(exclude_none=True) for i in final.output]}  # Codex resends its reasoning items
    events = list(client.responses.create(stream=True, **resend("responses", body, resent, keep=True)))
    assert events[-1].response.output_text == "Found a.txt."
    assert_one_sample(proxy, think_tok)


def test_gemini_stream_sends_thought_parts_first(live_proxy, script_file) -> None:
    proxy = think_proxy(live_proxy, script_file)
    url = f"{proxy.base}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    with httpx.stream("POST", url, json=first_body("gemini"), headers={"x-goog-api-key": proxy.token}, timeout=60) as resp:
        frames = [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]
    parts = [p for f in frames for p in f["candidates"][0]["content"]["parts"]]
    thoughts = [i for i, p in enumerate(parts) if p.get("thought")]
    assert "".join(parts[i]["text"] for i in thoughts) == THINK1
    assert max(thoughts) < min(i for i, p in enumerate(parts) if "functionCall" in p)


# ----------------------------------------------------------------------------- the continuation itself
def test_the_thinking_template_renders_incrementally_and_equals_the_full_render(think_tok) -> None:
    assert probe_incremental(think_tok)
    cont = Continuation(think_tok)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": PARAMS}}]
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "list"}]
    plan = cont.plan(messages, tools)
    completion = think_tok.encode(f'<think>\n{THINK1}\n</think>\n\n<tool_call>\n{{"name": "bash", "arguments": {{"command": "ls"}}}}\n</tool_call><|im_end|>', add_special_tokens=False)
    answer = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}
    cont.remember("call-1", plan, messages, tools, answer, completion)
    later = [*messages, answer, {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    spliced, full = cont.plan(later, tools), cont.plan_full(later, tools)
    assert spliced.prompt_ids == full.prompt_ids and spliced.extends_parent and spliced.parent_call_id == "call-1"
    assert spliced.prompt_ids[: len(plan.prompt_ids) + len(completion)] == plan.prompt_ids + completion


# ----------------------------------------------------------------------------- real harnesses in Docker
THINK_HELLO = [
    {"think": "The task wants hello.txt holding hi: one shell command.", "tool": "shell", "command": "echo hi > hello.txt"},
    {"think": "The command ran; the file is there.", "text": "I created hello.txt containing hi."},
]


def assert_thinking_run(res, api: str, think_tok) -> None:
    """A scripted thinking run solved the task, its calls merged into one sample with the think tokens in it."""
    res.assert_solved(api)
    think_open, think_close = think_tok.convert_tokens_to_ids(THINK_TOKENS)
    for call in res.calls:
        assert call["completion_token_ids"][0] == think_open and think_close in call["completion_token_ids"]
    res.assert_one_sample()
    (sample,) = res.samples
    assert sum(sample.loss_mask) == sum(c["completion_tokens"] for c in res.calls)  # every sampled id, reasoning included


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the 235 MB npm tree
def test_claude_code_with_a_thinking_model_merges_into_one_sample(docker_client, base_image, tmp_path, think_tok) -> None:
    res = run_hello("claude-code", "scripted", tmp_path, script=THINK_HELLO, tokenizer="tiny-think")
    answer = res.body(0, "response")
    assert [b["type"] for b in answer["content"]] == ["thinking", "tool_use"] and answer["content"][0]["thinking"] == THINK_HELLO[0]["think"]
    assert_thinking_run(res, "messages", think_tok)
    resent = [b["type"] for m in res.body(1, "request")["messages"] if m["role"] == "assistant" for b in m["content"]]
    print(f"claude-code thinking: {len(res.calls)} calls in one sample; the second request resends the answer as {resent}")


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the 424 MB npm tree
def test_codex_with_a_thinking_model_merges_into_one_sample(docker_client, base_image, tmp_path, think_tok) -> None:
    res = run_hello("codex", "scripted", tmp_path, script=THINK_HELLO, tokenizer="tiny-think")
    answer = res.body(0, "response")
    assert [i["type"] for i in answer["output"]] == ["reasoning", "function_call"]
    assert answer["output"][0]["content"] == [{"type": "reasoning_text", "text": THINK_HELLO[0]["think"]}]
    assert_thinking_run(res, "responses", think_tok)
    resent = [i.get("type", "message") for i in res.body(1, "request")["input"]]
    print(f"codex thinking: {len(res.calls)} calls in one sample; the second request's input items: {resent}")
