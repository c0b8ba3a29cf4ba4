"""Policies answer canonical requests: the token path (template → token ids → parse) or passthrough."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.backends.base import GenerationContext, PassthroughBackend, SamplingParams, TokenBackend
from core.chat import ChatRequest, Completion, Finished, ReasoningDelta, StreamEvent, TextDelta
from core.errors import ContextLengthError
from core.proxy.sessions import Session
from core.tokens.incremental import IncrementalDecoder
from core.tokens.offload import run_cancellable
from core.tokens.reasoning import ReasoningStream, reasoning_tags, split_reasoning
from core.tokens.template import encode, render_chat
from core.tokens.toolparse import OPEN_TAGS, VisibleTextStream, get_parser

log = logging.getLogger(__name__)

LOAD_WAIT_ON_CLOSE_S = 120.0


@dataclass
class CallTrace:
    """What the recorder needs about one call, filled in while it runs (so failures keep partial data).

    Token ids and logprobs live in one place, `answer`: the policy fills it as tokens are sampled and
    finishes it as the call's `Completion`, so a failed or cancelled call keeps what was sampled.
    """

    answer: Completion = field(default_factory=Completion)
    branch: int | None = None
    parent_call_id: str | None = None
    extends_parent: bool | None = None
    prefix_tokens: int | None = None
    first_token_at: float | None = None
    partial_text: str = ""
    backend_finish: str | None = None
    weights_version: int | None = None
    seed: int | None = None  # the sampler's seed for this call (run.seed's draws, `Session.call_seed`); None: unseeded


class Policy(Protocol):
    name: str
    backend: Any  # what samples (a token or passthrough backend, with its `capabilities`); None when nothing does

    def stream(self, request: ChatRequest, session: Session, call_id: str, trace: CallTrace) -> AsyncIterator[StreamEvent]: ...

    async def count_tokens(self, request: ChatRequest) -> int: ...

    async def aclose(self) -> None: ...


class DeferredPolicy:
    """A policy built on a background thread; calls that arrive before it is ready wait for it (`ready_policy`).

    A run starts its sandboxes while its policy loads (a tokenizer import, model weights), so the
    load overlaps the slowest part of a run's start instead of preceding it.
    """

    def __init__(self, build: Callable[[], Policy]) -> None:
        self._future: concurrent.futures.Future[Policy] = concurrent.futures.Future()
        # running from the start, as an executor would mark it: a cancelled waiter must not cancel the build
        self._future.set_running_or_notify_cancel()
        threading.Thread(target=self._build, args=(build,), name="forgetui-policy-load", daemon=True).start()

    def _build(self, build: Callable[[], Policy]) -> None:
        try:
            self._future.set_result(build())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the policy
            self._future.set_exception(exc)

    async def ready(self) -> Policy:
        """The built policy; raises what building it raised."""
        return await asyncio.wrap_future(self._future)

    async def aclose(self) -> None:
        if not self._future.done():
            # a load left running past interpreter exit dies inside native code (tokenizers' rayon
            # threads abort the process): let it finish, then close what it built
            log.info("waiting for the policy to finish loading before closing it")
            await asyncio.wait([asyncio.wrap_future(self._future)], timeout=LOAD_WAIT_ON_CLOSE_S)
            if not self._future.done():
                log.warning("the policy still loads after %g s; leaving it", LOAD_WAIT_ON_CLOSE_S)
                return
        if self._future.exception() is None:
            await self._future.result().aclose()


async def ready_policy(policy: Policy | DeferredPolicy) -> Policy:
    """``policy`` itself, or the built one behind a `DeferredPolicy`."""
    return await policy.ready() if isinstance(policy, DeferredPolicy) else policy


class TokenPolicy:
    """Renders the prompt with the policy's tokenizer, samples token ids, splits off reasoning and parses tool calls from the text.

    `reasoning` names the reasoning parser ("qwen3", "none"); by default it is on for a tokenizer whose
    template renders ``<think>`` blocks (`core.tokens.reasoning.reasoning_tags`). `parser` and `default_max_tokens`
    have no default here: `core.proxy.factory.token_policy` decides both (the cap by `default_max_tokens_for`).
    """

    def __init__(self, backend: TokenBackend, *, parser: str, default_max_tokens: int, temperature: float | None = None, reasoning: str | None = None) -> None:
        self.backend = backend
        self.temperature = temperature  # when set, it wins over the harness's: a trainer recomputes logprobs at it
        self.name = backend.name
        self.tokenizer = backend.tokenizer
        self.parse = get_parser(parser)
        self.open_tag = OPEN_TAGS.get(parser, "<tool_call>")
        self.think = reasoning_tags(self.tokenizer, reasoning)
        self.default_max_tokens = default_max_tokens
        self.eos_text = self.tokenizer.eos_token or ""
        self.eos_id = self.tokenizer.eos_token_id

    async def count_tokens(self, request: ChatRequest) -> int:
        """The prompt's token count, tokenized off the event loop (and stopped if the caller leaves)."""
        return await run_cancellable(self._count, request)

    def _count(self, request: ChatRequest) -> int:
        return len(encode(self.tokenizer, render_chat(self.tokenizer, request.messages, request.tools, True)))

    async def stream(self, request: ChatRequest, session: Session, call_id: str, trace: CallTrace) -> AsyncIterator[StreamEvent]:
        trace.weights_version = self.backend.weights_version
        cont = session.continuation_for(self.tokenizer)
        plan = await run_cancellable(cont.plan, request.messages, request.tools)  # stopped if the caller leaves
        answer = trace.answer
        answer.prompt_token_ids, answer.completion_token_ids, answer.completion_logprobs = plan.prompt_ids, [], []
        sampled, logprobs = answer.completion_token_ids, answer.completion_logprobs
        trace.branch, trace.parent_call_id = plan.branch, plan.parent_call_id
        trace.extends_parent, trace.prefix_tokens = plan.extends_parent, plan.prefix_tokens
        room = self.backend.context_length - len(plan.prompt_ids)
        if room <= 0:
            raise ContextLengthError(len(plan.prompt_ids), self.backend.context_length)
        wanted = request.max_tokens if request.max_tokens is not None else self.default_max_tokens
        max_new = max(1, min(wanted, room))
        # a cap the client did not ask for must not look like a client-side limit (Codex fails on "incomplete")
        capped_by_us = request.max_tokens is None or request.max_tokens > max_new
        sampling = SamplingParams(
            max_tokens=max_new,
            temperature=self._temperature(request),
            top_p=1.0 if request.top_p is None else request.top_p,
            stop_token_ids=[self.eos_id] if self.eos_id is not None else [],
            seed=trace.seed,
        )
        visible = VisibleTextStream(self.open_tag)
        thinking = ReasoningStream(self.think) if self.think is not None else None
        decoder = IncrementalDecoder(self.tokenizer, skip_ids={self.eos_id} if self.eos_id is not None else None)
        context = GenerationContext(session=session.token, call_seq=session.calls, request=request)
        async for chunk in self.backend.generate(plan.prompt_ids, sampling, context):
            if trace.first_token_at is None and chunk.token_ids:
                trace.first_token_at = time.perf_counter()
                yield TextDelta("")  # the backend is sampling: the stream may start (headers go out)
            sampled.extend(chunk.token_ids)
            logprobs.extend(chunk.logprobs)
            if chunk.finish_reason:
                trace.backend_finish = chunk.finish_reason
            delta = decoder.feed(chunk.token_ids)
            if not delta:  # nothing new, or an incomplete UTF-8 sequence waiting for its next byte
                continue
            trace.partial_text = decoder.text
            if thinking is not None:
                thought, delta = thinking.feed(delta)
                if thought:
                    yield ReasoningDelta(thought)
            shown = visible.feed(delta)
            if shown:
                yield TextDelta(shown)
        reasoning, text = self._split(self._decode(sampled))
        parsed = self.parse(text)
        rest = visible.rest(parsed.text)
        if rest:
            yield TextDelta(rest)
        finish = "length" if trace.backend_finish == "length" else "stop"
        answer.text, answer.tool_calls, answer.tool_parse_error = parsed.text, parsed.tool_calls, parsed.error
        answer.reasoning = reasoning
        answer.finish_reason = "tool_calls" if parsed.tool_calls else finish
        answer.prompt_tokens, answer.completion_tokens = len(plan.prompt_ids), len(sampled)
        answer.truncated_by_proxy = finish == "length" and capped_by_us
        cont.remember(call_id, plan, request.messages, request.tools, assistant_message(answer), sampled)
        yield Finished(answer)

    def _temperature(self, request: ChatRequest) -> float:
        if self.temperature is not None:
            return self.temperature
        return 1.0 if request.temperature is None else request.temperature

    def _split(self, text: str) -> tuple[str, str]:
        """(reasoning, answer text): the reasoning split off when the policy has a reasoning parser."""
        return split_reasoning(text, self.think) if self.think is not None else ("", text)

    def _decode(self, ids: list[int]) -> str:
        if ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def aclose(self) -> None:
        await self.backend.aclose()


