"""Before a training run's first rollout: one 1-token request to the policy backend, asking for what training needs.

A server that answers without the sampled token ids or their logprobs (an OpenAI-compatible server
that ignores vLLM's `return_token_ids` and `logprobs`, an older vLLM) would otherwise let a whole
step of rollouts run, every call of it failing or unusable, and the run would stop only when samples
are built from the recorded calls. The probe goes through the backend's own `generate` (its real
request and its own checks) on the proxy's event loop, where the backend's connections live for the
run; it is not recorded as a call.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from core.backends.base import GenerationContext, SamplingParams, TokenBackend
from core.backends.spec import PolicySpec
from core.chat import ChatRequest
from core.errors import BackendError, UntrainableBackendError
from core.session import RunSession

log = logging.getLogger(__name__)

PROBE_TEXT = "Say OK."
PROBE_SESSION = "forgetui-preflight"
PROBE_TIMEOUT_S = 120.0  # a cold server may still be loading the model
FIX = (
    "Training needs the sampled token ids (`return_token_ids`, vLLM >= 0.10.2) and one logprob per sampled token "
    "(`logprobs: 0`, vLLM's default --logprobs-mode raw_logprobs): serve the model with a recent `vllm serve MODEL` "
    "(with train.lora_rank: --enable-lora --max-lora-rank 16) or `forgetui serve-model MODEL`; "
    "an OpenAI-compatible server that ignores these fields cannot be trained against (it can still be evaluated)"
)


def needs_preflight(spec: PolicySpec) -> bool:
    """Whether the policy backend is a server that may answer without token ids or logprobs (in-process ones always return them)."""
    return spec.declared.remote


def probe_prompt(tokenizer: Any) -> list[int]:
    """A few token ids of a short user turn under the policy's chat template (plain text if it has none)."""
    messages = [{"role": "user", "content": PROBE_TEXT}]
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    except Exception:  # noqa: BLE001 - no chat template: the text is enough for one token
        ids = tokenizer.encode(PROBE_TEXT)
    return [int(i) for i in ids] or [int(tokenizer.eos_token_id or 0)]


async def probe(backend: TokenBackend, *, temperature: float = 1.0) -> tuple[list[int], list[float]]:
    """One 1-token generation through the backend; (sampled ids, their logprobs)."""
    request = ChatRequest(
        api="chat", model=backend.name, messages=[{"role": "user", "content": PROBE_TEXT}], max_tokens=1
    )
    context = GenerationContext(session=PROBE_SESSION, call_seq=0, request=request)
    sampling = SamplingParams(max_tokens=1, temperature=temperature)
    ids: list[int] = []
    logprobs: list[float] = []
    stream = backend.generate(probe_prompt(backend.tokenizer), sampling, context)
    try:
        async for chunk in stream:
            ids += chunk.token_ids
            logprobs += chunk.logprobs
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return ids, logprobs


async def check_backend(backend: TokenBackend, spec: PolicySpec, *, temperature: float = 1.0) -> None:
    """Refuse a backend whose answer lacks token ids or logprobs (UntrainableBackendError, with the fix)."""
    shown = spec.shown
    try:
        ids, logprobs = await asyncio.wait_for(probe(backend, temperature=temperature), PROBE_TIMEOUT_S)
    except BackendError as exc:
        raise UntrainableBackendError(
            f"policy backend {shown} failed the training preflight (a 1-token request asking for token ids and logprobs): {exc}. {FIX}"
        ) from exc
    except TimeoutError as exc:
        raise UntrainableBackendError(
            f"policy backend {shown} did not answer the training preflight (a 1-token request) within {PROBE_TIMEOUT_S:.0f} s; is the server up?"
        ) from exc
    missing = missing_fields(ids, logprobs)
    if missing:
        raise UntrainableBackendError(
            f"policy backend {shown} answered the training preflight without {missing}. {FIX}"
        )
    log.info("policy backend %s returns token ids and logprobs (training preflight passed)", shown)


def missing_fields(ids: list[int], logprobs: list[float]) -> str | None:
    """What an answer lacks for training, in words; None when it has it all."""
    if not ids:
        return "the sampled token ids"
    if len(logprobs) != len(ids) or not all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs):
        return f"a logprob for each sampled token ({len(ids)} ids, logprobs {logprobs[:4]})"
    return None


async def preflight_session(
    session: RunSession, backend: TokenBackend, spec: PolicySpec, *, temperature: float = 1.0
) -> None:
    """The check on the session's proxy loop (where the backend's HTTP connections belong), before any rollout."""
    if not needs_preflight(spec):
        return
    loop = session.server.loop if session.server is not None else None
    check = check_backend(backend, spec, temperature=temperature)
    if loop is None or not loop.is_running() or loop is asyncio.get_running_loop():
        await check
        return
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(check, loop))
