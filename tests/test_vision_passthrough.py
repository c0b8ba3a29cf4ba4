"""Screenshots reach a vision-language backend: the canonical request carries the images, not only "[image]".

A harness's image inputs (any protocol) go on to an OpenAI-compatible server as ``image_url`` data
URLs with the very bytes the harness sent, and through LiteLLM's own translation to a provider in
another protocol (Anthropic on a loopback server here); the store still keeps each image once.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import httpx
import orjson
import pytest

from core.backends.openai_compat import wire_messages
from core.chat import ImagePart, exported_message
from core.errors import BackendError
from core.protocols.registry import get_protocol
from core.proxy.server import BackgroundServer
from core.serving import read_body
from tests.test_gui_images import b64, png
from tests.test_passthrough import CHAT

SHOT_1, SHOT_2 = png(1), png(2)


def _anthropic_turns() -> list[dict[str, Any]]:
    """A Claude Code-style conversation: a screenshot in the task, another in a tool result."""
    image = lambda data: {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}  # noqa: E731
    return [
        {"role": "user", "content": [{"type": "text", "text": "Click the button."}, image(SHOT_1)]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "observe", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "the page:"}, image(SHOT_2)]}]},
    ]


def _data_url_bytes(part: dict[str, Any]) -> bytes:
    url = part["image_url"]["url"]
    head, _, payload = url.partition(",")
    assert head == "data:image/png;base64"
    return base64.b64decode(payload)


def test_screenshots_reach_an_openai_compatible_vlm_byte_for_byte_and_are_stored_once(live_proxy, fake) -> None:
    proxy = live_proxy(f"litellm:openai/vl?api_base={fake.url}/v1&vision=1")
    first = {"model": "claude", "max_tokens": 50, "messages": _anthropic_turns()[:1]}
    second = {"model": "claude", "max_tokens": 50, "messages": _anthropic_turns()}
    for body in (first, second):
        resp = httpx.post(proxy.base + "/v1/messages", json=body, timeout=30)
        assert resp.status_code == 200, resp.text
    sent = fake.requests[1]["messages"]
    # the task message: its text, then the screenshot as a data URL carrying the very bytes the harness sent
    task = sent[0]["content"]
    assert [p["type"] for p in task] == ["text", "image_url"] and task[0]["text"] == "Click the button."
    assert _data_url_bytes(task[1]) == SHOT_1
    # the tool result's screenshot too, in the tool message, after its text
    tool = next(m for m in sent if m["role"] == "tool")
    assert tool["tool_call_id"] == "t1" and [p["type"] for p in tool["content"]] == ["text", "image_url"]
    assert _data_url_bytes(tool["content"][1]) == SHOT_2
    assert all("parts" not in m for m in sent)  # the canonical form's own key never goes on the wire
    # recorded: each screenshot once (the first is in both calls' history), the bodies hold references only
    blobs = proxy.rows("SELECT sha256, bytes FROM blobs ORDER BY bytes")
    assert sorted(blobs) == sorted([(hashlib.sha256(s).hexdigest(), len(s)) for s in (SHOT_1, SHOT_2)])
    requests = [r[0] for r in proxy.rows("SELECT request FROM calls_full ORDER BY seq")]
    assert len(requests) == 2 and all(b64(SHOT_1) not in r and b64(SHOT_2) not in r for r in requests)


class FakeAnthropic:
    """A raw ASGI Anthropic Messages server that streams one short text answer and keeps each request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.requests.append(orjson.loads(await read_body(scope, receive, 1 << 30)))
        events = [
            ("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [], "stop_reason": None, "usage": {"input_tokens": 9, "output_tokens": 0}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "I see a button."}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
            ("message_stop", {"type": "message_stop"}),
        ]  # fmt: skip
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for name, data in events:
            await send({"type": "http.response.body", "body": f"event: {name}\ndata: {json.dumps(data)}\n\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_litellm_translates_a_chat_screenshot_for_an_anthropic_upstream(live_proxy) -> None:
    app = FakeAnthropic()
    with BackgroundServer(app) as server:
        # no vision= in the spec: LiteLLM's model list says this model takes images
        proxy = live_proxy(f"litellm:anthropic/claude-sonnet-4-5?api_base={server.url}&api_key=k")
        content = [{"type": "text", "text": "What is on the screen?"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(SHOT_1)}"}}]
        resp = httpx.post(proxy.base + CHAT, json={"model": "x", "messages": [{"role": "user", "content": content}], "max_tokens": 20}, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["content"] == "I see a button."
    (sent,) = app.requests
    (user,) = sent["messages"]
    kinds = {block["type"]: block for block in user["content"]}
    assert kinds["text"]["text"] == "What is on the screen?"
    assert kinds["image"]["source"] == {"type": "base64", "media_type": "image/png", "data": b64(SHOT_1)}
    ((status, backend),) = proxy.rows("SELECT status, backend FROM calls")
    assert (status, backend) == ("ok", "litellm:anthropic/claude-sonnet-4-5")


@pytest.mark.parametrize("spec_tail", ["", "&vision=0"])
def test_a_passthrough_not_known_to_take_images_refuses_them_saying_how_to_allow_them(live_proxy, fake, spec_tail: str) -> None:
    proxy = live_proxy(f"litellm:openai/fake?api_base={fake.url}/v1{spec_tail}")
    body = {"model": "claude", "max_tokens": 50, "messages": _anthropic_turns()[:1]}
    resp = httpx.post(proxy.base + "/v1/messages", json=body, timeout=30)
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    assert "takes text only" in resp.json()["error"]["message"] and "vision=1" in resp.json()["error"]["message"]
    assert fake.requests == [] and proxy.rows("SELECT count(*) FROM calls") == [(0,)]


def test_a_bad_vision_flag_is_a_config_error() -> None:
    from core.backends.spec import PolicySpec
    from core.errors import ConfigError
    from core.proxy.factory import make_policy

    with pytest.raises(ConfigError, match="vision='maybe'"):
        make_policy(PolicySpec.parse("litellm:openai/vl?api_base=http://127.0.0.1:9/v1&vision=maybe"))


@pytest.mark.parametrize("api", ["chat", "responses", "messages", "gemini"])
def test_every_protocol_parses_images_into_parts_and_recorded_bodies_back_into_references(api: str) -> None:
    """Live: the image with its bytes; recorded (bytes swapped for a blob reference): the same hash, no bytes."""
    from core.protocols.images import extract_images

    url = f"data:image/png;base64,{b64(SHOT_1)}"
    bodies = {
        "chat": {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]}]},
        "responses": {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": url}]}]},
        "messages": {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(SHOT_1)}}]}]},
        "gemini": {"contents": [{"role": "user", "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": b64(SHOT_1)}}]}]},
    }  # fmt: skip
    proto = get_protocol(api)
    sha = hashlib.sha256(SHOT_1).hexdigest()
    (message,) = proto.parse_request(json.loads(json.dumps(bodies[api])), model="m").messages
    assert message["content"] == "look\n[image]" and message["parts"] == ["look", ImagePart(sha, "image/png", SHOT_1)]
    recorded = json.loads(json.dumps(bodies[api]))
    extract_images(api, recorded)
    (again,) = proto.parse_request(recorded, model="m").messages
    (image,) = [p for p in again["parts"] if isinstance(p, ImagePart)]
    assert again["content"] == "look\n[image]" and image.sha256 == sha and image.data is None


