"""Turns one finished, failed or cancelled call into a `calls` row.

A prompt that provably starts with its parent's prompt + completion (the continuation still holds
those ids and they match, token for token) is stored compactly: the parent reference
(`parent_call_id`, `prefix_tokens`) and only the ids after it (`prompt_new_token_ids`). Anything
else keeps its full `prompt_token_ids`, and so do prompts whose spliced prefix is shorter than
`COMPACT_MIN_PREFIX` ids (a few KB: not worth a parent walk on every read, and short conversations
stay readable straight from `calls`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from core.chat import ChatRequest, Completion
from core.protocols.images import Image
from core.proxy.policy import CallTrace
from core.proxy.sessions import Session
from core.store.writer import utcnow

COMPACT_MIN_PREFIX = 2048


def prompt_columns(prompt: Any, trace: CallTrace, session: Session) -> dict[str, Any]:
    """The prompt's columns: compact when the trace says it extends its parent and the parent's ids prove it."""
    full = {"prompt_token_ids": prompt}
    n = trace.prefix_tokens or 0
    if prompt is None or not trace.extends_parent or trace.parent_call_id is None or n < max(COMPACT_MIN_PREFIX, 1):
        return full
    parent = session.turn_ids(trace.parent_call_id)
    head = prompt[:n] if isinstance(prompt, list) else list(prompt[:n])
    if parent is None or len(parent) != n or head != parent:
        return full
    return {"prompt_token_ids": None, "prompt_new_token_ids": list(prompt[n:])}


class CallSink(Protocol):
    """Where the proxy records (`core.store.writer.Store` is one): calls, image blobs, and whether it can take more."""

    def record_call(self, row: dict[str, Any]) -> None: ...

    def record_blob(self, row: dict[str, Any]) -> None: ...

    def health(self) -> dict[str, Any]: ...

    def refusing(self) -> str | None: ...


@dataclass
class CallInFlight:
    """A call from the moment its request parsed to its last byte."""

    call_id: str
    session: Session
    seq: int
    api: str
    request: ChatRequest
    body: bytes | Any  # the request body as sent (JSON bytes) or parsed
    backend: str
    trace: CallTrace = field(default_factory=CallTrace)
    images: list[Image] = field(default_factory=list)  # the request's images (their bytes go to `blobs` once)
    started_wall: datetime = field(default_factory=utcnow)
    started: float = field(default_factory=time.perf_counter)

    def row(self, status: str, completion: Completion | None, response: Any, error: str | None) -> dict[str, Any]:
        """The `calls` row; without a `completion` (a failed or cancelled call) the tokens sampled so far."""
        now = time.perf_counter()
        t = self.trace
        c = completion or t.answer
        sampled, logprobs = c.completion_token_ids, c.completion_logprobs
        if completion is None:  # nothing sampled is NULL, not an empty list
            sampled, logprobs = sampled or None, logprobs or None
        return {
            "call_id": self.call_id,
            "rollout_id": self.session.rollout_id,
            "seq": self.seq,
            "attempt": self.session.attempt,
            "api": self.api,
            "model": self.request.model,
            "request": self.body,
            "response": response,
            **prompt_columns(c.prompt_token_ids, t, self.session),
            "completion_token_ids": sampled,
            "completion_logprobs": logprobs,
            "finish_reason": ("length" if c.truncated_by_proxy else c.finish_reason) if completion else t.backend_finish,
            "status": status,
            "error": error,
            "started_at": self.started_wall,
            "latency_ms": (now - self.started) * 1000.0,
            "ttft_ms": (t.first_token_at - self.started) * 1000.0 if t.first_token_at else None,
            "branch": t.branch,
            "parent_call_id": t.parent_call_id,
            "extends_parent": t.extends_parent,
            "prefix_tokens": t.prefix_tokens,
            "tool_parse_error": completion.tool_parse_error if completion else None,
            "backend": self.backend,
            "stream": self.request.stream,
            "weights_version": t.weights_version,
            "image_hashes": [i.sha256 for i in self.images] or None,
        }
