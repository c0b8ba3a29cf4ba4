"""A native streaming passthrough to an OpenAI-compatible ``/chat/completions`` server (vLLM, SGLang, OpenAI, ...).

One aiohttp session per backend (pooled keep-alive connections), SSE parsed with orjson:
about a tenth of a millisecond of CPU per call, where LiteLLM's client spends ~13 ms.
Token ids are recorded when the server returns them (vLLM's ``return_token_ids``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from core.backends.base import GenerationContext
from core.backends.kinds import Capabilities
from core.chat import (
    MAX_JSON_DEPTH,
    ChatRequest,
    Completion,
    Finished,
    StreamEvent,
    TextDelta,
    ToolCall,
    nests_too_deep,
    text_depth,
)
from core.errors import BackendError, ContextLengthError, RateLimitedError
from core.secrets import redact_text

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 1024  # per backend; a rollout fleet keeps hundreds of calls in flight
_ERROR_BODY_LIMIT = 64 * 1024
MAX_EVENT_BYTES = 64 << 20  # one SSE event or non-streamed answer (a first chunk with a long prompt's token ids is ~1 MB)


class HttpSession:
    """A lazily created aiohttp session bound to the event loop that first uses it.

    Proxies from the environment (``HTTPS_PROXY``, ``NO_PROXY``, ...) are honoured like httpx does, but
    looked up once per URL: aiohttp's own ``trust_env`` does it in a worker thread on every request.
    """

    def __init__(self, timeout: float, limit: int = MAX_CONNECTIONS) -> None:
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(timeout, 10.0), sock_read=timeout)
        self.limit = limit
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proxies: dict[str, tuple[Any, Any]] = {}

    def get(self) -> aiohttp.ClientSession:
        """The session for the running loop (a new one if the loop changed, e.g. a restarted proxy)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.limit, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
            self._loop = loop
        return self._session

    async def post(self, url: str, data: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """Send a POST; the caller reads the response and releases (or closes) it."""
        proxy = self._proxies.get(url)
        if proxy is None:
            proxy = self._proxies[url] = _env_proxy(url)
        return await self.get().post(url, data=data, headers=headers, proxy=proxy[0], proxy_auth=proxy[1])

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is None or session.closed:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            await session.close()
        elif self._loop is not None and not self._loop.is_closed():
            # closed from outside the loop that owns it (a proxy shutting down): close it on that loop
            try:
                if self._loop.is_running():
                    asyncio.run_coroutine_threadsafe(session.close(), self._loop).result(timeout=5)
                elif running is None:
                    self._loop.run_until_complete(session.close())
            except Exception as exc:  # noqa: BLE001 - best effort at shutdown
                log.debug("could not close the HTTP session cleanly: %r", exc)
        else:
            # its loop is gone (the proxy's thread ended first): nothing can run there any more;
            # the sockets close when collected, and the session must not warn about itself
            session.detach()


def _env_proxy(url: str) -> tuple[Any, Any]:
    """(proxy URL, proxy auth) the environment sets for `url`, or (None, None)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


def error_message(raw: bytes) -> str:
    """The human message in an upstream error body (OpenAI ``{"error": {"message"}}``, FastAPI ``detail``, text)."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace").strip()[:1000] or "(empty body)"
    if isinstance(payload, dict):
        err = payload.get("error", payload.get("detail", payload.get("message", payload)))
        if isinstance(err, dict):
            return str(err.get("message") or err.get("msg") or err)
        return str(err)
    return str(payload)


# How OpenAI (code), vLLM, SGLang, llama.cpp and LiteLLM's proxy word a prompt over the context
_CONTEXT_LENGTH = re.compile(r"context[ _]length|context window|maximum context|too many tokens|prompt is too long|exceeds the (model's )?(maximum|context)", re.I)


