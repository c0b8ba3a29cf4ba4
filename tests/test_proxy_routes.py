"""Wrong methods and unknown paths: 405/404 in the route's own protocol shape, never OpenAI's on Anthropic or Gemini routes."""

from __future__ import annotations

import httpx
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
