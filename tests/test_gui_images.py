"""Image inputs of every protocol: found, checked and replaced by content-hash references (core/protocols/images.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import zlib

import pytest

from core.errors import ProtocolError
from core.protocols.images import BLOB_KEY, MAX_IMAGE_BYTES, extract_images


def png(seed: int = 0, size: int = 8) -> bytes:
    """A real, tiny PNG (one colour per seed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = b"\x00" + bytes([seed % 256, 80, 160]) * size
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(row * size)) + chunk(b"IEND", b"")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def bodies(img: bytes) -> dict[str, dict]:
    """One request per protocol carrying `img` (Anthropic: in a user turn and in a tool result)."""
    data = b64(img)
    return {
        "chat": {"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}", "detail": "low"}}]}]},
        "responses": {"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": f"data:image/png;base64,{data}"}]}]},
        "messages": {"model": "m", "max_tokens": 5, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]}]},
        "gemini": {"contents": [{"role": "user", "parts": [{"text": "look"}, {"inline_data": {"mime_type": "image/png", "data": data}}]}]},
    }  # fmt: skip


@pytest.mark.parametrize("api", ["chat", "responses", "messages", "gemini"])
def test_every_protocol_yields_the_image_and_records_only_its_hash(api: str) -> None:
    img = png(1)
    body = bodies(img)[api]
    images = extract_images(api, body)
    want = 2 if api == "messages" else 1
    assert [(i.media_type, i.data, i.sha256) for i in images] == [("image/png", img, hashlib.sha256(img).hexdigest())] * want
    text = json.dumps(body)
    assert b64(img) not in text and text.count(f'"{BLOB_KEY}": "sha256:{images[0].sha256}"') == want
    assert ("look" in text) == (api != "messages")  # the rest of the body is kept as sent


def test_gemini_camel_case_and_non_image_inline_data() -> None:
    img = png(2)
    body = {"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": b64(img)}}, {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}}]}]}
    (image,) = extract_images("gemini", body)
    assert image.data == img and body["contents"][0]["parts"][1]["inlineData"]["data"] == "JVBERi0="


@pytest.mark.parametrize(
    ("api", "part", "message"),
    [
        ("chat", {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@not-base64@@"}}, "not valid base64"),
        ("chat", {"type": "image_url", "image_url": {"url": f"data:image/bmp;base64,{b64(png())}"}}, "unsupported image media type 'image/bmp'"),
        ("chat", {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{b64(png())}"}}, "declared type and content disagree"),
        ("chat", {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.png"}}, "only data: URLs"),
        ("responses", {"type": "input_image", "file_id": "file-1"}, "file_id"),
        ("messages", {"type": "image", "source": {"type": "url", "url": "https://example.invalid/x.png"}}, "only base64 image sources"),
    ],
)
def test_bad_images_are_refused_with_a_message(api: str, part: dict, message: str) -> None:
    body = {"messages": [{"role": "user", "content": [part]}]} if api != "responses" else {"input": [{"role": "user", "content": [part]}]}
    with pytest.raises(ProtocolError, match=message) as info:
        extract_images(api, body)
    assert info.value.status == 400


def test_a_20_mb_image_is_refused_as_too_large_before_decoding() -> None:
    big = b"\x89PNG\r\n\x1a\n" + b"\0" * (20 * 1000 * 1000)
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(big)}"}}]}]}
    with pytest.raises(ProtocolError, match="over 10 MiB") as info:
        extract_images("chat", body)
    assert info.value.status == 413 and info.value.kind == "too_large" and len(big) > MAX_IMAGE_BYTES  # one kind → status table


# --- through the live proxy ---------------------------------------------------------------------

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages", "gemini": "/v1beta/models/policy:generateContent"}


def _post(proxy, api: str, body: dict) -> tuple[int, dict]:
    import httpx

    reply = httpx.post(f"{proxy.base}{PATHS[api]}", json=body, headers={"x-api-key": proxy.token}, timeout=120)
    return reply.status_code, reply.json()


def _error_message(api: str, payload: dict) -> str:
    """The message of a 400 in the protocol's own error shape."""
    if api == "messages":
        assert payload["type"] == "error" and payload["error"]["type"] in ("invalid_request_error", "request_too_large")
        return payload["error"]["message"]
    if api == "gemini":
        assert payload["error"]["code"] == 400 and payload["error"]["status"] == "INVALID_ARGUMENT"
        return payload["error"]["message"]
    assert payload["error"]["type"] == "invalid_request_error"
    return payload["error"]["message"]


@pytest.mark.parametrize("api", ["chat", "responses", "messages", "gemini"])
def test_a_text_only_backend_refuses_an_image_with_a_400_in_the_protocols_shape(api: str, live_proxy) -> None:
    proxy = live_proxy("builtin:tiny")
    status, payload = _post(proxy, api, bodies(png(3))[api])
    assert status == 400, payload
    assert "the policy backend tiny takes text only" in _error_message(api, payload)
    assert proxy.rows("SELECT count(*) FROM calls") == [(0,)]


def test_bad_images_are_400s_and_oversized_ones_413s_through_the_proxy(live_proxy, script_file) -> None:
    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    bad = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}]}]}
    status, payload = _post(proxy, "chat", bad)
    assert status == 400 and "not valid base64" in _error_message("chat", payload)
    big = b"\x89PNG\r\n\x1a\n" + b"\0" * (20 * 1000 * 1000)
    huge = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(big)}}]}]}
    status, payload = _post(proxy, "messages", huge)
    assert status == 413 and "over 10 MiB" in _error_message("messages", payload) and payload["error"]["type"] == "request_too_large"


def test_an_image_resent_in_later_calls_is_stored_once(live_proxy, script_file) -> None:
    proxy = live_proxy(f"scripted:{script_file([{'text': 'one'}, {'text': 'two'}])}")
    a, b = png(4), png(5)
    first = bodies(a)["chat"]
    assert _post(proxy, "chat", first)[0] == 200
    second = bodies(a)["chat"]
    second["messages"] += [{"role": "assistant", "content": "one"}, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(b)}"}}]}]
    assert _post(proxy, "chat", second)[0] == 200
    rows = proxy.rows("SELECT sha256, media_type, bytes, data FROM blobs ORDER BY bytes, sha256")
    want = {hashlib.sha256(x).hexdigest(): x for x in (a, b)}
    assert sorted(r[0] for r in rows) == sorted(want) and all(bytes(r[3]) == want[r[0]] and r[2] == len(want[r[0]]) for r in rows)
    calls = proxy.rows("SELECT image_hashes, request FROM calls_full ORDER BY seq")
    assert [c[0] for c in calls] == [[hashlib.sha256(a).hexdigest()], [hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest()]]
    assert all(b64(a) not in str(c[1]) and BLOB_KEY in str(c[1]) for c in calls)
