"""The recording proxy as a plain ASGI app.

Routes (each also under ``/r/{token}/``): OpenAI ``/v1/chat/completions`` and
``/v1/responses``, Anthropic ``/v1/messages`` (+ ``/count_tokens``), Gemini
``/v1beta/models/{model}:generateContent|streamGenerateContent|countTokens``,
``GET /v1/models``, ``HEAD /`` and ``GET /health``. Live SQL reads go to the store's own
token-guarded endpoint (core/store/live.py), never through the proxy harnesses call.
Routing is hand-written rather than a framework's: the proxy's added latency
is a benchmark floor (≤ 2 ms p50) and the routes are few and fixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, unquote, unquote_to_bytes

import orjson

from core.chat import ChatRequest, Completion, Finished, ReasoningDelta, StreamEvent, TextDelta
from core.errors import (
    BackendError,
    CallBudgetError,
    ForgetuiError,
    ProtocolError,
    RateLimitedError,
    status_of,
)
from core.protocols.base import WireProtocol
from core.protocols.body import load_json
from core.protocols.checks import check_nesting
from core.protocols.images import Image, extract_images
from core.protocols.registry import get_protocol
from core.proxy.policy import DeferredPolicy, Policy, ready_policy
from core.proxy.recorder import CallInFlight, CallSink
from core.proxy.sessions import SessionRegistry
from core.serving import (
    SSE_HEADERS,
    ClientGone,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_bytes,
    send_json,
)
from core.tokens.continuation import tools_key

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 32 * 1024 * 1024
_ID_PREFIX = {"chat": "chatcmpl-", "responses": "resp_", "messages": "msg_", "gemini": "gem-"}
_HEALTH = ("/", "/health", "/healthz")
_MODEL_LISTS = ("/v1/models", "/models")
_COUNT_TOKENS = ("/v1/messages/count_tokens", "/messages/count_tokens")
_GEMINI_PREFIXES = ("/v1beta/models/", "/v1/models/", "/v1beta1/models/")
_ROUTES = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/responses": "responses",
    "/responses": "responses",
    "/v1/messages": "messages",
    "/messages": "messages",
}


def _api_key(scope: Scope) -> str | None:
    auth = header(scope, b"authorization")
    if auth and auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return header(scope, b"x-api-key") or header(scope, b"x-goog-api-key") or _query(scope).get("key")


def _query(scope: Scope) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("latin-1")
    return {k: v[-1] for k, v in parse_qs(raw).items()} if raw else {}


def split_token(scope: Scope) -> tuple[str | None, str]:
    """``/r/{token}/rest`` → (token, ``/rest``), read from the path as sent and percent-decoded once (so
    ``/r/%2561/`` is the session ``%61``, not ``a``). A token that is not UTF-8 once decoded is refused:
    decoding it leniently would make ``/r/%FF/`` and ``/r/%FE/`` one session (``\ufffd``)."""
    path: str = scope["path"]
    raw: bytes | None = scope.get("raw_path")
    if not path.startswith("/r/"):
        return None, path
    if not raw or not raw.startswith(b"/r/"):  # a server that gives no raw path: ASGI's `path` is decoded already
        token, _, rest = path[3:].partition("/")
        return token or None, "/" + rest
    raw_token, _, raw_rest = raw[3:].partition(b"/")
    try:
        token = unquote_to_bytes(raw_token).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("the rollout token in the URL (/r/<token>/) is not UTF-8 text once percent-decoded; use the token as it was given") from None
    return token or None, "/" + unquote(raw_rest.decode("latin-1"))


class ProxyApp:
    """Serves every harness protocol from one policy and records each call into the store."""

    def __init__(
        self,
        policy: Policy | DeferredPolicy,
        sessions: SessionRegistry,
        store: CallSink | None,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        call_timeout_s: float | None = None,
        served_model: str = "forgetui",
    ) -> None:
        self.policy = policy
        self.sessions = sessions
        self.store = store
        self.max_body_bytes = max_body_bytes
        self.call_timeout_s = call_timeout_s
        self.served_model = served_model
        self.inflight: set[asyncio.Task] = set()
        self._blobs_seen: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            token, path = split_token(scope)
            await self._route(scope, receive, tracked, token, path)
        except ClientGone:
            log.debug("client left before its request was read")
        except Exception as exc:  # noqa: BLE001 - the last net: an answer in the route's protocol, never uvicorn's plain-text 500
            kind, message, headers = _classify(exc)
            if started:
                log.error("failed after the answer started (%s %s): %s", scope["method"], path, message)
                return
            await self._error(send, get_protocol(_error_api(path)), kind, message, headers)

    async def _route(self, scope: Scope, receive: Receive, send: Send, token: str | None, path: str) -> None:
        method = scope["method"]
        allowed = _allowed_methods(path)
        if allowed is None:
            await self._error(send, get_protocol(_error_api(path)), "not_found", f"no route for {method} {path}")
            return
        if method not in allowed:
            await self._error(send, get_protocol(_error_api(path)), "method_not_allowed", f"{path} takes {' or '.join(sorted(allowed))}, not {method}", [(b"allow", ", ".join(sorted(allowed)).encode())])
            return
        if method in ("GET", "HEAD"):
            if path in _MODEL_LISTS:
                await send_json(send, 200, {"object": "list", "data": [{"id": self.served_model, "object": "model", "created": 0, "owned_by": "forgetui"}]})
            else:
                body = b"" if method == "HEAD" else orjson.dumps({"status": "ok", "service": "forgetui-proxy", "store": self.store_health()})
                await send_bytes(send, 200, body)
            return
        api = _ROUTES.get(path)
        if api is not None:
            await self._generate(scope, receive, send, api, token, model=None, stream=None)
            return
        if path in _COUNT_TOKENS:
            await self._count_tokens(scope, receive, send, "messages", token, None)
            return
        model, action = _gemini_route(path) or ("", "")
        if action == "countTokens":
            await self._count_tokens(scope, receive, send, "gemini", token, model)
        elif action in ("generateContent", "streamGenerateContent"):
            await self._generate(scope, receive, send, "gemini", token, model=model, stream=action == "streamGenerateContent")
        else:
            await self._error(send, get_protocol("gemini"), "not_found", f"unknown Gemini method {action!r}")

    # -- generation -------------------------------------------------------------------------

    async def _generate(self, scope: Scope, receive: Receive, send: Send, api: str, token: str | None, *, model: str | None, stream: bool | None) -> None:
        proto = get_protocol(api)
        deadline = self._deadline()
        try:
            session = self.sessions.resolve(token, _api_key(scope))
            body = await read_body(scope, receive, self.max_body_bytes)
            request = proto.parse_request(load_json(body), model=model, stream=stream)
            check_nesting(request)
            images, body = take_images(api, body)
        except ProtocolError as exc:
            await self._error(send, proto, exc.kind, str(exc))
            return
        policy = await ready_policy(self.policy)
        if images and not accepts_images(policy):
            message = (
                f"the policy backend {policy.name} takes text only, and this request carries {len(images)} image(s); "
                "send the screen as text, or serve a vision-language model (a litellm: spec whose model LiteLLM does not list as taking images needs vision=1)"
            )
            await self._error(send, proto, "invalid_request", message)
            return
        refused = self.store_refusal()
        if refused is not None:  # a call the store cannot record is not run: the caller knows, nothing is lost silently
            await self._error(send, proto, "insufficient_storage", refused)
            return
        try:
            session.admit()  # here, with no await before next_seq: two calls at once cannot both take the last one
        except CallBudgetError as exc:
            await self._error(send, proto, exc.kind, str(exc))
            return
        if session.tools_hash is None:
            session.tools_hash = tools_key(request.tools)
        call = CallInFlight(
            call_id="call-" + uuid.uuid4().hex,
            session=session,
            seq=session.next_seq(),
            api=api,
            request=request,
            body=body,  # stored as sent (images as blob references): valid JSON, storable however deep it nests
            backend=policy.name,
            images=images,
        )
        call.trace.seed = session.call_seed(call.seq)
        self._store_blobs(call)
        response_id = _ID_PREFIX[api] + uuid.uuid4().hex[:24]
        events = policy.stream(request, session, call.call_id, call.trace)
        try:
            if request.stream:
                await self._stream(send, receive, proto, request, call, events, response_id, deadline)
            else:
                await self._answer(send, receive, proto, request, call, events, response_id, deadline)
        finally:
            await events.aclose()

    async def _watched(self, work: Any, receive: Receive) -> asyncio.Task | None:
        """Run `work` as a task until it ends or the client leaves: the ended task, or None once it was cancelled.

        A client that gave up must not keep the model busy (and everything queued behind it) for an
        answer nobody reads; cancelling the task closes the backend's stream, which stops generation.
        """
        task = asyncio.ensure_future(work)
        self.inflight.add(task)  # the lifespan shutdown cancels it too
        watcher = asyncio.create_task(_wait_disconnect(receive))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            watcher.cancel()
            self.inflight.discard(task)
        if task.done() and not task.cancelled():
            return task
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return None

    def _record_cancelled(self, call: CallInFlight, before: str) -> None:
        self._record(call, "cancelled", None, {"partial_text": call.trace.partial_text}, f"client disconnected before {before}; generation cancelled")

    async def _answer(self, send: Send, receive: Receive, proto: WireProtocol, request: ChatRequest, call: CallInFlight, events: AsyncIterator[StreamEvent], response_id: str, deadline: float | None) -> None:
        collect = await self._watched(self._within(deadline, _collect(events)), receive)
        if collect is None:
            self._record_cancelled(call, "the answer")
            return
        completion: Completion | None = None
        try:
            completion = collect.result()
            payload = orjson.dumps(proto.render_response(request, completion, response_id))
        except Exception as exc:  # noqa: BLE001 - every failure becomes the protocol's error and a recorded call
            kind, message, headers = self._record_failure(call, exc, completion, {"partial_text": completion.text if completion else call.trace.partial_text})
            await self._error(send, proto, kind, message, headers)
            return
        self._record(call, "ok", completion, payload, None)
        await send_bytes(send, 200, payload)

    async def _stream(self, send: Send, receive: Receive, proto: WireProtocol, request: ChatRequest, call: CallInFlight, events: AsyncIterator[StreamEvent], response_id: str, deadline: float | None) -> None:
        # wait for the first event before sending headers, so a prompt that does not fit or an
        # unreachable backend is an ordinary HTTP error, not an error event in a 200 stream
        waited = await self._watched(self._within(deadline, anext(events)), receive)
        if waited is None:
            self._record_cancelled(call, "the first token")
            return
        try:
            first = waited.result()
        except StopAsyncIteration:
            first = Finished(Completion())
        except Exception as exc:  # noqa: BLE001
            kind, message, headers = self._record_failure(call, exc, None, {"partial_text": call.trace.partial_text})
            await self._error(send, proto, kind, message, headers)
            return
        if call.trace.answer.prompt_token_ids is not None:
            request.extra["prompt_tokens"] = len(call.trace.answer.prompt_token_ids)  # message_start reports it up front
        renderer = proto.stream_renderer(request, response_id)
        await self._watched(self._pump(send, proto, request, call, events, renderer, first, response_id, deadline), receive)  # the pump records a cancel itself

    async def _pump(self, send: Send, proto: WireProtocol, request: ChatRequest, call: CallInFlight, events: AsyncIterator[StreamEvent], renderer: Any, first: StreamEvent, response_id: str, deadline: float | None) -> None:
        completion: Completion | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await _send_chunk(send, renderer.start())
            event: StreamEvent | None = first
            while event is not None:
                if isinstance(event, TextDelta):
                    if event.text:
                        await _send_chunk(send, renderer.text(event.text))
                elif isinstance(event, ReasoningDelta):
                    await _send_chunk(send, renderer.reasoning(event.text))
                else:
                    completion = event.completion
                    await _send_chunk(send, renderer.finish(completion))
                event = await self._within(deadline, anext(events, None))
        except asyncio.CancelledError:
            self._record(call, "cancelled", completion, {"partial_text": call.trace.partial_text}, "client disconnected mid-stream; generation cancelled")
            raise
        except Exception as exc:  # noqa: BLE001 - the stream ends with the protocol's error event
            kind, message, _ = self._record_failure(call, exc, completion, {"partial_text": call.trace.partial_text})
            with contextlib.suppress(Exception):
                await _send_chunk(send, renderer.error(kind, message))
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        assert completion is not None
        try:
            self._record(call, "ok", completion, orjson.dumps(proto.render_response(request, completion, response_id)), None)
        except Exception as exc:  # noqa: BLE001 - the client has its answer; the store still gets the call
            self._record(call, "error", completion, {"partial_text": completion.text}, f"the answer was sent but could not be rendered for the store: {exc!r}")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _deadline(self) -> float | None:
        """When a call that starts now must be over (`call_timeout_s` bounds the whole call, streamed or not)."""
        return None if self.call_timeout_s is None else asyncio.get_running_loop().time() + self.call_timeout_s

    async def _within(self, deadline: float | None, awaitable: Any) -> Any:
        """`awaitable`, failed with a BackendError once the call's deadline passes."""
        if deadline is None:
            return await awaitable
        try:
            async with asyncio.timeout_at(deadline):
                return await awaitable
        except TimeoutError:
            raise BackendError(f"the call did not finish within the call timeout of {self.call_timeout_s:g} s") from None

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send, api: str, token: str | None, model: str | None) -> None:
        proto = get_protocol(api)
        deadline = self._deadline()
        try:
            self.sessions.resolve(token, _api_key(scope))
            data = load_json(await read_body(scope, receive, self.max_body_bytes))
            if api == "messages" and isinstance(data, dict):
                data = {"max_tokens": 1, **data}
            request = proto.parse_request(data, model=model, stream=False)
            check_nesting(request)
        except ProtocolError as exc:
            await self._error(send, proto, exc.kind, str(exc))
            return
        policy = await ready_policy(self.policy)
        # tokenizing a big prompt takes seconds: watched, so a client that leaves stops it
        counted = await self._watched(self._within(deadline, policy.count_tokens(request)), receive)
        if counted is None:
            return
        try:
            count = counted.result()
        except Exception as exc:  # noqa: BLE001 - the protocol's error, as for generation
            kind, message, headers = _classify(exc)
            await self._error(send, proto, kind, message, headers)
            return
        await send_json(send, 200, {"input_tokens": count} if api == "messages" else {"totalTokens": count})

    # -- store --------------------------------------------------------------------------------

    def _store_blobs(self, call: CallInFlight) -> None:
        """Each image this proxy has not stored yet, once (a resent screenshot is the same hash)."""
        if self.store is None:
            return
        for image in call.images:
            if image.sha256 in self._blobs_seen:
                continue
            self._blobs_seen.add(image.sha256)
            self.store.record_blob({"sha256": image.sha256, "media_type": image.media_type, "bytes": len(image.data), "data": image.data, "first_call_id": call.call_id, "created_at": call.started_wall})

    def store_health(self) -> dict[str, Any]:
        """The store's state for /health: ok, degraded (rows held for a full disk) or refusing (new calls get 507)."""
        return {"state": "none"} if self.store is None else self.store.health()

    def store_refusal(self) -> str | None:
        """Why a new call must be refused (its store cannot record it), or None."""
        return None if self.store is None else self.store.refusing()

    def _record_failure(self, call: CallInFlight, exc: BaseException, completion: Completion | None, response: Any) -> tuple[str, str, list | None]:
        """Record a call that failed with `exc` and return its (kind, message, headers); a backend failure is also counted on
        the call's session, so the rollout's end is not scored as the policy's (`Attempt`)."""
        kind, message, headers = _classify(exc)
        if kind == BackendError.kind:
            call.session.note_backend_failure(message)
        self._record(call, "error", completion, response, message)
        return kind, message, headers

    def _record(self, call: CallInFlight, status: str, completion: Completion | None, response: Any, error: str | None) -> None:
        if self.store is None:
            return
        try:
            self.store.record_call(call.row(status, completion, response, error))
        except Exception:  # noqa: BLE001 - recording must never take the server down
            log.exception("could not record call %s", call.call_id)

    async def _error(self, send: Send, proto: WireProtocol, kind: str, message: str, headers: list | None = None) -> None:
        await send_json(send, status_of(kind), proto.error_body(kind, message), extra=headers)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for task in list(self.inflight):
                    task.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return


