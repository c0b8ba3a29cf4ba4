"""A token backend over HTTP: vLLM's ``/v1/completions`` with a token-id prompt (or `forgetui serve-model`).

The proxy templates locally with the policy's tokenizer and sends token ids; the server
streams back the sampled ``token_ids`` (``return_token_ids``, vLLM ≥ 0.10.2) with one
logprob each (``logprobs: 0`` = the sampled token's only). vLLM reports logprobs of the raw
model distribution by default (its ``--logprobs-mode raw_logprobs``).

A trainer that hot-loads LoRA adapters into the server (vLLM's ``/v1/load_lora_adapter``)
calls `set_adapter(name, version)`: requests then name the adapter as their ``model`` (how vLLM
picks a LoRA for a request) and the proxy records `weights_version` on every call.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from core.backends.base import GenerationContext, SamplingParams, TokenChunk
from core.backends.kinds import Capabilities
from core.backends.openai_compat import HttpSession, error_message
from core.backends.spec import PolicySpec
from core.backends.vllm_server import ServerSettings, VllmServer, VllmServerError
from core.errors import (
    BackendError,
    ConfigError,
    ContextLengthError,
    ModelError,
    ProtocolError,
    RateLimitedError,
)
from core.models.resolve import load_tokenizer, resolve_model
from core.secrets import redact_text

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 32768
_CONTEXT_RE = re.compile(
    r"maximum context length is (\d+) tokens.*?(?:requested|contains|prompt has) (\d+)", re.S
)


def _api_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class VllmBackend:
    """A `TokenBackend` that samples on a vLLM-compatible server."""

    capabilities = Capabilities(token_ids=True, logprobs=True, adapters=True)

    def __init__(
        self,
        base_url: str,
        tokenizer_model: str,
        model_name: str | None = None,
        timeout: float = 600,
        context_length: int | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = _api_root(base_url)
        self.model_name = model_name
        self.name = model_name or tokenizer_model
        self.adapter: str | None = None  # a LoRA adapter loaded into the server, named as the model
        self.server: VllmServer | None = None  # the server this backend started (`vllm:MODEL`); stopped when it closes
        self.weights_version = 0  # 0 = the server's base weights; the adapter's version after set_adapter
        source = resolve_model(tokenizer_model)
        try:
            self.tokenizer = load_tokenizer(source)
            if context_length is None:
                from transformers import AutoConfig

                config_len = getattr(AutoConfig.from_pretrained(source), "max_position_embeddings", None)
                context_length = int(config_len or DEFAULT_CONTEXT)
        except Exception as exc:
            raise ModelError(f"cannot load tokenizer {tokenizer_model!r} from {source}: {exc}") from exc
        self.context_length = context_length
        # aiohttp, not httpx: httpcore's pool scans every connection per request, which costs more
        # CPU than the whole proxy at concurrency 64 (benchmarks/proxy_overhead.py); and httpx keeps
        # only 20 idle connections by default, so a busy proxy reconnects on most calls
        self._http = HttpSession(timeout)
        self.headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if api_key:  # vLLM's --api-key
            self.headers["authorization"] = f"Bearer {api_key}"

    def set_adapter(self, name: str | None, version: int | None = None) -> None:
        """Sample with the server's LoRA adapter `name` from now on (None: the base model); record `version`."""
        self.adapter = name
        if version is not None:
            self.weights_version = version
        log.info(
            "vLLM policy now samples with %s (weights version %d)",
            name or "the base model",
            self.weights_version,
        )

    def _body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stream": True,
            "return_token_ids": True,
            "logprobs": 0,
            "skip_special_tokens": False,
        }
        if self.adapter or self.model_name:
            body["model"] = self.adapter or self.model_name
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        return body

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext
    ) -> AsyncIterator[TokenChunk]:
        """Stream the server's sampled tokens; closing this generator closes the HTTP stream (vLLM aborts)."""
        if len(prompt_ids) >= self.context_length:
            raise ContextLengthError(len(prompt_ids), self.context_length - 1)
        url = f"{redact_text(self.base_url)}/v1/completions"
        finished = False
        response: aiohttp.ClientResponse | None = None
        ended = False
        try:
            payload = orjson.dumps(self._body(prompt_ids, sampling))
            response = await self._http.post(url, payload, self.headers)
            if response.status != 200:
                self._raise_for(response.status, await response.read(), len(prompt_ids), response.headers.get("retry-after"))
            buf = b""
            async for piece in response.content.iter_any():
                buf = buf + piece if buf else piece
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[len(b"data:") :].strip()
                    if data == b"[DONE]":
                        continue  # read on to the end so the connection can be reused
                    chunk = self._parse_event(data)
                    if chunk is None:
                        continue
                    if chunk.token_ids or chunk.finish_reason:
                        yield chunk
                    if chunk.finish_reason is not None:
                        finished = True
            ended = True
        except aiohttp.ClientConnectorError as exc:
            self._check_server(exc)
            raise BackendError(
                f"cannot reach vLLM at {redact_text(self.base_url)}: {exc}; is the server running?"
            ) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            self._check_server(exc)
            raise BackendError(f"vLLM at {redact_text(self.base_url)} timed out: {exc!r}") from exc
        except aiohttp.ClientError as exc:
            self._check_server(exc)
            raise BackendError(
                f"the connection to vLLM at {redact_text(self.base_url)} broke mid-answer: {exc!r}"
            ) from exc
        finally:
            if response is not None:
                if ended:
                    response.release()
                else:
                    response.close()  # cancelled or failed: dropping the connection makes vLLM abort
        if not finished:
            self._check_server(None)
            raise BackendError(f"vLLM at {redact_text(self.base_url)} ended the stream without a finish reason")

    def _parse_event(self, data: bytes) -> TokenChunk | None:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise BackendError(f"vLLM sent a malformed stream event: {data[:200]!r}") from exc
        if "error" in event:
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise BackendError(f"vLLM failed mid-answer: {message}")
        choices = event.get("choices") or []
        if not choices:
            return None  # a usage-only chunk
        choice = choices[0]
        ids = choice.get("token_ids")
        if ids is None:
            if choice.get("text") or not choice.get("finish_reason"):
                raise BackendError(
                    f"the server at {redact_text(self.base_url)} returned no token_ids; it must support `return_token_ids` (vLLM >= 0.10.2)"
                )
            ids = []
        logprobs = choice.get("logprobs") or {}
        lps = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        if lps is None or len(lps) != len(ids):
            raise BackendError(
                f"the server at {redact_text(self.base_url)} returned {len(ids)} token ids but no matching logprobs"
            )
        finish = choice.get("finish_reason")
        if finish not in (None, "stop", "length"):
            raise BackendError(f"vLLM ended the answer with finish_reason={finish!r}")
        return TokenChunk(
            token_ids=[int(t) for t in ids], logprobs=[float(x) for x in lps], finish_reason=finish
        )

    def _raise_for(self, status: int, raw: bytes, prompt_tokens: int, retry_after: str | None = None) -> None:
        message = error_message(raw)
        if status == 429:
            raise RateLimitedError(f"vLLM at {redact_text(self.base_url)} is rate limited: {message}", retry_after)
        match = _CONTEXT_RE.search(message)
        if status == 400 and (match or "context length" in message or "too long" in message):
            limit = int(match.group(1)) if match else self.context_length
            raise ContextLengthError(prompt_tokens, limit)
        if status == 400:  # vLLM's BadRequestError: a sampling parameter it refuses (top_p=0, a negative temperature): the client's to fix
            raise ProtocolError(f"vLLM refused the request: {message}")
        raise BackendError(f"vLLM at {redact_text(self.base_url)} answered HTTP {status}: {message}")

    def _check_server(self, cause: BaseException | None) -> None:
        """A failed call to a server this backend started: when that server has exited, say so with its log's end."""
        if self.server is None:
            return
        try:
            self.server.check()
        except VllmServerError as exc:
            raise exc from cause

    async def aclose(self) -> None:
        await self._http.aclose()
        server, self.server = self.server, None
        if server is not None:
            await asyncio.to_thread(server.stop)


