"""Turns one finished, failed or cancelled call into a `calls` row."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from core.chat import ChatRequest, Completion
from core.proxy.policy import CallTrace
from core.proxy.sessions import Session
from core.store.writer import utcnow


class CallSink(Protocol):
    def record_call(self, row: dict[str, Any]) -> None: ...


@dataclass
class CallInFlight:
    """A call from the moment its request parsed to its last byte."""

    call_id: str
    session: Session
    seq: int
    api: str
    request: ChatRequest
    body: Any
    backend: str
    trace: CallTrace = field(default_factory=CallTrace)
    started_wall: datetime = field(default_factory=utcnow)
    started: float = field(default_factory=time.perf_counter)

    def row(self, status: str, completion: Completion | None, response: Any, error: str | None) -> dict[str, Any]:
        now = time.perf_counter()
        t = self.trace
        c = completion
        return {
            "call_id": self.call_id,
            "rollout_id": self.session.rollout_id,
            "seq": self.seq,
            "attempt": self.session.attempt,
            "api": self.api,
            "model": self.request.model,
            "request": self.body,
            "response": response,
            "prompt_token_ids": c.prompt_token_ids if c and c.prompt_token_ids is not None else t.prompt_ids,
            "completion_token_ids": c.completion_token_ids if c and c.completion_token_ids is not None else (t.completion_ids or None),
            "completion_logprobs": c.completion_logprobs if c and c.completion_logprobs is not None else (t.logprobs or None),
            "finish_reason": (("length" if c.truncated_by_proxy else c.finish_reason) if c else t.backend_finish),
            "status": status,
            "error": error,
            "started_at": self.started_wall,
            "latency_ms": (now - self.started) * 1000.0,
            "ttft_ms": (t.first_token_at - self.started) * 1000.0 if t.first_token_at else None,
            "branch": t.branch,
            "parent_call_id": t.parent_call_id,
            "extends_parent": t.extends_parent,
            "prefix_tokens": t.prefix_tokens,
            "tool_parse_error": c.tool_parse_error if c else None,
            "backend": self.backend,
            "stream": self.request.stream,
            "weights_version": t.weights_version,
        }
