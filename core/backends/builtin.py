"""The built-in token backend: a transformers causal LM sampled in-process (CPU, or one GPU).

Sampling runs in one worker thread per backend (one generation at a time), token by token
with the KV cache, and streams tokens back to the event loop as they are sampled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from core.backends.base import GenerationContext, SamplingParams, TokenChunk
from core.errors import BackendError, ContextLengthError, ForgetuiError, ModelError
from core.models.resolve import load_tokenizer, resolve_model

log = logging.getLogger(__name__)

MAX_CONTEXT_CAP = 131072
_GREEDY_BELOW = 1e-5
_DONE = object()


def _pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _pick_dtype(dtype: Any, device: str):
    import torch

    if dtype is None:
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if isinstance(dtype, str):
        try:
            return getattr(torch, dtype)
        except AttributeError:
            raise ModelError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None
    return dtype


class BuiltinBackend:
    """A `TokenBackend` that samples a local transformers model.

    Logprobs: each sampled token's logprob is taken under the temperature-scaled distribution
    (``log_softmax(logits / temperature)``) *before* top-p truncation, which is what a trainer
    recomputes with the same temperature; with temperature 0 (greedy) it is the logprob under the
    unscaled distribution (temperature 1).
    """

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: Any = None,
        max_new_tokens_default: int = 256,
        max_context: int | None = None,
    ) -> None:
        self.name = model
        self.max_new_tokens_default = max_new_tokens_default
        self.device = _pick_device(device)
        self.weights_version = 0
        self.tokens_generated = 0  # sampled by the worker, over this backend's life
        source = resolve_model(model)
        try:
            import torch
            from transformers import AutoModelForCausalLM

            self.tokenizer = load_tokenizer(source)
            self.model = AutoModelForCausalLM.from_pretrained(
                source, dtype=_pick_dtype(dtype, self.device), attn_implementation="sdpa"
            )
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(f"cannot load model {model!r} from {source}: {exc}") from exc
        self.model.to(self.device)
        self.model.eval()
        self._torch = torch
        config_len = int(getattr(self.model.config, "max_position_embeddings", 0) or 2048)
        self.context_length = min(config_len, max_context or MAX_CONTEXT_CAP)
        self.eos_token_ids = self._eos_ids()
        # transformers 5 renamed `past_key_values` to `cache`
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"builtin-{Path(str(model)).name}"
        )
        self._current: Future | None = None
        self._closed = False

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.model.config, getattr(self.model, "generation_config", None)):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext
    ) -> AsyncIterator[TokenChunk]:
        """Sample a completion; stops at eos / stop_token_ids ("stop", token included) or max_tokens ("length")."""
        if self._closed:
            raise ModelError(f"backend {self.name} is closed")
        if not prompt_ids:
            raise ModelError("cannot generate from an empty prompt")
        if len(prompt_ids) >= self.context_length:
            raise ContextLengthError(len(prompt_ids), self.context_length - 1)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()

        def emit(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone: nobody is listening
                stop.set()

        future = self._executor.submit(self._sample, list(prompt_ids), sampling, stop, emit)
        self._current = future
        try:
            while True:
                item = await queue.get()
                items = [item]
                while not queue.empty():
                    items.append(queue.get_nowait())
                ids: list[int] = []
                lps: list[float] = []
                finish = None
                for it in items:
                    if it is _DONE:
                        continue
                    if isinstance(it, ForgetuiError):
                        raise it
                    if isinstance(it, BaseException):
                        raise BackendError(f"model {self.name} failed while sampling: {it!r}") from it
                    tok, lp, fin = it
                    ids.append(tok)
                    lps.append(lp)
                    finish = fin or finish
                if ids:
                    yield TokenChunk(token_ids=ids, logprobs=lps, finish_reason=finish)
                if finish is not None or _DONE in items:
                    return
        finally:
            stop.set()

    def _sample(self, prompt_ids: list[int], sampling: SamplingParams, stop: threading.Event, emit) -> None:
        """The worker-thread loop: prefill, then one token per step with the KV cache."""
        torch = self._torch
        try:
            budget = (
                sampling.max_tokens
                if sampling.max_tokens and sampling.max_tokens > 0
                else self.max_new_tokens_default
            )
            budget = min(budget, self.context_length - len(prompt_ids))
            stops = self.eos_token_ids | set(sampling.stop_token_ids or [])
            temperature = float(sampling.temperature if sampling.temperature is not None else 1.0)
            top_p = float(sampling.top_p if sampling.top_p is not None else 1.0)
            seed = (
                sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
            )
            gen = torch.Generator(device="cpu").manual_seed(int(seed))
            with torch.inference_mode():
                input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
                out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
                past = _cache_of(out)
                for step in range(budget):
                    if stop.is_set():
                        log.debug("generation cancelled after %d tokens", step)
                        return
                    logits = out.logits[0, -1].float().cpu()
                    token, logprob = _pick(logits, temperature, top_p, gen)
                    finish = "stop" if token in stops else ("length" if step == budget - 1 else None)
                    self.tokens_generated += 1
                    emit((token, logprob, finish))
                    if finish is not None:
                        return
                    out = self.model(
                        input_ids=torch.tensor([[token]], dtype=torch.long, device=self.device),
                        use_cache=True,
                        **{self._cache_kwarg: past},
                    )
                    past = _cache_of(out)
        except BaseException as exc:  # handed to the consumer, raised there
            emit(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
        finally:
            emit(_DONE)

    async def wait_idle(self) -> None:
        """Wait until the worker has finished the current generation (after it ended or was cancelled)."""
        current = self._current
        if current is not None:
            await asyncio.wrap_future(current)

    def reload_weights(self, state: Mapping[str, Any] | str | Path) -> None:
        """Load new weights (a state dict, a safetensors file or a model folder) between generations."""
        self._executor.submit(self._load_state, state).result()
        self.weights_version += 1

    def _load_state(self, state: Mapping[str, Any] | str | Path) -> None:
        if isinstance(state, str | Path):
            state = _read_state(Path(state))
        missing, unexpected = self.model.load_state_dict(dict(state), strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = [k for k in missing if k not in tied]
        if unexpected or (missing and len(missing) == len(self.model.state_dict())):
            raise ModelError(
                f"weights do not fit model {self.name}: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        if missing:
            log.warning(
                "reload_weights: %d tensors not in the new state (kept): %s", len(missing), missing[:5]
            )
        self.model.eval()

    async def aclose(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)


def _pick(logits, temperature: float, top_p: float, gen) -> tuple[int, float]:
    """Choose one token; return it with its logprob (see BuiltinBackend's docstring)."""
    import torch

    if temperature < _GREEDY_BELOW:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
        keep[0] = True
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    token = int(torch.multinomial(probs, 1, generator=gen))
    return token, float(logp[token])


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _read_state(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise ModelError(f"no safetensors weights at {path}")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
