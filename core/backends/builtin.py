"""The built-in token backend: a transformers causal LM sampled in-process (CPU, or one GPU).

Sampling runs in one worker thread per backend (`core.backends.batching.DecodeLoop`): concurrent
generations decode together in one batch over a shared KV cache, requests join at step
boundaries and leave when done, and tokens stream back to the event loop as they are sampled.
Prompts that start like an earlier prompt or prompt + completion (a harness's next call, or
another rollout with the same system prompt) reuse its KV states from a bounded prefix cache
(`core.backends.prefix_cache`) and prefill only the rest.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from core.backends.base import GenerationContext, SamplingParams, TokenChunk
from core.backends.batching import DEFAULT_MAX_BATCH, DecodeLoop, Request
from core.backends.batching import DONE as _DONE
from core.backends.kinds import Capabilities
from core.backends.spec import PolicySpec
from core.chat import ImagePart, request_images
from core.errors import BackendError, ConfigError, ContextLengthError, ForgetuiError, ModelError
from core.models import attention
from core.models.precision import resolve_dtype
from core.models.resolve import load_tokenizer, model_class, resolve_model
from core.tokens.vision import forward_inputs, vision_prompt

log = logging.getLogger(__name__)

MAX_CONTEXT_CAP = 131072
SPECULATE = 4  # prompt-lookup draft tokens a row may verify per step (core.backends.speculation: answers unchanged)
PREFIX_CACHE_MB = 1024  # default bound of the prefix cache's KV states (SmolLM2-135M fp32: ~22k tokens)


def _pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class BuiltinBackend:
    """A `TokenBackend` that samples a local transformers model, concurrent requests batched together.

    Logprobs: each sampled token's logprob is taken under the temperature-scaled distribution
    (``log_softmax(logits / temperature)``) *before* top-p truncation, which is what a trainer
    recomputes with the same temperature; with temperature 0 (greedy) it is the logprob under the
    unscaled distribution (temperature 1). Batching and prefix reuse do not change them beyond
    float rounding: padding is masked out, every row has its own position ids, and a reused
    prefix's states are the ones the same weights computed for the same ids.

    `dtype`: "auto" (bfloat16 on a CUDA GPU, float32 on a CPU; see core.models.precision),
    "float32", "bfloat16", "float16" or a torch dtype. `prefix_cache_mb`: the bound on cached KV
    states (0 turns prefix reuse off). `speculate`: draft tokens looked up in each sequence and
    verified with its next token in one forward (0: off; see core.backends.speculation).
    """

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: Any = None,
        max_new_tokens_default: int = 256,
        max_context: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefix_cache_mb: float = PREFIX_CACHE_MB,
        speculate: int = SPECULATE,
    ) -> None:
        self.name = model
        self.max_new_tokens_default = max_new_tokens_default
        self.device = _pick_device(device)
        self.weights_version = 0
        source = resolve_model(model)
        torch_dtype = resolve_dtype(dtype, self.device)
        try:
            import torch

            self.tokenizer = load_tokenizer(source)
            self.model = model_class(source).from_pretrained(
                source, dtype=torch_dtype, attn_implementation=attention.register()
            )
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(f"cannot load model {model!r} from {source}: {exc}") from exc
        self.model.to(self.device)
        self.model.eval()
        self._torch = torch
        # a vision-language model takes images (Qwen2-VL style); any other model here is text only
        self.vision = vision_prompt(self.tokenizer) if hasattr(self.model.config, "vision_config") else None
        self.capabilities = Capabilities(token_ids=True, logprobs=True, weight_reload=True, images=self.vision is not None)
        # a sampled image placeholder would stand for an image no one sent: the trainer's forward could not place it
        self._banned = (
            self._torch.tensor(self.vision.placeholder_ids, dtype=self._torch.long) if self.vision is not None else None
        )
        config_len = int(getattr(self.model.config.get_text_config(), "max_position_embeddings", 0) or 2048)
        self.context_length = min(config_len, max_context or MAX_CONTEXT_CAP)
        self.eos_token_ids = self._eos_ids()
        # transformers 5 renamed `past_key_values` to `cache`
        params = inspect.signature(self.model.forward).parameters
        cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._loop = DecodeLoop(
            self.model, self.device, cache_kwarg, Path(str(model)).name, max_batch, int(prefix_cache_mb * 2**20), speculate
        )
        self._pending: set[Future] = set()
        self._closed = False

    @property
    def tokens_generated(self) -> int:
        """Tokens sampled by the worker over this backend's life."""
        return self._loop.tokens_generated

    @property
    def peak_batch(self) -> int:
        """The most sequences one decode step has carried so far."""
        return self._loop.peak_batch

    def stats(self) -> dict[str, float]:
        """Worker seconds in prefill and decode, prompt tokens prefilled and reused, the prefix cache's size."""
        return self._loop.stats()

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

        request = self._request(list(prompt_ids), sampling, emit, stop)
        images = request_images(context.request.messages) if context.request is not None else []
        if images:
            request.prefill_inputs, request.rope_delta = await asyncio.to_thread(self._vision_inputs, prompt_ids, images)
            request.cacheable = False  # its ids do not say what the pixels were
        self._pending.add(request.done)
        request.done.add_done_callback(self._pending.discard)
        self._loop.submit(request)
        try:
            while True:
                chunk, over = _drain(await queue.get(), queue, self.name)
                if chunk is not None:
                    yield chunk
                if over:
                    return
        finally:
            stop.set()

    def _request(
        self, prompt_ids: list[int], sampling: SamplingParams, emit: Any, stop: threading.Event
    ) -> Request:
        """The worker's view of one generation: budget, stop ids, temperature, top-p and its seeded generator."""
        budget = (
            sampling.max_tokens
            if sampling.max_tokens and sampling.max_tokens > 0
            else self.max_new_tokens_default
        )
        seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        return Request(
            prompt_ids=prompt_ids,
            budget=min(budget, self.context_length - len(prompt_ids)),
            stops=self.eos_token_ids | set(sampling.stop_token_ids or []),
            temperature=float(sampling.temperature if sampling.temperature is not None else 1.0),
            top_p=float(sampling.top_p if sampling.top_p is not None else 1.0),
            generator=self._torch.Generator(device="cpu").manual_seed(int(seed)),
            emit=emit,
            stop=stop,
            banned=self._banned,
        )

    def _vision_inputs(self, prompt_ids: list[int], images: list[ImagePart]) -> tuple[dict[str, Any], int]:
        """The prefill's pixel inputs and 3D rotary positions for a prompt with images, and its rope delta."""
        if self.vision is None:
            raise ModelError(f"model {self.name} takes text only; this request carries {len(images)} image(s)")
        torch = self._torch
        pads = sum(1 for t in prompt_ids if t == self.vision.pad_id)
        wanted = sum(self.vision.pad_count(image) for image in images)
        if pads != wanted:  # the prompt was not expanded for these images: the model would misplace them
            raise ModelError(f"the prompt holds {pads} image tokens where its {len(images)} image(s) need {wanted}")
        inputs = forward_inputs(self.model, self.vision, torch.tensor([prompt_ids], dtype=torch.long, device=self.device), images)
        (delta,) = inputs.pop("rope_deltas")
        return inputs, int(delta)

    async def wait_idle(self) -> None:
        """Wait until every generation started before this call has left the worker (ended or cancelled)."""
        pending = list(self._pending)
        if pending:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in pending))

    def reload_weights(self, state: Mapping[str, Any] | str | Path) -> None:
        """Load new weights (a state dict, a safetensors file or a model folder) between two decode steps."""
        if isinstance(state, str | Path):
            state = _read_state(Path(state))
        self._loop.call(lambda: self._load_state(state)).result()
        self.weights_version += 1

    def _load_state(self, state: Mapping[str, Any]) -> None:
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
        self._loop.forget_prefixes()  # states computed by the old weights

    async def aclose(self) -> None:
        """Stop the worker (live and queued generations fail with ModelError) and wait for its thread."""
        self._closed = True
        self._loop.close()
        await asyncio.to_thread(self._loop.join, 30)


