"""`forgetui serve-model`: a vLLM-compatible token-in/token-out HTTP subset over a TokenBackend.

Routes: ``POST /v1/completions`` (prompt = token ids or text; ``return_token_ids``;
``logprobs``; streaming as SSE), ``GET /v1/models``, ``GET /health``, ``POST /tokenize``, and
vLLM's dynamic LoRA routes ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter``
(always on here; vLLM needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and ``--enable-lora``).
Response shapes follow vLLM's: ``choices[0].token_ids`` / ``choices[0].prompt_token_ids``
(also copied to a top-level ``prompt_token_ids``), ``choices[0].logprobs.tokens`` /
``token_logprobs``; a request's ``model`` picks the base model or a loaded adapter by name.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from core.backends.base import GenerationContext, SamplingParams, TokenBackend, TokenChunk
from core.backends.builtin import BuiltinBackend
from core.chat import ChatRequest
from core.errors import ContextLengthError, ForgetuiError, status_of
from core.proxy.server import serve_forever

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions


def _error(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}`` with `status`."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def _error_type(exc: BaseException) -> str:
    """The error's `type` field: its kind, or vLLM's ``internal_error`` for a server fault."""
    kind = exc.kind if isinstance(exc, ForgetuiError) else "server"
    return "internal_error" if status_of(kind) >= 500 and kind == "server" else kind


def _prompt_ids(backend: TokenBackend, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return list(backend.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list | str):
        return _prompt_ids(backend, prompt[0])
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return list(prompt)
    raise ValueError("prompt must be a non-empty list of token ids or a string (one prompt per request)")


def _sampling(body: dict[str, Any]) -> SamplingParams:
    max_tokens = body.get("max_tokens")
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    seed = body.get("seed")
    stop_ids = body.get("stop_token_ids") or []
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError("max_tokens must be a positive integer")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        seed=None if seed is None else int(seed),
        stop_token_ids=[int(t) for t in stop_ids],
    )


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


class AdapterNotFound(Exception):
    """vLLM's LoRAAdapterNotFoundError: no adapter at the path (answered 404)."""


def adapter_folder(name: str, path: str) -> Path:
    """The PEFT adapter folder at `path`; vLLM's errors when it is missing or holds no tensors."""
    folder = Path(path).expanduser()
    if not (folder / ADAPTER_CONFIG).is_file():
        raise AdapterNotFound(f"Loading lora {name} failed: No adapter found for {path}")
    if not any((folder / f).is_file() for f in ADAPTER_WEIGHTS):
        raise ValueError(f"{path} doesn't contain tensors")
    return folder


def merged_weights(model: Any, folder: Path) -> dict[str, Any]:
    """`model`'s state dict with the PEFT LoRA adapter in `folder` merged in; `model` is left as it is."""
    from peft import PeftModel

    merged = PeftModel.from_pretrained(copy.deepcopy(model), str(folder)).merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}


def builtin_copier(backend: TokenBackend) -> Callable[[], Any] | None:
    """How to open a fresh copy of a BuiltinBackend (None for other backends: they take no adapters)."""
    if not isinstance(backend, BuiltinBackend):
        return None
    dtype = backend.model.dtype
    return lambda: BuiltinBackend(
        backend.name, device=backend.device, dtype=dtype, max_context=backend.context_length
    )


class Adapters:
    """LoRA adapters loaded at runtime by name, each served by a copy of the base model with the adapter merged in."""

    def __init__(self, open_copy: Callable[[], Any] | None) -> None:
        self.open_copy = open_copy
        self.backends: dict[str, TokenBackend] = {}
        self.paths: dict[str, str] = {}
        self.lock = asyncio.Lock()
        self._retiring: set[asyncio.Task] = set()

    async def load(self, name: str, path: str) -> None:
        """Serve `name` with the adapter at `path` (replacing an adapter of that name); raises on any failure."""
        folder = adapter_folder(name, path)
        if self.open_copy is None:
            raise ValueError("this server's backend cannot take LoRA adapters (serve a built-in model)")
        fresh = await asyncio.to_thread(self.open_copy)
        try:
            state = await asyncio.to_thread(merged_weights, fresh.model, folder)
            await asyncio.to_thread(fresh.reload_weights, state)
        except BaseException:
            await fresh.aclose()
            raise
        old = self.backends.get(name)
        self.backends[name], self.paths[name] = fresh, path
        if old is not None:
            self._retire(old)
        log.info("loaded LoRA adapter %r from %s", name, path)

    def unload(self, name: str) -> None:
        """Stop serving `name`; its model is closed once its running generations end."""
        self._retire(self.backends.pop(name))
        del self.paths[name]
        log.info("removed LoRA adapter %r", name)

    def _retire(self, backend: TokenBackend) -> None:
        task = asyncio.create_task(_close_when_idle(backend))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def aclose(self) -> None:
        """Close every adapter's model."""
        for name in list(self.backends):
            self.unload(name)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)


