"""Continuous batching for the built-in backend: one worker thread decodes every live sequence together.

Requests wait in a queue; at each step boundary the worker runs queued calls (weight reloads),
admits waiting requests (each prefilled on its own, so its cache is exactly a single-sequence
cache), merges them into the batch's KV cache with left padding, samples one token for every
row, drops the rows that finished or were cancelled, and runs one batched decode forward
(attention mask over the padding, per-row position ids).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from core.errors import ModelError

log = logging.getLogger(__name__)

GREEDY_BELOW = 1e-5
DONE = object()  # the last item a request's `emit` receives
_LIVE: weakref.WeakSet[DecodeLoop] = weakref.WeakSet()  # stopped at interpreter exit, never mid-forward


@dataclass
class Request:
    """One generation as the worker sees it; `emit` hands items to the consumer's event loop."""

    prompt_ids: list[int]
    budget: int
    stops: set[int]
    temperature: float
    top_p: float
    generator: Any  # torch.Generator, the request's own seeded stream
    emit: Callable[[Any], None]
    stop: threading.Event = field(default_factory=threading.Event)
    done: Future = field(default_factory=Future)
    produced: int = 0
    cached: int = 0  # real (unpadded) tokens in this row's KV cache
    # a vision-language prompt's extra prefill inputs (pixel values, grids, 3D positions) and the offset
    # its image tokens put between a token's index and its rotary position (Qwen2-VL's rope delta)
    prefill_inputs: dict[str, Any] = field(default_factory=dict)
    rope_delta: int = 0

    def finish(self, error: BaseException | None = None) -> None:
        """Tell the consumer this generation is over (with `error` if it failed) and resolve `done`."""
        if self.done.done():
            return
        if error is not None:
            self.emit(error if isinstance(error, Exception) else RuntimeError(str(error)))
        self.emit(DONE)
        self.done.set_result(self.produced)


def pick(logits: Any, temperature: float, top_p: float, generator: Any) -> tuple[int, float]:
    """Choose one token; return it with its logprob (log_softmax(logits / T) before top-p; greedy: T = 1)."""
    import torch

    if temperature < GREEDY_BELOW:
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
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logp[token])


