"""Token backends: builtin (transformers), scripted, serve-model + VllmBackend over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.backends.base import GenerationContext, SamplingParams, TokenChunk
from core.backends.builtin import BuiltinBackend
from core.backends.scripted import (
    ScriptedBackend,
    find_shell_tool,
    load_script,
    render_turn,
    shell_call,
    write_call,
)
from core.backends.spec import PolicySpec, build_token_backend
from core.backends.vllm import VllmBackend
from core.chat import ChatRequest
from core.errors import BackendError, ConfigError, ContextLengthError
from core.models.tiny import ensure_tiny_model
from core.proxy.model_server import build_model_app
from tests.conftest import HARNESS_REQUESTS  # noqa: E402
from tests.loopback import serving  # noqa: E402

FIXTURES = HARNESS_REQUESTS


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, built once per session (passed to backends as a folder)."""
    return ensure_tiny_model(root=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def builtin(tiny_dir: Path) -> BuiltinBackend:
    return BuiltinBackend(str(tiny_dir), device="cpu")


def ctx(session: str = "s1", tools: list[dict[str, Any]] | None = None) -> GenerationContext:
    return GenerationContext(
        session=session,
        call_seq=0,
        request=ChatRequest(api="chat", model="m", messages=[], tools=tools or []),
    )


def prompt_ids(backend, text: str = "Say hello") -> list[int]:
    rendered = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(backend.tokenizer(rendered, add_special_tokens=False)["input_ids"])


async def collect(gen) -> tuple[list[int], list[float], list[TokenChunk]]:
    chunks = [c async for c in gen]
    return [t for c in chunks for t in c.token_ids], [x for c in chunks for x in c.logprobs], chunks


# ---------------------------------------------------------------- builtin


async def test_builtin_generates_tokens_with_logprobs(builtin: BuiltinBackend) -> None:
    ids, lps, chunks = await collect(
        builtin.generate(prompt_ids(builtin), SamplingParams(max_tokens=12, seed=3), ctx())
    )
    assert 1 <= len(ids) <= 12 and len(lps) == len(ids)
    assert all(lp <= 0.0 for lp in lps)
    assert all(0 <= t < len(builtin.tokenizer) for t in ids)
    assert chunks[-1].finish_reason in ("stop", "length")
    assert all(c.finish_reason is None for c in chunks[:-1])
    if chunks[-1].finish_reason == "length":
        assert len(ids) == 12


async def test_builtin_greedy_and_seeded_sampling_are_deterministic(builtin: BuiltinBackend) -> None:
    p = prompt_ids(builtin)
    greedy = [
        await collect(builtin.generate(p, SamplingParams(max_tokens=10, temperature=0.0), ctx()))
        for _ in range(2)
    ]
    # the same tokens; logprobs to rounding (the second call reuses the cached prompt and may verify other drafts)
    assert greedy[0][0] == greedy[1][0] and greedy[0][1] == pytest.approx(greedy[1][1], abs=1e-5)
    seeded = [
        await collect(builtin.generate(p, SamplingParams(max_tokens=10, seed=7, top_p=0.9), ctx()))
        for _ in range(2)
    ]
    assert seeded[0][0] == seeded[1][0]
    other = await collect(builtin.generate(p, SamplingParams(max_tokens=10, seed=8), ctx()))
    assert other[0] != seeded[0][0]


async def test_builtin_logprobs_match_a_full_forward_pass(builtin: BuiltinBackend) -> None:
    import torch

    p = prompt_ids(builtin)
    ids, lps, _ = await collect(
        builtin.generate(p, SamplingParams(max_tokens=6, temperature=0.7, seed=1), ctx())
    )
    with torch.inference_mode():
        logits = builtin.model(input_ids=torch.tensor([p + ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(p) - 1 : -1] / 0.7, dim=-1)
    recomputed = [float(expected[i, t]) for i, t in enumerate(ids)]
    assert recomputed == pytest.approx(lps, abs=1e-4)


async def test_builtin_max_tokens_and_stop_tokens(builtin: BuiltinBackend) -> None:
    p = prompt_ids(builtin)
    ids, _, chunks = await collect(builtin.generate(p, SamplingParams(max_tokens=5, temperature=0.0), ctx()))
    assert len(ids) == 5 and chunks[-1].finish_reason == "length"
    stop_at = ids[2]
    cut, _, chunks = await collect(
        builtin.generate(p, SamplingParams(max_tokens=5, temperature=0.0, stop_token_ids=[stop_at]), ctx())
    )
    assert cut == ids[: ids.index(stop_at) + 1]  # the stop token is included
    assert chunks[-1].finish_reason == "stop"


async def test_builtin_context_overflow(builtin: BuiltinBackend) -> None:
    with pytest.raises(ContextLengthError) as err:
        async for _ in builtin.generate([5] * builtin.context_length, SamplingParams(max_tokens=4), ctx()):
            pass
    assert err.value.prompt_tokens == builtin.context_length
    assert err.value.limit < builtin.context_length


async def test_builtin_cancellation_stops_the_worker(builtin: BuiltinBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # a generation that cannot end by itself: the random tiny model samples its end token every few thousand
    # tokens, and on a busy machine the worker had sampled it (and finished) before the cancel landed
    monkeypatch.setattr(builtin, "eos_token_ids", set())
    started = asyncio.Event()
    before = builtin.tokens_generated

    async def consume() -> None:
        async for _ in builtin.generate(
            prompt_ids(builtin), SamplingParams(max_tokens=100_000, temperature=1.0), ctx()
        ):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(builtin.wait_idle(), 60)
    produced = builtin.tokens_generated - before
    assert 1 <= produced < 100_000
    # the worker is free again
    ids, _, _ = await collect(
        builtin.generate(prompt_ids(builtin), SamplingParams(max_tokens=3, temperature=0), ctx())
    )
    assert len(ids) >= 1


async def test_builtin_reload_weights(tiny_dir: Path) -> None:
    import torch

    backend = BuiltinBackend(str(tiny_dir), device="cpu")
    p = prompt_ids(backend)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    base, base_lps, _ = await collect(backend.generate(p, greedy, ctx()))
    original = {k: v.clone() for k, v in backend.model.state_dict().items()}
    changed = {k: v + torch.randn_like(v) * 0.5 for k, v in original.items()}
    backend.reload_weights(changed)
    assert backend.weights_version == 1
    _, new_lps, _ = await collect(backend.generate(p, greedy, ctx()))
    assert new_lps != base_lps
    backend.reload_weights(tiny_dir)  # back to the saved weights, from the folder
    again, again_lps, _ = await collect(backend.generate(p, greedy, ctx()))
    assert again == base and again_lps == pytest.approx(base_lps, abs=1e-6)
    await backend.aclose()


async def test_builtin_dtype_and_prefix_cache_come_from_the_spec(tiny_dir: Path) -> None:
    import torch

    from core.backends.spec import PolicySpec, build_token_backend
    from core.config import PolicyConfig

    default = build_token_backend(PolicySpec.parse(f"builtin:{tiny_dir}?device=cpu"))
    assert default.model.dtype == torch.float32 and default._loop._batch.prefix is not None  # auto on a CPU
    policy = PolicyConfig(backend=f"builtin:{tiny_dir}?device=cpu&prefix_cache_mb=0", dtype="bfloat16")  # policy.dtype
    half = build_token_backend(policy.spec)
    assert half.model.dtype == torch.bfloat16 and half._loop._batch.prefix is None
    p = prompt_ids(half)
    ids, lps, _ = await collect(half.generate(p, SamplingParams(max_tokens=6, temperature=1.0, seed=2), ctx()))
    with torch.inference_mode():  # bfloat16 end to end: the logprobs are the bfloat16 model's own
        logits = half.model(input_ids=torch.tensor([p + ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(p) - 1 : -1], dim=-1)[torch.arange(len(ids)), torch.tensor(ids)]
    assert lps == pytest.approx(expected.tolist(), abs=0.05)
    with pytest.raises(ConfigError, match="unknown dtype"):
        build_token_backend(PolicySpec.parse(f"builtin:{tiny_dir}?device=cpu&dtype=bf16"))
    assert PolicyConfig(backend=f"builtin:{tiny_dir}?dtype=float32", dtype="bfloat16").spec.options["dtype"] == "float32"  # the spec's own wins
    for backend in (default, half):
        await backend.aclose()


# ---------------------------------------------------------------- scripted


def fixture_tools(name: str) -> list[dict[str, Any]]:
    """The first request's tools of a harness fixture, as canonical OpenAI function tools."""
    for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines():
        body = json.loads(line).get("body")
        if isinstance(body, str):
            body = json.loads(body)
        if not body or not body.get("tools"):
            continue
        out = []
        for tool in body["tools"]:
            decls = tool.get("functionDeclarations") or (
                [tool.get("function", tool)]
                if "type" not in tool or tool.get("type") == "function" or "input_schema" in tool
                else []
            )
            for d in decls:
                params = d.get("parameters") or d.get("input_schema") or d.get("parametersJsonSchema") or {}
                out.append(
                    {
                        "type": "function",
                        "function": {
                            "name": d["name"],
                            "description": d.get("description", ""),
                            "parameters": params,
                        },
                    }
                )
        return out
    raise AssertionError(f"no tools in {name}")


@pytest.mark.parametrize(
    ("harness", "tool", "param", "value"),
    [
        ("codex", "exec_command", "cmd", "echo hi > hello.txt"),
        ("claude-code", "Bash", "command", "echo hi > hello.txt"),
        ("gemini-cli", "run_shell_command", "command", "echo hi > hello.txt"),
        ("mini-swe-agent", "bash", "command", "echo hi > hello.txt"),
        ("opencode", "bash", "command", "echo hi > hello.txt"),
        ("openclaw-chat", "exec", "command", "echo hi > hello.txt"),
        ("pi", "bash", "command", "echo hi > hello.txt"),
    ],
)
def test_scripted_finds_the_shell_tool(harness: str, tool: str, param: str, value: str) -> None:
    tools = fixture_tools(harness)
    call = shell_call(tools, "echo hi > hello.txt")
    assert call is not None and call["name"] == tool
    assert call["arguments"][param] == value
    fn = find_shell_tool(tools)[0]
    assert set(fn["parameters"].get("required", [])) <= set(call["arguments"])


def test_scripted_shell_array_param_and_write_tools() -> None:
    arr = [
        {
            "type": "function",
            "function": {
                "name": "shell",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                    "required": ["command"],
                },
            },
        }
    ]
    assert shell_call(arr, "ls")["arguments"] == {"command": ["bash", "-lc", "ls"]}
    assert write_call(fixture_tools("claude-code"), "/w/a.txt", "x")["arguments"] == {
        "file_path": "/w/a.txt",
        "content": "x",
    }
    assert write_call(fixture_tools("opencode"), "a.txt", "x") == {
        "name": "write",
        "arguments": {"filePath": "a.txt", "content": "x"},
    }
    assert write_call(fixture_tools("gemini-cli"), "a.txt", "x")["name"] == "write_file"
    codex = write_call(fixture_tools("codex"), "a b.txt", "it's")  # no write tool: printf through the shell
    assert codex["name"] == "exec_command"
    assert codex["arguments"]["cmd"] == "printf '%s' 'it'\"'\"'s' > 'a b.txt'"
    assert shell_call([], "ls") is None


async def test_scripted_backend_plays_turns_through_the_tokenizer(tmp_path: Path, tiny_dir: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            {
                "turns": [
                    {"tool": "shell", "command": "echo hi > hello.txt"},
                    {"text": "Writing.", "tool": "write_file", "path": "b.txt", "content": "two"},
                    {"tool_call": {"name": "view_image", "arguments": {"path": "x.png"}}},
                    {"text": "All done."},
                ]
            }
        )
    )
    backend = ScriptedBackend(script, tokenizer_model=str(tiny_dir))
    tools = fixture_tools("codex")
    eos = backend.tokenizer.eos_token_id
    texts = []
    for _ in range(6):
        ids, lps, chunks = await collect(
            backend.generate([1, 2], SamplingParams(max_tokens=4096), ctx("a", tools))
        )
        assert ids[-1] == eos and lps == [0.0] * len(ids)
        assert chunks[-1].finish_reason == "stop" and len(chunks) > 1
        texts.append(backend.tokenizer.decode(ids[:-1]))
    assert (
        texts[0]
        == '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}\n</tool_call>'
    )
    assert texts[1].startswith(
        'Writing.\n<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "printf '
    )
    assert texts[2] == '<tool_call>\n{"name": "view_image", "arguments": {"path": "x.png"}}\n</tool_call>'
    assert texts[3] == texts[4] == texts[5] == "All done."
    # sessions count separately
    ids, _, _ = await collect(backend.generate([1], SamplingParams(max_tokens=4096), ctx("b", tools)))
    assert backend.tokenizer.decode(ids[:-1]) == texts[0]
    # max_tokens cuts the scripted answer
    ids, _, chunks = await collect(backend.generate([1], SamplingParams(max_tokens=3), ctx("c", tools)))
    assert len(ids) == 3 and chunks[-1].finish_reason == "length"


async def test_scripted_toml_list_and_loop(tmp_path: Path, tiny_dir: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('loop = true\n[[turns]]\ntext = "one"\n[[turns]]\ntext = "two"\n')
    backend = ScriptedBackend(toml, tokenizer_model=str(tiny_dir))
    got = []
    for _ in range(3):
        ids, _, _ = await collect(backend.generate([1], SamplingParams(max_tokens=64), ctx()))
        got.append(backend.tokenizer.decode(ids, skip_special_tokens=True))
    assert got == ["one", "two", "one"]
    listed = tmp_path / "l.json"
    listed.write_text(json.dumps([{"tool": "shell", "command": "ls"}]))
    turns, loop = load_script(listed)
    assert turns == [{"tool": "shell", "command": "ls"}] and loop is False
    backend = ScriptedBackend(listed, tokenizer_model=str(tiny_dir))
    await collect(backend.generate([1], SamplingParams(max_tokens=64), ctx()))
    ids, _, _ = await collect(backend.generate([1], SamplingParams(max_tokens=64), ctx()))
    assert backend.tokenizer.decode(ids, skip_special_tokens=True) == "done"
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": [{"say": "x"}]}')
    with pytest.raises(ConfigError, match="turn 0"):
        load_script(bad)


def test_render_turn_matches_the_chat_template(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    calls = [{"name": "bash", "arguments": {"command": "ls -la"}}]
    sampled = render_turn("Looking.", calls) + tok.eos_token
    msgs = [{"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    history = tok.apply_chat_template(
        msgs
        + [
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps(calls[0]["arguments"])},
                    }
                ],
            }
        ],
        tokenize=False,
    )
    assert history.startswith(prompt + sampled)


# ---------------------------------------------------------------- serve-model + VllmBackend


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_serve_model_routes(builtin: BuiltinBackend) -> None:
    async with (
        serving(build_model_app(builtin, model_name="tiny")) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        assert (await client.get("/health")).status_code == 200
        models = (await client.get("/v1/models")).json()
        assert (
            models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == builtin.context_length
        )
        p = prompt_ids(builtin)
        tokenized = (await client.post("/tokenize", json={"prompt": builtin.tokenizer.decode(p)})).json()
        assert tokenized["tokens"] == p
        r = await client.post(
            "/v1/completions",
            json={"prompt": p, "max_tokens": 6, "temperature": 0, "logprobs": 0, "return_token_ids": True},
        )
        body = r.json()
        choice = body["choices"][0]
        assert r.status_code == 200 and body["object"] == "text_completion"
        assert choice["prompt_token_ids"] == p and body["prompt_token_ids"] == p
        assert (
            len(choice["token_ids"])
            == len(choice["logprobs"]["token_logprobs"])
            == len(choice["logprobs"]["tokens"])
        )
        assert choice["finish_reason"] in ("stop", "length") and body["usage"]["prompt_tokens"] == len(p)
        direct, direct_lps, _ = await collect(
            builtin.generate(p, SamplingParams(max_tokens=6, temperature=0), ctx())
        )
        assert choice["token_ids"] == direct
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(direct_lps, abs=1e-5)
        text = await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert text.status_code == 200 and "token_ids" not in text.json()["choices"][0]
        bad = await client.post("/v1/completions", json={"prompt": [], "max_tokens": 2})
        assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]
        too_long = await client.post(
            "/v1/completions", json={"prompt": [5] * builtin.context_length, "max_tokens": 2}
        )
        assert too_long.status_code == 400 and "context length" in too_long.json()["error"]["message"]
        # raw SSE stream
        async with client.stream(
            "POST",
            "/v1/completions",
            json={
                "prompt": p,
                "max_tokens": 5,
                "temperature": 0,
                "stream": True,
                "logprobs": 0,
                "return_token_ids": True,
                "stream_options": {"include_usage": True},
            },
        ) as stream:
            lines = [line async for line in stream.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert events[0]["choices"][0]["prompt_token_ids"] == p
        assert all("prompt_token_ids" not in e["choices"][0] for e in events[1:-1])
        assert [t for e in events[:-1] for t in e["choices"][0]["token_ids"]] == direct[:5]
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5


async def test_vllm_backend_against_serve_model(builtin: BuiltinBackend, tiny_dir: Path) -> None:
    async with serving(build_model_app(builtin)) as url:
        backend = VllmBackend(url + "/v1", tokenizer_model=str(tiny_dir))
        assert backend.context_length == builtin.context_length
        p = prompt_ids(backend)
        try:
            ids, lps, chunks = await collect(
                backend.generate(p, SamplingParams(max_tokens=8, temperature=0), ctx())
            )
            direct, direct_lps, _ = await collect(
                builtin.generate(p, SamplingParams(max_tokens=8, temperature=0), ctx())
            )
            assert ids == direct and lps == pytest.approx(direct_lps, abs=1e-5)
            # how many chunks the 8 tokens arrive in depends on scheduling (a busy consumer gets them batched);
            # the server's per-token events are checked by the streaming test above
            assert chunks and sum(len(c.token_ids) for c in chunks) == len(ids) and chunks[-1].finish_reason in ("stop", "length")
            seeded = [
                await collect(backend.generate(p, SamplingParams(max_tokens=8, seed=5), ctx()))
                for _ in range(2)
            ]
            assert seeded[0][0] == seeded[1][0] and all(lp <= 0 for lp in seeded[0][1])
            with pytest.raises(ContextLengthError):
                await collect(
                    backend.generate([5] * backend.context_length, SamplingParams(max_tokens=2), ctx())
                )
            # cancelling the consumer closes the stream and the server's worker stops
            before = builtin.tokens_generated
            async with aclosing(backend.generate(p, SamplingParams(max_tokens=100_000), ctx())) as gen:
                await anext(gen)
            await asyncio.sleep(0.2)
            await asyncio.wait_for(builtin.wait_idle(), 60)
            assert builtin.tokens_generated - before < 100_000
        finally:
            await backend.aclose()


async def test_vllm_backend_unreachable(tiny_dir: Path) -> None:
    port = free_port()
    backend = VllmBackend(f"http://127.0.0.1:{port}", tokenizer_model=str(tiny_dir))
    with pytest.raises(BackendError, match=f"cannot reach vLLM at http://127.0.0.1:{port}"):
        await collect(backend.generate([1, 2, 3], SamplingParams(max_tokens=4), ctx()))
    await backend.aclose()


async def test_vllm_backend_server_dies_mid_stream(tiny_dir: Path) -> None:
    event = {
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "token_ids": [11, 12],
                "prompt_token_ids": [1, 2, 3],
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -1.5]},
                "finish_reason": None,
            }
        ]
    }

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        payload = f"data: {json.dumps(event)}\n\n".encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()  # the server process dies

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    backend = VllmBackend(f"http://127.0.0.1:{port}", tokenizer_model=str(tiny_dir))
    got: list[TokenChunk] = []
    with pytest.raises(BackendError, match="broke mid-answer|without a finish reason"):
        async for chunk in backend.generate([1, 2, 3], SamplingParams(max_tokens=4), ctx()):
            got.append(chunk)
    assert [c.token_ids for c in got] == [[11, 12]] and got[0].logprobs == [-0.5, -1.5]
    await backend.aclose()
    server.close()
    await server.wait_closed()


