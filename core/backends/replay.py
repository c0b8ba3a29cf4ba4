"""A replay policy: answers a session's call k with the recorded completion k, token for token.

The same completion ids and logprobs as recorded go back through the real token path (decode, tool-call
parsing, splicing), so the harness sees the answers it saw then. Each call's prompt, rendered by the proxy
from what the harness sent now, is compared with the recorded prompt: the first differing token, the
calls beyond the recording, and the calls never made are what `forgetui replay` reports.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from core.backends.base import GenerationContext, SamplingParams, TokenChunk

REPLAY_CONTEXT = 1 << 22  # the recording decided every length; replay never cuts a prompt


@dataclass
class RecordedCall:
    """One call of the recording: the prompt it was given and the completion it sampled."""

    seq: int
    call_id: str
    prompt_ids: list[int] | None
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None = None


@dataclass
class ServedCall:
    """What replay saw for call k: the prompt the proxy rendered now, and whether it matched the recording."""

    index: int
    prompt_ids: list[int]
    recorded: RecordedCall | None
    first_difference: int | None = None  # token position where the prompts part, None when equal (or not recorded)


@dataclass
class ReplayBackend:
    """A `TokenBackend` over one rollout's recorded calls (all sessions share them: replay runs one rollout)."""

    recorded: list[RecordedCall]
    tokenizer: Any
    name: str = "replay"
    context_length: int = REPLAY_CONTEXT
    served: list[ServedCall] = field(default_factory=list)
    _next: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext) -> AsyncIterator[TokenChunk]:
        k = self._next[context.session]
        self._next[context.session] += 1
        rec = self.recorded[k] if k < len(self.recorded) else None
        served = ServedCall(k, list(prompt_ids), rec)
        if rec is not None and rec.prompt_ids is not None and list(rec.prompt_ids) != served.prompt_ids:
            served.first_difference = first_difference(rec.prompt_ids, served.prompt_ids)
        self.served.append(served)
        if rec is None:  # more calls than recorded: end the turn (eos), the report says where
            eos = self.tokenizer.eos_token_id
            yield TokenChunk([eos] if eos is not None else [], [0.0] if eos is not None else [], "stop")
            return
        finish = "length" if rec.finish_reason == "length" else "stop"
        yield TokenChunk(list(rec.completion_ids), list(rec.logprobs), finish)
        await asyncio.sleep(0)

    async def aclose(self) -> None:
        return None


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter one's length when one extends the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
