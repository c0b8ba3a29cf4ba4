"""Wrong methods and unknown paths: 405/404 in the route's own protocol shape, never OpenAI's on Anthropic or Gemini routes."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.test_proxy_faults import error_message


@pytest.fixture
def proxy(live_proxy, script_file):
    return live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")


@pytest.mark.parametrize(
    ("method", "path", "api", "allow"),
    [
        ("GET", "/v1/messages", "messages", "POST"),
        ("PUT", "/v1/messages/count_tokens", "messages", "POST"),
        ("GET", "/v1beta/models/gemini-2.5-pro:generateContent", "gemini", "POST"),
        ("DELETE", "/v1beta/models/m:streamGenerateContent", "gemini", "POST"),
        ("GET", "/v1/chat/completions", "chat", "POST"),
        ("GET", "/v1/responses", "responses", "POST"),
        ("POST", "/v1/models", "chat", "GET, HEAD"),
        ("POST", "/health", "chat", "GET, HEAD"),
    ],
)
def test_wrong_method_is_405_in_the_routes_protocol(proxy, method, path, api, allow):
    resp = httpx.request(method, proxy.base + path)
    assert resp.status_code == 405
    assert resp.headers["allow"] == allow
    assert resp.headers["content-type"].startswith("application/json")
    assert method in error_message(api, resp.json())
    if api == "gemini":
        assert resp.json()["error"]["code"] == 405
    if api == "messages":
        assert resp.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/messages/batches", "messages"),
        ("/v1beta/models", "gemini"),
        ("/v1beta/models/m:embedContent", "gemini"),
        ("/v1beta/tunedModels/x", "gemini"),
        ("/v1/embeddings", "chat"),
    ],
)
def test_unknown_path_is_404_in_the_routes_protocol(proxy, path, api):
    resp = httpx.post(proxy.base + path, json={})
    assert resp.status_code == 404
    error_message(api, resp.json())
    if api == "gemini":
        assert resp.json()["error"]["status"] == "NOT_FOUND"
    if api == "messages":
        assert resp.json()["error"]["type"] == "not_found_error"
    if api == "chat":  # OpenAI's own 404 for a URL it does not serve has no code; model_not_found is for models
        assert resp.json()["error"]["code"] is None and resp.json()["error"]["type"] == "not_found_error"


def test_health_and_models_still_answer(proxy):
    assert httpx.get(proxy.base + "/health").json()["status"] == "ok"
    assert httpx.head(proxy.base + "/").status_code == 200
    assert httpx.get(proxy.base + "/v1/models").json()["object"] == "list"


def raw(url: str, data: bytes, timeout: float = 30) -> bytes:
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "data",
    [b"GARBAGE\r\n\r\n", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"],
    ids=["garbage", "negative-length", "raw-bytes-in-path", "tls-hello"],
)
def test_bad_http_framing_is_a_json_400(proxy, data):
    """Issue 23 item 9: uvicorn answered these with a plain-text 400 ("Invalid HTTP request received.")."""
    answer = raw(proxy.url, data)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head.lower(), answer[:300]
    parsed = orjson.loads(body)
    assert parsed["type"] == "error" and parsed["error"]["type"] == "invalid_request_error" and parsed["error"]["message"]


def test_a_request_not_sent_in_whole_is_dropped_at_its_deadline(live_proxy, script_file):
    """No read deadline held half-sent requests for 30 s and more: headers get a 408, a body the connection closed."""
    import time

    from core.proxy.server import PROXY_HARDENING, BackgroundServer
    from core.serving import Hardening

    proxy = live_proxy(f"scripted:{script_file([{'text': 'ok'}])}")
    quick = Hardening(request_timeout_s=1.0, max_connections=None, bad_request=PROXY_HARDENING.bad_request)
    with BackgroundServer(proxy.app, hardening=quick) as server:
        started = time.monotonic()
        answer = raw(server.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"invalid_request_error"' in answer
        path = f"/r/{proxy.token}/v1/chat/completions".encode()
        half_body = raw(server.url, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":")
        assert half_body == b""  # the app saw its client gone; nothing answered, nothing recorded
        assert raw(server.url, b"") == b""  # a connection that never sends a request is closed too
        assert time.monotonic() - started < 20
        ok = httpx.post(f"{server.url}/r/{proxy.token}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200
    assert proxy.rows("SELECT count(*) FROM calls") == [(1,)]
