"""Passthrough to any provider through LiteLLM (baselines, teacher models for SFT).

Records text and tool calls; token ids too when the server returns them
(vLLM's `return_token_ids`, asked for with ``token_ids=1`` in the spec).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

from core.backends.base import GenerationContext
from core.chat import ChatRequest, Completion, Finished, StreamEvent, TextDelta, ToolCall
from core.errors import BackendError


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else it fetches a cost map at import
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class LiteLLMBackend:
    """`litellm:MODEL` — e.g. ``litellm:openai/gpt-4o`` or ``litellm:hosted_vllm/qwen?api_base=http://...``."""

    def __init__(self, model: str, api_base: str | None = None, api_key: str | None = None, token_ids: bool = False, timeout: float = 600.0) -> None:
        self.model = model
        self.name = f"litellm:{model}"
        self.api_base = api_base
        self.api_key = api_key
        self.token_ids = token_ids
        self.timeout = timeout

    async def complete(self, request: ChatRequest, context: GenerationContext) -> AsyncIterator[StreamEvent]:
        litellm = _litellm()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
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
        except Exception as exc:  # noqa: BLE001 - every provider failure is a backend error
            raise BackendError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        tool_calls = [
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"] or "{}") for i, c in sorted(calls.items())
        ]
        for call in tool_calls:
            try:
                json.loads(call.arguments)
            except json.JSONDecodeError:
                call.arguments = json.dumps({"_raw": call.arguments})
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
        return None