def test_a_recorded_image_without_its_bytes_cannot_be_sent_and_says_where_they_are() -> None:
    recorded = [{"role": "user", "content": "[image]", "parts": [ImagePart("ab" * 32, "image/png")]}]
    with pytest.raises(BackendError, match="load it from the store's blobs"):
        wire_messages(recorded)
    text_only = [{"role": "user", "content": "hi"}]
    assert wire_messages(text_only) is text_only  # nothing to convert: the same list, no copy


def test_the_same_text_around_another_screenshot_is_another_turn_for_the_token_cache() -> None:
    from core.tokens.continuation import normalize_message

    one = {"role": "user", "content": "[image]", "parts": [ImagePart("a" * 64, "image/png", b"")]}
    two = {"role": "user", "content": "[image]", "parts": [ImagePart("b" * 64, "image/png", b"")]}
    assert normalize_message(one) != normalize_message(two)
    assert normalize_message(one) == normalize_message({**one, "parts": [ImagePart("a" * 64, "image/png")]})
    # a message exported to JSON (SFT rows, the graders' trajectory) names its images and compares the same
    assert normalize_message(exported_message(one)) == normalize_message(one)


def test_a_recorded_screenshot_conversation_exports_as_json_with_its_images_named(live_proxy, fake) -> None:
    """SFT rows and the graders' trajectory are JSON: the images are their blob references, in order."""
    from core.rollout.recorded import conversations

    proxy = live_proxy(f"litellm:openai/vl?api_base={fake.url}/v1&vision=1")
    resp = httpx.post(proxy.base + "/v1/messages", json={"model": "claude", "max_tokens": 50, "messages": _anthropic_turns()}, timeout=30)
    assert resp.status_code == 200, resp.text
    proxy.store.flush()
    cur = proxy.store.cursor().execute("SELECT call_id, api, model, request, response FROM calls_full")
    calls = [dict(zip([d[0] for d in cur.description], row, strict=True)) for row in cur.fetchall()]
    (conv,) = conversations(calls)
    text = json.dumps(conv["messages"])  # JSON-safe
    refs = [f"sha256:{hashlib.sha256(s).hexdigest()}" for s in (SHOT_1, SHOT_2)]
    assert [m.get("images") for m in conv["messages"] if m.get("images")] == [[refs[0]], [refs[1]]]
    assert b64(SHOT_1) not in text and conv["messages"][-1] == {"role": "assistant", "content": "Hello, world!"}