def take_images(api: str, body: bytes) -> tuple[list[Image], bytes]:
    """The request's images (checked) and the body to record, with blob references where their bytes were."""
    if b"image" not in body and b"inline" not in body:  # no image part can be in it: skip a second parse
        return [], body
    parsed = orjson.loads(body)  # a fresh copy to swap the images' bytes in (the body was checked already)
    images = extract_images(api, parsed)
    if not images:
        return images, body
    try:
        return images, orjson.dumps(parsed)
    except orjson.JSONEncodeError as exc:  # refused before any generation: an answered call could not be recorded
        raise ProtocolError(f"a request with images is nested too deep to record ({exc}); with images, at most 254 levels of objects and lists are supported") from None


def accepts_images(policy: Policy) -> bool:
    """Whether the policy's backend takes image inputs (as its `capabilities` declare)."""
    return policy.backend is not None and policy.backend.capabilities.images


def _gemini_route(path: str) -> tuple[str, str] | None:
    for prefix in _GEMINI_PREFIXES:
        if path.startswith(prefix):
            model, sep, action = path[len(prefix) :].rpartition(":")
            if sep and model:
                return model, action
    return None


def _allowed_methods(path: str) -> frozenset[str] | None:
    """The methods a path answers; None for a path the proxy does not serve."""
    if path in _HEALTH or path in _MODEL_LISTS:
        return frozenset(("GET", "HEAD"))
    if path in _ROUTES or path in _COUNT_TOKENS or _gemini_route(path) is not None:
        return frozenset(("POST",))
    return None


