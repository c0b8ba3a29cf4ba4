"""The contracts of policy backends.

A *token backend* gets prompt token ids and streams sampled token ids with one
logprob each; the proxy owns templating, tool-call parsing and splicing.
A *passthrough* backend gets the canonical request and streams text itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from core.backends.kinds import Capabilities
from core.chat import ChatRequest, StreamEvent


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class GenerationContext:
    """Who is asking: lets the scripted backend pick its turn and see the offered tools."""

    session: str
    call_seq: int
    request: ChatRequest


@dataclass
class TokenChunk:
    """Newly sampled tokens; the last chunk of a generation carries `finish_reason`."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"] | None = None


class TokenBackend(Protocol):
    name: str
    tokenizer: Any  # a transformers PreTrainedTokenizerBase with a chat template
    context_length: int
    capabilities: Capabilities  # what it does beyond sampling (weight reload, adapters, images)
    weights_version: int | None  # which weights sample now (recorded on every call); None when that means nothing

    def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext
    ) -> AsyncIterator[TokenChunk]:
        """Sample a completion. Cancelling the consuming task must stop generation promptly."""
        ...

    async def aclose(self) -> None: ...


class PassthroughBackend(Protocol):
    name: str
    capabilities: Capabilities

    def complete(self, request: ChatRequest, context: GenerationContext) -> AsyncIterator[StreamEvent]: ...

    async def aclose(self) -> None: ...