def is_context_length(raw: bytes) -> bool:
    """Whether an upstream error body says the prompt does not fit the model's context."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict) and err.get("code") == "context_length_exceeded":
        return True
    return bool(_CONTEXT_LENGTH.search(error_message(raw)))


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages as OpenAI chat sends them: a message with images gets content parts (images as data URLs)."""
    if not any("parts" in m for m in messages):
        return messages
    return [_wire_message(m) if "parts" in m else m for m in messages]


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for piece in message["parts"]:
        if isinstance(piece, str):
            content.append({"type": "text", "text": piece})
            continue
        if piece.data is None:  # a request parsed back from a record: its bytes are in `blobs`, not here
            raise BackendError(f"image {piece.ref} has no bytes here (a recorded request); load it from the store's blobs to send it")
        url = f"data:{piece.media_type};base64,{base64.b64encode(piece.data).decode('ascii')}"
        content.append({"type": "image_url", "image_url": {"url": url}})
    return {**{k: v for k, v in message.items() if k != "parts"}, "content": content}


class OpenAICompatBackend:
    """A `PassthroughBackend` that streams ``POST {api_base}/chat/completions`` itself.

    `api_base` is the server's OpenAI root, as OpenAI's SDK takes it (``http://host:8000/v1``).
    With `token_ids`, asks for ``return_token_ids`` (vLLM ≥ 0.10.2) and records the ids it gets.
    """

    def __init__(
        self,
        api_base: str,
        model: str,
        api_key: str | None = None,
        token_ids: bool = False,
        timeout: float = 600.0,
        name: str | None = None,
        accepts_images: bool = False,
    ) -> None:
        self.api_base = api_base.rstrip("/")
        # the server's model takes image inputs (the proxy refuses them otherwise); token ids when the server returns them
        self.capabilities = Capabilities(token_ids=token_ids, logprobs=token_ids, images=accepts_images)
        self.url = self.api_base + "/chat/completions"
        self.model = model
        self.token_ids = token_ids
        self.name = name or f"openai:{model}"
        self.headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        self._http = HttpSession(timeout)

    def _payload(self, request: ChatRequest) -> bytes:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": wire_messages(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = request.tools
            if request.tool_choice is not None:
                body["tool_choice"] = request.tool_choice
        for key in ("max_tokens", "temperature", "top_p"):
            value = getattr(request, key)
            if value is not None:
                body[key] = value
        if request.stop:
            body["stop"] = request.stop
        if self.token_ids:
            body["return_token_ids"] = True
        return orjson.dumps(body)

    async def complete(self, request: ChatRequest, context: GenerationContext) -> AsyncIterator[StreamEvent]:
        """Stream the answer; a failure before or during the stream raises BackendError (after the deltas sent)."""
        acc = _Accumulator()
        response: aiohttp.ClientResponse | None = None
        ended = got_done = False
        try:
            response = await self._http.post(self.url, self._payload(request), self.headers)
            if response.status != 200:
                raw = await response.content.read(_ERROR_BODY_LIMIT)
                if response.status in (400, 413) and is_context_length(raw):
                    raise ContextLengthError(upstream=error_message(raw))  # the client's to fix, as from the token path
                if response.status == 429:  # the client's to wait out: passed on as a 429 with the upstream's Retry-After
                    raise RateLimitedError(f"{self.name}: {redact_text(self.url)} is rate limited: {error_message(raw)}", response.headers.get("retry-after"))
                raise BackendError(f"{self.name}: {redact_text(self.url)} answered HTTP {response.status}: {error_message(raw)}")
            if response.content_type == "application/json":  # a server that does not stream
                text = self._feed(acc, await self._read_whole(response), whole=True)
                if text:
                    yield TextDelta(text)
                ended = got_done = True
                yield Finished(self._completion(acc))
                return
            # SSE by hand: aiohttp's line iterator refuses lines over 128 KiB (a first chunk with
            # a long prompt's `prompt_token_ids` is bigger)
            buf = b""
            data: list[bytes] = []
            held = 0  # bytes of the event being read: one that never ends must not grow the proxy without bound
            async for chunk in response.content.iter_any():
                buf = buf + chunk if buf else chunk
                *lines, buf = buf.split(b"\n")
                if held + len(buf) > MAX_EVENT_BYTES:
                    raise self._too_big()
                for line in lines:
                    if line.startswith(b"data:"):
                        data.append(line[5:].strip())
                        held += len(line)
                        if held > MAX_EVENT_BYTES:
                            raise self._too_big()
                        continue
                    if line.strip() or not data:
                        continue  # comments, event:/id: fields, keep-alive blank lines
                    payload = b"\n".join(data) if len(data) > 1 else data[0]
                    data.clear()
                    held = 0
                    if payload == b"[DONE]":
                        got_done = True
                        continue  # read on to the end so the connection can be reused
                    text = self._feed(acc, payload)
                    if text:
                        yield TextDelta(text)
            if buf.startswith(b"data:"):
                data.append(buf[5:].strip())
            if data and data != [b"[DONE]"]:  # the last event without its blank line
                text = self._feed(acc, b"\n".join(data))
                if text:
                    yield TextDelta(text)
            got_done = got_done or data == [b"[DONE]"]
            ended = True
        except (BackendError, ContextLengthError):  # RateLimitedError is a BackendError
            raise
        except aiohttp.ClientConnectorError as exc:
            raise BackendError(f"{self.name}: cannot reach {redact_text(self.api_base)}: {exc}; is the server running?") from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise BackendError(f"{self.name}: {redact_text(self.api_base)} timed out: {exc!r}") from exc
        except aiohttp.ClientError as exc:
            raise BackendError(f"{self.name}: the connection to {redact_text(self.api_base)} broke mid-answer: {exc!r}") from exc
        finally:
            if response is not None:
                if ended:
                    response.release()
                else:
                    response.close()  # cancelled or failed: drop the connection so the server stops
        if acc.finish is None and not got_done:
            raise BackendError(f"{self.name}: {redact_text(self.api_base)} ended the stream without a finish reason")
        yield Finished(self._completion(acc))

    async def _read_whole(self, response: aiohttp.ClientResponse) -> bytes:
        """A non-streamed answer, refused past `MAX_EVENT_BYTES` (read as it comes, never all at once)."""
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > MAX_EVENT_BYTES:
                raise self._too_big()
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_big(self) -> BackendError:
        return BackendError(f"{self.name}: {redact_text(self.api_base)} sent a stream event or answer over {MAX_EVENT_BYTES >> 20} MiB")

    def _feed(self, acc: _Accumulator, payload: bytes, whole: bool = False) -> str:
        """One event (or a whole non-streamed answer) into `acc`: its visible text; a BackendError for a malformed one."""
        event = self._event(payload)
        try:
            return acc.feed(_as_chunk(event) if whole else event)
        except MalformedEvent as exc:
            raise self._malformed(exc, payload) from None

    def _completion(self, acc: _Accumulator) -> Completion:
        try:
            return acc.completion()
        except MalformedEvent as exc:
            raise self._malformed(exc, b"") from None

    def _malformed(self, why: MalformedEvent, payload: bytes) -> BackendError:
        shown = f": {payload[:200]!r}" if payload else ""
        return BackendError(f"{self.name}: {redact_text(self.api_base)} sent an answer the proxy cannot serve ({why}){shown}")

    def _event(self, payload: bytes) -> dict[str, Any]:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise BackendError(f"{self.name}: malformed stream event from {redact_text(self.api_base)}: {payload[:200]!r}") from exc
        if not isinstance(event, dict):
            raise BackendError(f"{self.name}: malformed stream event from {redact_text(self.api_base)}: {payload[:200]!r}")
        if event.get("error"):
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise BackendError(f"{self.name}: {redact_text(self.api_base)} failed mid-answer: {message}")
        return event

    async def aclose(self) -> None:
        await self._http.aclose()


