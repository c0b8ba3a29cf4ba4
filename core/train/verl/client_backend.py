"""A `TokenBackend` over veRL's inference client: the proxy's token path, sampled by veRL's rollout servers.

The proxy renders the harness's request with the policy's template and calls `generate(prompt_ids, ...)`;
this adapter forwards the ids to `LLMServerClient.generate(request_id, prompt_ids=..., sampling_params=...)`
and yields one `TokenChunk` with the sampled ids and their logprobs. veRL's sampling parameters for the
rollout (temperature, top_p, top_k: what the trainer recomputes logprobs at) win over the harness's;
the proxy's cap (max_tokens) and stop ids are kept.

The proxy runs on its own thread and event loop; the client belongs to the agent-loop worker's loop,
so each call is scheduled there and awaited from the proxy's loop (cancelling one cancels the other).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from core.backends.base import GenerationContext, SamplingParams, TokenChunk
from core.backends.kinds import Capabilities
from core.errors import BackendError, ContextLengthError

log = logging.getLogger(__name__)

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "min_p")


class ClientTokenBackend:
    """Samples through a veRL `LLMServerClient` (or anything with its `generate` signature)."""

    def __init__(
        self,
        client: Any,
        tokenizer: Any,
        *,
        context_length: int,
        name: str = "verl",
        loop: asyncio.AbstractEventLoop | None = None,
        sampling_for: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.name = name
        self.weights_version: int | None = None  # veRL's global step of the last generation seen
        self.capabilities = Capabilities(token_ids=True, logprobs=True)  # veRL swaps the weights itself
        self.loop = loop  # the client's event loop (the agent-loop worker's); None = whichever calls
        self.sampling_for = sampling_for  # session token → veRL's sampling params of that rollout

    def request_params(self, sampling: SamplingParams, session: str) -> dict[str, Any]:
        """veRL sampling params for one call: the rollout's own (from veRL), the proxy's cap and stop ids."""
        verl_params = (self.sampling_for(session) if self.sampling_for is not None else None) or {}
        params = {k: verl_params[k] for k in SAMPLING_KEYS if k in verl_params}
        params.setdefault("temperature", sampling.temperature)
        params.setdefault("top_p", sampling.top_p)
        params["max_tokens"] = int(sampling.max_tokens)
        params["logprobs"] = True  # training needs one logprob per sampled token
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["seed"] = int(sampling.seed)
        return params

    async def _call(self, request_id: str, prompt_ids: list[int], params: dict[str, Any]) -> Any:
        """The client's generate on its own loop, awaited from this one."""
        coro = self.client.generate(request_id, prompt_ids=list(prompt_ids), sampling_params=params)
        running = asyncio.get_running_loop()
        if self.loop is None or self.loop is running:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext) -> AsyncIterator[TokenChunk]:
        """One generation through veRL's client; a single chunk with every sampled token and its logprob."""
        if not prompt_ids:
            raise BackendError("cannot generate from an empty prompt")
        if len(prompt_ids) >= self.context_length:
            raise ContextLengthError(len(prompt_ids), self.context_length - 1)
        params = self.request_params(sampling, context.session)
        # one request id per rollout session: veRL's load balancer keeps a session's turns on one server (prefix cache)
        output = await self._call(context.session, prompt_ids, params)
        ids = [int(t) for t in output.token_ids]
        stop = getattr(output, "stop_reason", None)
        if stop == "aborted":
            raise BackendError("veRL aborted the generation (weights being synchronised?); the harness may retry")
        if ids and output.log_probs is None:
            raise BackendError(
                "veRL's rollout returned no logprobs: set actor_rollout_ref.rollout.calculate_log_probs=True"
            )
        logprobs = [float(x) for x in (output.log_probs or [])]
        if len(logprobs) != len(ids):
            raise BackendError(f"veRL returned {len(ids)} tokens but {len(logprobs)} logprobs")
        steps = (getattr(output, "extra_fields", None) or {}).get("global_steps")
        if steps is not None:
            self.weights_version = int(steps)
        yield TokenChunk(token_ids=ids, logprobs=logprobs, finish_reason=self._finish(ids, sampling))

    @staticmethod
    def _finish(ids: list[int], sampling: SamplingParams) -> str:
        """vLLM says "completed" for both: a full budget without a stop token is a length stop."""
        if len(ids) >= sampling.max_tokens and not (ids and ids[-1] in set(sampling.stop_token_ids or [])):
            return "length"
        return "stop"

    async def aclose(self) -> None:
        """Nothing to close: the client belongs to veRL."""
        return None
