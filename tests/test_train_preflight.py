"""A training run refuses, before any rollout, a policy server that answers without token ids or logprobs.

The servers are real HTTP on loopback answering vLLM's `/v1/completions` stream; the client is the
project's own `VllmBackend` (the `vllm:URL` policy), so the probe is the request every call makes.
"""

from __future__ import annotations

import asyncio
import http.server
import json

import duckdb
import pytest

from core.backends.spec import PolicySpec
from core.config import load_config
from core.errors import UntrainableBackendError
from core.train.preflight import check_backend, needs_preflight
from tests.loopback import threaded_http

ANSWERS = {  # one streamed choice per kind of server
    "text only": {"index": 0, "text": "OK", "logprobs": None, "finish_reason": "length"},
    "ids, no logprobs": {
        "index": 0,
        "text": "OK",
        "token_ids": [42],
        "logprobs": None,
        "finish_reason": "length",
    },
    "ids and logprobs": {
        "index": 0,
        "text": "OK",
        "token_ids": [42],
        "logprobs": {"token_logprobs": [-0.25]},
        "finish_reason": "length",
    },
}


def completions_handler(choice: dict, seen: list[dict]) -> type[http.server.BaseHTTPRequestHandler]:
    """POST /v1/completions answered with one SSE chunk holding `choice`, then [DONE]; request bodies go to `seen`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/completions":
                self.send_error(404)
                return
            seen.append(json.loads(body))
            event = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice]}
            payload = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def vllm_backend(port: int):
    from core.backends.vllm import VllmBackend

    return VllmBackend(f"http://127.0.0.1:{port}/v1", tokenizer_model="tiny", context_length=512)


def run_config(port: int, model: str):
    sets = {
        "env.name": "toy", "env.tasks": "hello", "harness.name": "tests.harness_fixtures:CoinHarness",
        "policy.backend": f"vllm:http://127.0.0.1:{port}/v1", "policy.tokenizer": model, "runtime.kind": "local",
        "run.n_samples": 2, "run.timeout_s": 60, "train.steps": 1, "train.lora_rank": 4,
    }  # fmt: skip
    return load_config(
        None, [f"{k}={v}" if not isinstance(v, str) else f'{k}="{v}"' for k, v in sets.items()]
    )


@pytest.mark.parametrize(("kind", "missing"), [("text only", "token_ids"), ("ids, no logprobs", "logprobs")])
def test_a_training_run_against_a_server_without_token_data_fails_before_any_rollout(
    kind, missing, tmp_path, monkeypatch
) -> None:
    from core.models.resolve import resolve_model
    from core.run import execute_run

    model = str(resolve_model("tiny"))  # from the session's home, where it is built once
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    seen: list[dict] = []
    with threaded_http(completions_handler(ANSWERS[kind], seen)) as port:
        with pytest.raises(UntrainableBackendError) as caught:
            asyncio.run(execute_run(run_config(port, model)))
    what, _, fix = str(caught.value).partition("Training needs")
    assert (
        f"vllm:http://127.0.0.1:{port}/v1" in what and missing in what
    )  # names the backend and what it lacks
    assert "vllm serve" in fix and "return_token_ids" in fix  # and how to fix it
    (probe,) = seen  # the preflight alone reached the server: no rollout made a call
    assert probe["max_tokens"] == 1 and probe["return_token_ids"] is True and probe["logprobs"] == 0
    (store,) = tmp_path.glob("runs/*/store.duckdb")
    with duckdb.connect(str(store), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM rollouts").fetchall() == [(0,)]
        assert con.execute("SELECT status FROM runs").fetchall() == [("failed",)]


def test_a_server_that_returns_token_ids_and_logprobs_passes_the_preflight() -> None:
    seen: list[dict] = []

    async def check(port: int) -> None:
        backend = vllm_backend(port)
        try:
            await check_backend(backend, PolicySpec.parse(f"vllm:http://127.0.0.1:{port}/v1"))
        finally:
            await backend.aclose()

    with threaded_http(completions_handler(ANSWERS["ids and logprobs"], seen)) as port:
        asyncio.run(check(port))
    assert len(seen) == 1 and seen[0]["prompt"] and all(isinstance(t, int) for t in seen[0]["prompt"])
    assert needs_preflight(PolicySpec.parse("vllm:http://h:8000")) and not needs_preflight(PolicySpec.parse("builtin:tiny"))
