"""`forgetui serve-model` answers an error with its kind's status from the one table (core.errors.KIND_STATUS), not 500."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from core.backends.builtin import BuiltinBackend
from core.errors import ForgetuiError, RateLimitedError, status_of
from core.models.tiny import ensure_tiny_model
from core.proxy.model_server import build_model_app
from tests.loopback import serving


class _Failing(BuiltinBackend):
    """The real tiny backend, whose generation fails with `error` once it has sampled `after` tokens (a fault injected)."""

    error: ForgetuiError = RateLimitedError("the batch is full: try again")
    after = 0

    async def generate(self, prompt_ids, sampling, ctx) -> AsyncIterator:  # type: ignore[override]
        sent = 0
        async for chunk in super().generate(prompt_ids, sampling, ctx):
            if sent >= self.after:
                raise self.error
            sent += len(chunk.token_ids)
            yield chunk
        raise self.error


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> _Failing:
    folder: Path = ensure_tiny_model(root=tmp_path_factory.mktemp("models"))
    return _Failing(str(folder), device="cpu")


def _prompt(backend: BuiltinBackend) -> list[int]:
    return list(backend.tokenizer("hello there", add_special_tokens=False)["input_ids"])


async def test_an_error_answers_with_its_kinds_status(failing: _Failing) -> None:
    async with serving(build_model_app(failing, model_name="tiny")) as url, httpx.AsyncClient(base_url=url) as client:
        r = await client.post("/v1/completions", json={"prompt": _prompt(failing), "max_tokens": 4})
    assert r.status_code == status_of("rate_limit") == 429
    assert r.json()["error"] == {"message": "the batch is full: try again", "type": "rate_limit", "param": None, "code": 429}


async def test_a_mid_stream_error_carries_its_kinds_code(failing: _Failing) -> None:
    failing.after = 1
    try:
        async with serving(build_model_app(failing, model_name="tiny")) as url, httpx.AsyncClient(base_url=url) as client:
            r = await client.post("/v1/completions", json={"prompt": _prompt(failing), "max_tokens": 8, "stream": True, "return_token_ids": True})
    finally:
        failing.after = 0
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert r.status_code == 200 and events[0]["choices"][0]["token_ids"]  # the stream had begun: the error is in-band
    assert events[-1]["error"]["code"] == 429 and events[-1]["error"]["type"] == "rate_limit"