async def _close_when_idle(backend: TokenBackend) -> None:
    wait_idle = getattr(backend, "wait_idle", None)
    if wait_idle is not None:
        await wait_idle()
    await backend.aclose()


async def _json_body(request: Request) -> dict[str, Any] | JSONResponse:
    """The request's JSON object, or the 400 answer."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "request body is not valid JSON")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    return body


class _Job:
    """One completion: the parsed request plus what it needs to render answers."""

    def __init__(self, backend: TokenBackend, body: dict[str, Any], model_name: str) -> None:
        self.backend = backend
        self.prompt_ids = _prompt_ids(backend, body.get("prompt"))
        self.sampling = _sampling(body)
        self.logprobs = body.get("logprobs")
        self.return_token_ids = bool(body.get("return_token_ids"))
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.model_name = body.get("model") or model_name
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        session = str(body.get("session_id") or body.get("user") or self.id)
        request = ChatRequest(api="chat", model=self.model_name, messages=[])
        self.context = GenerationContext(session=session, call_seq=0, request=request)

    def tokens_text(self, ids: list[int]) -> list[str]:
        return [self.backend.tokenizer.decode([t]) for t in ids]

    def choice(self, ids: list[int], lps: list[float], finish: str | None, first: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.backend.tokenizer.decode(ids, skip_special_tokens=True),
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        if self.logprobs is not None:
            choice["logprobs"] = {
                "tokens": self.tokens_text(ids),
                "token_logprobs": lps,
                "top_logprobs": [{tok: lp} for tok, lp in zip(self.tokens_text(ids), lps, strict=True)]
                if self.logprobs
                else [None] * len(ids),
                "text_offset": [],
            }
        if self.return_token_ids:
            choice["token_ids"] = ids
            if first:
                choice["prompt_token_ids"] = self.prompt_ids
        return choice

    def usage(self, completion_tokens: int) -> dict[str, int]:
        p = len(self.prompt_ids)
        return {
            "prompt_tokens": p,
            "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens,
        }

    def envelope(self, choice: dict[str, Any], usage: dict[str, int] | None, first: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model_name,
            "choices": [choice],
        }
        if usage is not None:
            out["usage"] = usage
        if self.return_token_ids and first:
            out["prompt_token_ids"] = self.prompt_ids
        return out

    def chunks(self) -> AsyncIterator[TokenChunk]:
        return self.backend.generate(self.prompt_ids, self.sampling, self.context)


class ModelRoutes:
    """serve-model's endpoints over one backend and its LoRA adapters (vLLM's shapes and messages)."""

    def __init__(self, backend: TokenBackend, served: str, adapters: Adapters) -> None:
        self.backend, self.served, self.adapters = backend, served, adapters

    def target(self, body: dict[str, Any]) -> TokenBackend | JSONResponse:
        """The backend a request's `model` names: the base model (also when absent) or a loaded adapter."""
        name = body.get("model")
        if not name or name == self.served:
            return self.backend
        if name in self.adapters.backends:
            return self.adapters.backends[name]
        return _error(404, f"The model `{name}` does not exist.", "NotFoundError", param="model")

    async def completions(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        if (body.get("n") or 1) != 1:
            return _error(400, "only n=1 is supported")
        chosen = self.target(body)
        if isinstance(chosen, JSONResponse):
            return chosen
        try:
            job = _Job(chosen, body, self.served)
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc))
        if len(job.prompt_ids) >= chosen.context_length:
            err = ContextLengthError(len(job.prompt_ids), chosen.context_length - 1)
            return _error(400, str(err))
        if body.get("stream"):
            return StreamingResponse(self._stream(job), media_type="text/event-stream")
        ids: list[int] = []
        lps: list[float] = []
        finish = None
        try:
            async with aclosing(job.chunks()) as chunks:
                async for chunk in chunks:
                    ids += chunk.token_ids
                    lps += chunk.logprobs
                    finish = chunk.finish_reason or finish
        except ContextLengthError as exc:
            return _error(exc.status, str(exc))
        except ForgetuiError as exc:  # its kind's status, from the one table (a full batch is 503, a bad request 400, ...)
            log.exception("generation failed")
            return _error(status_of(exc.kind), str(exc), _error_type(exc))
        return JSONResponse(
            job.envelope(job.choice(ids, lps, finish or "length", True), job.usage(len(ids)), True)
        )

    async def _stream(self, job: _Job) -> AsyncIterator[str]:
        first = True
        count = 0
        try:
            async with aclosing(job.chunks()) as chunks:
                async for chunk in chunks:
                    count += len(chunk.token_ids)
                    choice = job.choice(chunk.token_ids, chunk.logprobs, chunk.finish_reason, first)
                    event = job.envelope(choice, None, first)
                    first = False
                    yield f"data: {json.dumps(event)}\n\n"
        except Exception as exc:  # the stream has begun: report in-band, like vLLM
            log.exception("generation failed mid-stream")
            kind = exc.kind if isinstance(exc, ForgetuiError) else "server"
            yield f"data: {json.dumps({'error': {'message': str(exc), 'type': _error_type(exc), 'code': status_of(kind)}})}\n\n"
            return
        if job.include_usage:
            yield f"data: {json.dumps(job.envelope({}, job.usage(count), False) | {'choices': []})}\n\n"
        yield "data: [DONE]\n\n"

    async def models(self, request: Request) -> Response:
        base = {
            "id": self.served,
            "object": "model",
            "created": 0,
            "owned_by": "forgetui",
            "root": self.served,
            "parent": None,
            "max_model_len": self.backend.context_length,
        }
        loras = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "forgetui",
                "root": path,
                "parent": self.served,
                "max_model_len": None,
            }
            for name, path in self.adapters.paths.items()
        ]
        return JSONResponse({"object": "list", "data": [base, *loras]})

    async def load_lora_adapter(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        async with self.adapters.lock:
            if name in self.adapters.backends and not body.get("load_inplace"):
                message = f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
                return _error(400, message, "InvalidUserInput")
            try:
                await self.adapters.load(name, path)
            except AdapterNotFound as exc:
                return _error(404, str(exc), "NotFoundError")
            except Exception as exc:  # noqa: BLE001 - vLLM answers any other load failure with a 500
                log.warning("cannot load LoRA adapter %r from %s: %s", name, path, exc)
                return _error(500, str(exc), "InternalServerError")
        return Response(f"Success: LoRA adapter '{name}' added successfully.", status_code=200)

    async def unload_lora_adapter(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        name = body.get("lora_name")
        if not name:
            return _error(
                400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput"
            )
        async with self.adapters.lock:
            if name not in self.adapters.backends:
                return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            self.adapters.unload(name)
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", status_code=200)

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        if isinstance(body.get("messages"), list):
            text = self.backend.tokenizer.apply_chat_template(
                body["messages"],
                tools=body.get("tools"),
                tokenize=False,
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            )
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            return _error(400, "give `prompt` (a string) or `messages`")
        ids = list(
            self.backend.tokenizer(text, add_special_tokens=bool(body.get("add_special_tokens", False)))[
                "input_ids"
            ]
        )
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.backend.context_length})