class MalformedEvent(ValueError):
    """An upstream event (or answer) that is JSON but not the shape OpenAI's chat API sends: says which field."""


def _get(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """`obj[key]` when it is absent, null or of `kind` (a bool is never an int here); MalformedEvent otherwise."""
    value = obj.get(key)
    if value is None or (isinstance(value, kind) and not (isinstance(value, bool) and kind is int)):
        return value
    raise MalformedEvent(f"{where}{key} is {type(value).__name__} {str(value)[:60]!r}, not {getattr(kind, '__name__', kind)}")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedEvent(f"{where} is {type(value).__name__}, not an object")
    return value


def _token_ids(obj: dict[str, Any], key: str, where: str) -> list[int] | None:
    """Token ids as a server returns them: a list of non-negative 32-bit integers (what the store holds)."""
    ids = _get(obj, key, list, where)
    if ids is not None and not all(type(i) is int and 0 <= i < 2**31 for i in ids):
        raise MalformedEvent(f"{where}{key} holds something other than token ids (non-negative integers below 2^31)")
    return ids


def tool_calls_of(slots: dict[int, dict[str, str]]) -> list[ToolCall]:
    """Streamed tool-call pieces as tool calls: arguments that are not JSON kept as ``{"_raw": text}``;
    arguments nested past the proxy's one limit are a MalformedEvent (nothing could render or store them)."""
    calls = [ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"] or "{}") for i, c in sorted(slots.items())]
    for call in calls:
        if nests_too_deep(call.arguments):
            raise MalformedEvent(f"the arguments of tool call {call.name!r} nest {text_depth(call.arguments)} levels deep, past the {MAX_JSON_DEPTH} the proxy can re-serialise")
        try:
            json.loads(call.arguments)
        except json.JSONDecodeError:
            call.arguments = json.dumps({"_raw": call.arguments})
    return calls


def _as_chunk(answer: dict[str, Any]) -> dict[str, Any]:
    """A whole chat.completion as one chat.completion.chunk."""
    choices = []
    for i, choice in enumerate(_get(answer, "choices", list, "") or ()):
        choice = _object(choice, f"choices[{i}]")
        delta = dict(_get(choice, "message", dict, f"choices[{i}].") or {})
        calls = _get(delta, "tool_calls", list, f"choices[{i}].message.") or ()
        delta["tool_calls"] = [{**_object(tc, f"choices[{i}].message.tool_calls[{j}]"), "index": j} for j, tc in enumerate(calls)]
        choices.append({**choice, "delta": delta})
    return {**answer, "choices": choices}


class _Accumulator:
    """Folds chat.completion.chunk events into text deltas and one Completion; MalformedEvent for a wrong shape."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.token_ids: list[int] = []
        self.prompt_ids: list[int] | None = None
        self.finish: str | None = None
        self.usage: dict[str, Any] = {}

    def feed(self, event: dict[str, Any]) -> str:
        """Take one event; return its visible text (possibly empty)."""
        usage = _get(event, "usage", dict, "")
        if usage is not None:
            for key in ("prompt_tokens", "completion_tokens"):
                if (_get(usage, key, int, "usage.") or 0) < 0:
                    raise MalformedEvent(f"usage.{key} is negative")
            self.usage = usage or self.usage
        prompt_ids = _token_ids(event, "prompt_token_ids", "")
        if self.prompt_ids is None and prompt_ids:
            self.prompt_ids = list(prompt_ids)
        out = ""
        for i, choice in enumerate(_get(event, "choices", list, "") or ()):
            where = f"choices[{i}]."
            choice = _object(choice, f"choices[{i}]")
            delta = _get(choice, "delta", dict, where) or {}
            content = _get(delta, "content", str, where + "delta.")
            if content:
                self.text.append(content)
                out += content
            for j, tc in enumerate(_get(delta, "tool_calls", list, where + "delta.") or ()):
                tc_where = f"{where}delta.tool_calls[{j}]."
                tc = _object(tc, tc_where[:-1])
                slot = self.calls.setdefault(_get(tc, "index", int, tc_where) or 0, {"id": "", "name": "", "arguments": ""})
                slot["id"] = _get(tc, "id", str, tc_where) or slot["id"]
                fn = _get(tc, "function", dict, tc_where) or {}
                slot["name"] += _get(fn, "name", str, tc_where + "function.") or ""
                slot["arguments"] += _get(fn, "arguments", str, tc_where + "function.") or ""
            finish = _get(choice, "finish_reason", str, where)
            if finish:
                self.finish = finish
            ids = _token_ids(choice, "token_ids", where)
            if ids:
                self.token_ids.extend(ids)
            prompt_ids = _token_ids(choice, "prompt_token_ids", where)
            if self.prompt_ids is None and prompt_ids:
                self.prompt_ids = list(prompt_ids)
        return out

    def completion(self) -> Completion:
        calls = tool_calls_of(self.calls)
        prompt_tokens = self.usage.get("prompt_tokens") or (len(self.prompt_ids) if self.prompt_ids else 0)
        return Completion(
            text="".join(self.text),
            tool_calls=calls,
            finish_reason="tool_calls" if calls else ("length" if self.finish == "length" else "stop"),
            prompt_tokens=int(prompt_tokens),
            completion_tokens=int(self.usage.get("completion_tokens") or len(self.token_ids)),
            prompt_token_ids=self.prompt_ids,
            completion_token_ids=self.token_ids or None,
        )