def managed(spec: PolicySpec) -> VllmBackend:
    """`vllm:MODEL`: start a vLLM server for MODEL on loopback and sample on it; the backend stops it when it closes."""
    settings = ServerSettings.from_options(spec.target, spec.options)
    server = VllmServer(settings).start()
    try:
        backend = VllmBackend(
            server.base_url,
            tokenizer_model=spec.options.get("tokenizer") or server.model_dir,
            model_name=server.served_name,
            timeout=spec.timeout_s,
            context_length=settings.max_model_len,
        )
    except BaseException:
        server.stop()
        raise
    backend.server = server
    return backend


def from_spec(spec: PolicySpec, *, tokenizer: str | None = None) -> VllmBackend:
    """`vllm:URL` (options tokenizer=MODEL or policy.tokenizer, model=NAME, timeout=S, api_key_env=NAME),
    or `vllm:MODEL` (a server the project starts: `core.backends.vllm_server` lists its options)."""
    if spec.managed:
        return managed(spec)
    tokenizer_model = spec.tokenizer_model(tokenizer)
    if not tokenizer_model:
        raise ConfigError("vllm:URL needs the policy's tokenizer: pass --tokenizer MODEL (a local folder, 'tiny', or a hub id)")
    return VllmBackend(spec.target, tokenizer_model=tokenizer_model, model_name=spec.options.get("model"), timeout=spec.timeout_s, api_key=spec.api_key())
