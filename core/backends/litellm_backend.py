"""Passthrough to any provider through LiteLLM (baselines, teacher models for SFT).

Records text and tool calls; token ids too when the server returns them
(vLLM's `return_token_ids`, asked for with ``token_ids=1`` in the spec).
OpenAI-compatible servers named with an ``api_base`` are streamed natively (`OpenAICompatBackend`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from core.backends.base import GenerationContext
from core.backends.kinds import Capabilities
from core.backends.openai_compat import MalformedEvent, OpenAICompatBackend, tool_calls_of, wire_messages
from core.backends.spec import PolicySpec
from core.chat import ChatRequest, Completion, Finished, StreamEvent, TextDelta
from core.errors import BackendError, ContextLengthError, RateLimitedError
from core.secrets import redact_text

# LiteLLM providers whose wire format is already OpenAI chat, with the env var LiteLLM reads their key from
OPENAI_COMPATIBLE = {
    "openai": "OPENAI_API_KEY",
    "hosted_vllm": "HOSTED_VLLM_API_KEY",
    "openai_compatible": "OPENAI_API_KEY",
    "custom_openai": "OPENAI_API_KEY",
}


def native_upstream(model: str, api_base: str | None, api_key: str | None) -> tuple[str, str, str | None] | None:
    """(api base, upstream model name, api key) when `model` + `api_base` name an OpenAI-compatible server, else None."""
    provider, sep, name = model.partition("/")
    if sep and provider in OPENAI_COMPATIBLE:
        env = OPENAI_COMPATIBLE[provider]
        if provider == "hosted_vllm":
            api_base = api_base or os.environ.get("HOSTED_VLLM_API_BASE")
    elif api_base and not _is_litellm_provider(provider if sep else ""):
        name, env = model, "OPENAI_API_KEY"  # a bare (or unprefixed) model name on a given server
    else:
        return None
    if not api_base or not name:
        return None
    return api_base, name, api_key or os.environ.get(env) or None


def _is_litellm_provider(prefix: str) -> bool:
    """Whether `prefix` is one of LiteLLM's provider names (imports LiteLLM only for a non-empty prefix)."""
    if not prefix:
        return False
    return prefix in set(_litellm().provider_list)


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else it fetches a cost map at import
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class LiteLLMBackend:
    """`litellm:MODEL` — e.g. ``litellm:openai/gpt-4o`` or ``litellm:hosted_vllm/qwen?api_base=http://...``."""

    def __init__(
        self, model: str, api_base: str | None = None, api_key: str | None = None, token_ids: bool = False, timeout: float = 600.0, vision: bool | None = None
    ) -> None:
        self.model = model
        self._vision = vision  # None: as LiteLLM's model list says (`supports_vision`)
        self.name = f"litellm:{model}"
        self.api_base = api_base
        self.api_key = api_key
        self.token_ids = token_ids
        self.timeout = timeout
        # OpenAI-compatible upstreams are streamed natively: LiteLLM's client costs ~13 ms of CPU per
        # call (completion_cost twice, logging handlers, pydantic objects per chunk) and the wire
        # format of these servers is already OpenAI chat, so it buys nothing there
        native = native_upstream(model, api_base, api_key)
        self._native: OpenAICompatBackend | None = None
        if native is not None:
            base, upstream_model, key = native
            self._native = OpenAICompatBackend(base, upstream_model, api_key=key, token_ids=token_ids, timeout=timeout, name=self.name, accepts_images=bool(vision))

    @property
    def capabilities(self) -> Capabilities:
        """Text in, text out (token ids when asked for); images when `vision=` in the spec says so, else as
        LiteLLM's model list says (a model it does not know: text only)."""
        if self._vision is None:
            try:
                self._vision = bool(_litellm().supports_vision(model=self.model))
            except Exception:  # noqa: BLE001 - a model LiteLLM does not know: text only unless the spec says vision=1
                self._vision = False
        return Capabilities(token_ids=self.token_ids, logprobs=self.token_ids, images=self._vision)

    def complete(self, request: ChatRequest, context: GenerationContext) -> AsyncIterator[StreamEvent]:
        if self._native is not None:
            return self._native.complete(request, context)
        return self._complete_litellm(request)

    async def _complete_litellm(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        litellm = _litellm()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": wire_messages(request.messages),  # LiteLLM translates image parts for each provider
            "stream": True,
            "stream_options": {"include_usage": True},
            "timeout": self.timeout,
        }
        for key, value in (
            ("api_base", self.api_base),
            ("api_key", self.api_key),
            ("tools", request.tools or None),
            ("tool_choice", request.tool_choice if request.tools else None),
            ("max_tokens", request.max_tokens),
            ("temperature", request.temperature),
            ("top_p", request.top_p),
            ("stop", request.stop or None),
        ):
            if value is not None:
                kwargs[key] = value
        if self.token_ids:
            kwargs["extra_body"] = {"return_token_ids": True}
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        token_ids: list[int] = []
        finish = "stop"
        usage: Any = None
        try:
            response = await litellm.acompletion(**kwargs)
            async for chunk in response:
                usage = getattr(chunk, "usage", None) or usage
                for choice in chunk.choices or []:
                    delta = choice.delta
                    if getattr(delta, "content", None):
                        text.append(delta.content)
                        yield TextDelta(delta.content)
                    for tc in getattr(delta, "tool_calls", None) or []:
                        slot = calls.setdefault(tc.index or 0, {"id": "", "name": "", "arguments": ""})
                        slot["id"] = tc.id or slot["id"]
                        if tc.function is not None:
                            slot["name"] += tc.function.name or ""
                            slot["arguments"] += tc.function.arguments or ""
                    if choice.finish_reason:
                        finish = choice.finish_reason
                    ids = getattr(choice, "token_ids", None) or (getattr(choice, "model_extra", None) or {}).get("token_ids")
                    if ids:
                        token_ids.extend(ids)
        except BackendError:
            raise
        except litellm.ContextWindowExceededError as exc:  # the client's to fix, as from the token path
            raise ContextLengthError(upstream=str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - every provider failure is a backend error
            if isinstance(exc, getattr(litellm, "RateLimitError", ())):  # the client's to wait out, with its Retry-After
                headers = getattr(getattr(exc, "response", None), "headers", None) or {}
                raise RateLimitedError(f"{self.name}: rate limited: {redact_text(str(exc))}", headers.get("retry-after")) from exc
            raise BackendError(f"{self.name}: {type(exc).__name__}: {redact_text(str(exc))}") from exc
        try:
            tool_calls = tool_calls_of(calls)
        except MalformedEvent as exc:
            raise BackendError(f"{self.name}: the provider sent an answer the proxy cannot serve ({exc})") from None
        yield Finished(
            Completion(
                text="".join(text),
                tool_calls=tool_calls,
                finish_reason="tool_calls" if tool_calls else ("length" if finish == "length" else "stop"),
                prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                completion_tokens=getattr(usage, "completion_tokens", 0) or len(token_ids),
                completion_token_ids=token_ids or None,
            )
        )

    async def aclose(self) -> None:
        if self._native is not None:
            await self._native.aclose()


def from_spec(spec: PolicySpec, *, tokenizer: str | None = None) -> LiteLLMBackend:
    """`litellm:MODEL` (options api_base=URL, api_key_env=NAME, token_ids=1, timeout=S, vision=1)."""
    return LiteLLMBackend(
        spec.target, api_base=spec.options.get("api_base"), api_key=spec.api_key(), token_ids=bool(spec.flag("token_ids")),
        timeout=spec.timeout_s, vision=spec.flag("vision"),
    )