class PassthroughPolicy:
    """Forwards the canonical request to a provider (LiteLLM); records text and any token ids returned."""

    def __init__(self, backend: PassthroughBackend) -> None:
        self.backend = backend
        self.name = backend.name

    async def count_tokens(self, request: ChatRequest) -> int:
        if self.backend.capabilities.count_tokens:
            return await self.backend.count_tokens(request)
        chars = sum(len(m.get("content") or "") for m in request.messages)
        return max(1, chars // 4)

    async def stream(self, request: ChatRequest, session: Session, call_id: str, trace: CallTrace) -> AsyncIterator[StreamEvent]:
        context = GenerationContext(session=session.token, call_seq=session.calls, request=request)
        async for event in self.backend.complete(request, context):
            if isinstance(event, TextDelta | ReasoningDelta):
                if trace.first_token_at is None:
                    trace.first_token_at = time.perf_counter()
                if isinstance(event, TextDelta):
                    trace.partial_text += event.text
            else:
                trace.answer = event.completion
            yield event

    async def aclose(self) -> None:
        await self.backend.aclose()


def assistant_message(completion: Completion) -> dict[str, Any]:
    """The assistant message a harness will echo back for this completion."""
    msg: dict[str, Any] = {"role": "assistant", "content": completion.text}
    if completion.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in completion.tool_calls
        ]
    return msg