def _error_api(path: str) -> str:
    """Whose error shape a path gets: Anthropic's and Gemini's routes answer in their own protocol."""
    if path.startswith(("/v1/messages", "/messages")):
        return "messages"
    if path.startswith(("/v1beta/", "/v1beta1/")) or _gemini_route(path) is not None:
        return "gemini"
    return "chat"


def _classify(exc: BaseException) -> tuple[str, str, list[tuple[bytes, bytes]] | None]:
    """(error kind, message, extra headers) for a failure; its HTTP status is its kind's (`KIND_STATUS`)."""
    if isinstance(exc, RateLimitedError):  # its Retry-After was checked when it was made: plain ASCII, or none
        return exc.kind, str(exc), [(b"retry-after", exc.retry_after.encode("ascii"))] if exc.retry_after else None
    if isinstance(exc, ForgetuiError):
        return exc.kind, str(exc), None
    log.error("unexpected error while answering a call", exc_info=exc)
    return "server", f"internal error in forgetui proxy: {type(exc).__name__}: {exc}", None


async def _collect(events: AsyncIterator[StreamEvent]) -> Completion:
    completion = None
    async for event in events:
        if isinstance(event, Finished):
            completion = event.completion
    if completion is None:
        raise BackendError("the backend ended without a completion")
    return completion


async def _send_chunk(send: Send, data: bytes) -> None:
    if data:
        await send({"type": "http.response.body", "body": data, "more_body": True})


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