def cache_of(out: Any) -> Any:
    """The KV cache a forward returned (transformers 5 may call it `cache`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _left_pad(t: Any, n: int) -> Any:
    """Prepend `n` zero positions to a [batch, heads, seq, dim] tensor."""
    import torch

    if n <= 0:
        return t
    return torch.cat([t.new_zeros(t.shape[0], t.shape[1], n, t.shape[3]), t], dim=2)


def _mergeable(cache: Any) -> bool:
    """Whether every layer of `cache` is a plain growing KV layer (no sliding window, no recurrent state)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class Batch:
    """The rows decoding together: their shared left-padded KV cache, padding mask and next-token logits."""

    def __init__(self, model: Any, device: str, cache_kwarg: str) -> None:
        self.model = model
        self.device = device
        self.cache_kwarg = cache_kwarg
        self.rows: list[Request] = []
        self.cache: Any = None
        self.mask: Any = None  # [rows, kv_len] bool, False over left padding
        self.logits: Any = None  # [rows, vocab] float32 on the CPU: each row's next-token logits
        self.mergeable = True  # cleared when the model's cache cannot be padded and merged

    def prefill(self, row: Request) -> None:
        """Run `row`'s prompt on its own and add it to the batch."""
        import torch

        ids = torch.tensor([row.prompt_ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **row.prefill_inputs)
        row.prefill_inputs = {}  # the pixels are in the KV cache now
        cache = cache_of(out)
        row.cached = len(row.prompt_ids)
        self._add(row, cache, out.logits[:, -1].float().cpu())

    def _add(self, row: Request, cache: Any, logits: Any) -> None:
        """Merge one prefilled row into the batch, left-padding whichever side is shorter."""
        import torch

        row_mask = torch.ones(1, row.cached, dtype=torch.bool, device=self.device)
        if not self.rows:
            self.rows, self.cache, self.mask, self.logits = [row], cache, row_mask, logits
            self.mergeable = _mergeable(cache)
            return
        if not (self.mergeable and _mergeable(cache)):
            raise ModelError("this model's KV cache cannot be batched (sliding-window or recurrent layers)")
        width = max(self.mask.shape[1], row_mask.shape[1])
        pad_batch, pad_row = width - self.mask.shape[1], width - row_mask.shape[1]
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, pad_batch), _left_pad(theirs.keys, pad_row)], dim=0)
            mine.values = torch.cat(
                [_left_pad(mine.values, pad_batch), _left_pad(theirs.values, pad_row)], dim=0
            )
        self.mask = torch.cat([_pad_mask(self.mask, pad_batch), _pad_mask(row_mask, pad_row)], dim=0)
        self.logits = torch.cat([self.logits, logits], dim=0)
        self.rows.append(row)

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at `indices` and drop padding columns no remaining row needs."""
        import torch

        if len(indices) == len(self.rows):
            return
        if not indices:
            self.rows, self.cache, self.mask, self.logits = [], None, None, None
            return
        index = torch.tensor(indices, dtype=torch.long, device=self.device)
        self.rows = [self.rows[i] for i in indices]
        self.mask = self.mask[index]
        self.logits = self.logits[torch.tensor(indices, dtype=torch.long)]
        lead = int(torch.argmax(self.mask.any(dim=0).to(torch.int8)))  # first column any row uses
        self.mask = self.mask[:, lead:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, lead:]
            layer.values = layer.values[index, :, lead:]

    def decode(self, tokens: list[int]) -> None:
        """Feed each row its sampled token (one batched forward) and keep the new logits."""
        import torch

        ids = torch.tensor(tokens, dtype=torch.long, device=self.device).unsqueeze(1)
        positions = torch.tensor([r.cached + r.rope_delta for r in self.rows], dtype=torch.long, device=self.device)
        mask = torch.cat([self.mask, torch.ones(len(tokens), 1, dtype=torch.bool, device=self.device)], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions.unsqueeze(1),
            use_cache=True,
            **{self.cache_kwarg: self.cache},
        )
        self.cache, self.mask = cache_of(out), mask
        self.logits = out.logits[:, -1].float().cpu()
        for row in self.rows:
            row.cached += 1

    def clear(self, error: BaseException) -> None:
        """Fail every row (a forward raised) and empty the batch."""
        for row in self.rows:
            row.finish(error)
        self.rows, self.cache, self.mask, self.logits = [], None, None, None


def _pad_mask(mask: Any, n: int) -> Any:
    """Prepend `n` False columns to a [rows, len] mask."""
    import torch

    if n <= 0:
        return mask
    return torch.cat([torch.zeros(mask.shape[0], n, dtype=torch.bool, device=mask.device), mask], dim=1)


class DecodeLoop:
    """The worker thread: admits requests and runs queued calls at step boundaries, decodes the batch."""

    def __init__(self, model: Any, device: str, cache_kwarg: str, name: str, max_batch: int = 16) -> None:
        import torch

        self._torch = torch
        self.max_batch = max(1, int(max_batch))
        self.tokens_generated = 0
        self.peak_batch = 0  # the most rows one decode step has carried
        self._batch = Batch(model, device, cache_kwarg)
        self._cv = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"builtin-{name}", daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def submit(self, request: Request) -> None:
        """Queue a request; the worker admits it at the next step boundary."""
        with self._cv:
            if self._closed:
                raise ModelError("the built-in backend is closed")
            self._waiting.append(request)
            self._cv.notify()

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run `fn` on the worker between two decode steps; its result or error comes back in the future."""
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise ModelError("the built-in backend is closed")
            self._calls.append((fn, future))
            self._cv.notify()
        return future

    def close(self) -> None:
        """Stop the worker after its current step; waiting and live requests get a ModelError."""
        with self._cv:
            self._closed = True
            self._cv.notify()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the worker thread to end (after `close`; it finishes its current step first)."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _next_work(self) -> tuple[list[tuple[Callable[[], Any], Future]], list[Request], bool]:
        """Block until there is something to do; take the queued calls and the requests that fit."""
        with self._cv:
            while not (self._closed or self._calls or self._waiting or self._batch.rows):
                self._cv.wait()
            calls = list(self._calls)
            self._calls.clear()
            room = self.max_batch - len(self._batch.rows)
            if self._batch.rows and not self._batch.mergeable:
                room = 0
            for row in [r for r in self._waiting if r.stop.is_set()]:  # cancelled while queued
                self._waiting.remove(row)
                row.finish()
            newcomers = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            return calls, newcomers, self._closed

    def _run(self) -> None:
        """The worker loop."""
        while True:
            calls, newcomers, closed = self._next_work()
            if closed:
                self._shut_down(calls, newcomers)
                return
            for fn, future in calls:
                _run_call(fn, future)
            try:
                with self._torch.inference_mode():
                    for row in newcomers:
                        self._admit(row)
                    if self._batch.rows:
                        self._step()
            except BaseException as exc:  # a bug here must not kill the worker: fail the batch, go on
                log.exception("the built-in backend's decode loop failed")
                self._batch.clear(exc)

    def _admit(self, row: Request) -> None:
        """Prefill one waiting request into the batch (or finish it if it was cancelled meanwhile)."""
        if row.stop.is_set():
            row.finish()
            return
        try:
            self._batch.prefill(row)
        except BaseException as exc:  # handed to the consumer, raised there
            log.debug("prefill failed: %r", exc)
            row.finish(exc)

    def _step(self) -> None:
        """Sample one token for every row, drop finished and cancelled rows, decode the rest together."""
        batch = self._batch
        keep: list[int] = []
        tokens: list[int] = []
        for i, row in enumerate(batch.rows):
            if row.stop.is_set():
                log.debug("generation cancelled after %d tokens", row.produced)
                row.finish()
                continue
            try:
                token, logprob = pick(batch.logits[i], row.temperature, row.top_p, row.generator)
            except Exception as exc:  # e.g. non-finite logits: this row fails, the others go on
                row.finish(exc)
                continue
            row.produced += 1
            self.tokens_generated += 1
            finish = "stop" if token in row.stops else ("length" if row.produced >= row.budget else None)
            row.emit((token, logprob, finish))
            if finish is not None:
                row.finish()
                continue
            keep.append(i)
            tokens.append(token)
        try:
            batch.keep(keep)
            if batch.rows:
                batch.decode(tokens)
                self.peak_batch = max(self.peak_batch, len(batch.rows))
        except BaseException as exc:
            log.debug("decode step failed for %d rows: %r", len(batch.rows), exc)
            batch.clear(exc)

    def _shut_down(self, calls: list[tuple[Callable[[], Any], Future]], newcomers: list[Request]) -> None:
        """Fail everything still queued or live: the backend was closed."""
        error = ModelError("the built-in backend was closed")
        with self._cv:
            newcomers += list(self._waiting)
            calls += list(self._calls)
            self._waiting.clear()
            self._calls.clear()
        for _, future in calls:
            future.set_exception(error)
        for row in newcomers:
            row.finish(error)
        self._batch.clear(error)


@atexit.register
def _stop_all() -> None:
    """Close every worker still running and let it finish its step, so no thread dies inside torch."""
    for loop in list(_LIVE):
        loop.close()
    for loop in list(_LIVE):
        loop.join(timeout=10)


def _run_call(fn: Callable[[], Any], future: Future) -> None:
    """Run a queued call and settle its future."""
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