def _drain(item: Any, queue: asyncio.Queue, name: str) -> tuple[TokenChunk | None, bool]:
    """Turn `item` and whatever else is queued into one chunk; say whether the generation is over."""
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
            raise BackendError(f"model {name} failed while sampling: {it!r}") from it
        tok, lp, fin = it
        ids.append(tok)
        lps.append(lp)
        finish = fin or finish
    chunk = TokenChunk(token_ids=ids, logprobs=lps, finish_reason=finish) if ids else None
    return chunk, finish is not None or _DONE in items


def _read_state(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.exists() for f in files):
        raise ModelError(f"no safetensors weights at {path}")
    state: dict[str, Any] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def from_spec(spec: PolicySpec, *, tokenizer: str | None = None) -> BuiltinBackend:
    """`builtin:MODEL`; options device=cpu|cuda|auto, dtype=auto|float32|bfloat16|float16 (or `policy.dtype`), prefix_cache_mb=N
    (0: no prefix reuse), speculate=N (prompt-lookup draft tokens per step; 0: off), max_batch=N (rows one decode step carries)."""
    options = spec.options
    extra: dict[str, Any] = {}
    # (option, its type, what it must be, its least value; None: any number)
    numeric = (("prefix_cache_mb", float, "a number of megabytes", None), ("speculate", int, "a whole number of tokens (0: off)", 0),
               ("max_batch", int, "a whole number of rows (at least 1)", 1))
    for key, kind, what, least in numeric:
        if key not in options:
            continue
        try:
            value = kind(options[key])
        except ValueError:
            value = None
        if value is None or (least is not None and value < least):
            raise ConfigError(f"{key}={options[key]!r} in the backend spec must be {what}")
        extra[key] = value
    return BuiltinBackend(spec.target, device=options.get("device", "auto"), dtype=options.get("dtype", "auto"), **extra)
