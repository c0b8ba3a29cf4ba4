"""Every first request real harness binaries sent is accepted as it is and answered in its protocol."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import harness_requests

CASES = harness_requests()
SHELL_NAMES = {"codex": "exec_command", "claude-code": "Bash", "gemini-cli": "run_shell_command", "mini-swe-agent": "bash"}
DROP_HEADERS = {"host", "content-length", "connection", "accept-encoding"}


def sse_frames(text: str) -> list[tuple[str | None, object]]:
    """(event name, data) for each SSE frame."""
    frames = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            payload = "\n".join(data)
            frames.append((event, payload if payload == "[DONE]" else json.loads(payload)))
    return frames


@pytest.mark.parametrize(("harness", "req"), CASES, ids=[f"{h}-{i}-{r['method']}" for i, (h, r) in enumerate(CASES)])
def test_fixture_request_is_answered(live_proxy, script_file, harness, req):
    proxy = live_proxy(f"scripted:{script_file([{'tool': 'shell', 'command': 'echo hi > hello.txt'}, {'text': 'done'}])}")
    headers = {k: v for k, v in req["headers"].items() if k.lower() not in DROP_HEADERS}
    url = proxy.base + req["path"]
    body = req.get("body")
    resp = httpx.request(req["method"], url, headers=headers, content=json.dumps(body) if body is not None else None, timeout=120)
    assert resp.status_code == 200, resp.text[:500]
    if req["method"] == "HEAD":
        return
    streamed = resp.headers["content-type"].startswith("text/event-stream")
    assert streamed == bool(body.get("stream") or "streamGenerateContent" in req["path"])
    api = "gemini" if "/v1beta/" in req["path"] else req["path"].split("?")[0].rsplit("/", 1)[-1]
    tool_names: list[str] = []
    if streamed:
        frames = sse_frames(resp.text)
        if api == "completions":
            assert frames[-1][1] == "[DONE]"
            for _, data in frames[:-1]:
                for choice in data["choices"]:
                    tool_names += [tc["function"]["name"] for tc in choice["delta"].get("tool_calls", []) if tc.get("function", {}).get("name")]
        elif api == "responses":
            assert frames[-1][0] == "response.completed"
            tool_names = [o["name"] for o in frames[-1][1]["response"]["output"] if o["type"] == "function_call"]
        elif api == "messages":
            assert [f[0] for f in frames][0] == "message_start" and frames[-1][0] == "message_stop"
            tool_names = [d["content_block"]["name"] for e, d in frames if e == "content_block_start" and d["content_block"]["type"] == "tool_use"]
        else:
            assert frames[-1][1]["candidates"][0]["finishReason"] == "STOP"
            tool_names = [p["functionCall"]["name"] for _, d in frames for p in d["candidates"][0]["content"].get("parts", []) if "functionCall" in p]
    else:
        data = resp.json()
        tool_names = [tc["function"]["name"] for tc in data["choices"][0]["message"].get("tool_calls") or []]
    if harness in SHELL_NAMES:
        assert tool_names == [SHELL_NAMES[harness]]
    elif body.get("tools"):
        assert len(tool_names) == 1, f"{harness}: expected the scripted shell call, got {tool_names}"
    (row,) = proxy.rows("SELECT status, len(prompt_token_ids), len(completion_token_ids) FROM calls")
    assert row[0] == "ok" and row[1] > 100 and row[2] > 0


@pytest.mark.parametrize("harness", ["codex", "gemini-cli"])
def test_tiny_model_takes_a_real_harness_prompt(live_proxy, harness):
    """Real harness prompts are long (Codex's first is ~10k words): the built-in tiny model answers them."""
    ((_, req),) = [(h, r) for h, r in CASES if h == harness and r["method"] == "POST"]
    proxy = live_proxy("builtin:tiny?max_tokens=8")
    headers = {k: v for k, v in req["headers"].items() if k.lower() not in DROP_HEADERS}
    resp = httpx.post(proxy.base + req["path"], headers=headers, content=json.dumps(req["body"]), timeout=300)
    frames = sse_frames(resp.text)
    assert resp.status_code == 200 and frames and not any(isinstance(d, dict) and d.get("error") for _, d in frames)
    assert frames[-1][0] == "response.completed" if harness == "codex" else frames[-1][1]["candidates"][0]["finishReason"]
    ((status, n_prompt, n_completion),) = proxy.rows("SELECT status, len(prompt_token_ids), len(completion_token_ids) FROM calls")
    assert status == "ok" and n_prompt > 5000 and 0 < n_completion <= 8