def build_model_app(
    backend: TokenBackend, model_name: str | None = None, open_copy: Callable[[], Any] | None = None
) -> Starlette:
    """The serve-model ASGI app over `backend`; `open_copy` opens a fresh copy of it for each LoRA adapter.

    `app.state.adapters` holds the loaded adapters (close them with its `aclose`).
    """
    adapters = Adapters(open_copy or builtin_copier(backend))
    r = ModelRoutes(backend, model_name or backend.name, adapters)
    app = Starlette(
        routes=[
            Route("/v1/completions", r.completions, methods=["POST"]),
            Route("/v1/models", r.models, methods=["GET"]),
            Route("/v1/load_lora_adapter", r.load_lora_adapter, methods=["POST"]),
            Route("/v1/unload_lora_adapter", r.unload_lora_adapter, methods=["POST"]),
            Route("/health", r.health, methods=["GET"]),
            Route("/tokenize", r.tokenize, methods=["POST"]),
        ]
    )
    app.state.adapters = adapters
    return app


async def serve_model(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "auto",
    dtype: str = "auto",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Load `model` into the built-in backend (in `dtype`) and serve it until SIGINT/SIGTERM; `on_ready(base_url)` once listening."""
    backend = BuiltinBackend(model, device=device, dtype=dtype)
    app = build_model_app(backend, model_name=model)

    def ready(url: str) -> None:
        log.info("serving %s on %s/v1 (context %d)", model, url, backend.context_length)
        if on_ready is not None:
            on_ready(url)

    try:
        await serve_forever(app, host, port, ready)
    finally:
        await app.state.adapters.aclose()
        await backend.aclose()
