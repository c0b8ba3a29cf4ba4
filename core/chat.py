"""The canonical, protocol-neutral form of a model call.

Every wire protocol (chat, responses, messages, gemini) is parsed into a
`ChatRequest` (OpenAI chat messages + function tools) and every answer is a
`Completion`; streaming answers are a sequence of `StreamEvent`s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["chat", "responses", "messages", "gemini"]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass
class ToolCall:
    """A function call: `arguments` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str


@dataclass
class ChatRequest:
    """A request in canonical form.

    `messages` use OpenAI chat format: ``{"role": "system"|"user"|"assistant"|"tool",
    "content": str | None, "tool_calls": [{"id","type":"function","function":{"name","arguments"}}],
    "tool_call_id": str}``; content is always a plain string (text parts joined).
    `tools` are OpenAI function tools ``{"type":"function","function":{name,description,parameters}}``.
    """

    api: Api
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    tool_choice: Any = None
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Completion:
    """One answer; token fields are set by token backends (and by passthrough when the server returns them)."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    tool_parse_error: str | None = None
    # the limit forgetui imposed itself (not asked for by the client) cut the answer
    truncated_by_proxy: bool = False


@dataclass
class TextDelta:
    """A piece of visible answer text, streamed as it is sampled."""

    text: str


@dataclass
class Finished:
    """The end of a stream: the whole completion (tool calls are rendered from it)."""

    completion: Completion


StreamEvent = TextDelta | Finished