async def test_vllm_backend_error_answers(tiny_dir: Path) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def completions(request):
        body = await request.json()
        assert body["return_token_ids"] is True and body["stream"] is True and body["logprobs"] == 0
        if len(body["prompt"]) > 3:
            return JSONResponse(
                {
                    "error": {
                        "message": "This model's maximum context length is 4 tokens. However, you "
                        "requested 9 tokens (5 in the messages, 4 in the completion)."
                    }
                },
                status_code=400,
            )
        return JSONResponse({"error": {"message": "boom"}}, status_code=500)

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    async with serving(app) as url:
        backend = VllmBackend(url, tokenizer_model=str(tiny_dir), model_name="policy")
        with pytest.raises(ContextLengthError) as err:
            await collect(backend.generate([1, 2, 3, 4, 5], SamplingParams(max_tokens=4), ctx()))
        assert err.value.limit == 4
        with pytest.raises(BackendError, match="HTTP 500: boom"):
            await collect(backend.generate([1, 2], SamplingParams(max_tokens=4), ctx()))
        await backend.aclose()


def test_scripted_context_option_lifts_the_tokenizers_limit(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text('{"turns": [{"text": "hi"}]}')

    def backend(spec: str) -> Any:
        return build_token_backend(PolicySpec.parse(spec))

    assert backend(f"scripted:{script}").context_length == 65536
    assert backend(f"scripted:{script}?context=400000").context_length == 400000
    with pytest.raises(ConfigError, match="context="):
        backend(f"scripted:{script}?context=lots")
