"""Continuous batching for the built-in backend: one worker thread decodes every live sequence together.

Requests wait in a queue; at each step boundary the worker runs queued calls (weight reloads),
admits waiting requests (the starts of their prompts found in the prefix cache are reused, the
rest prefilled together: see `Batch`), merges them into the batch's KV cache with left padding,
samples one token for every row, drops the rows that finished or were cancelled (caching what they
ran through the model), and runs one batched decode forward (attention mask over the padding,
per-row position ids). With `speculate` > 0 each row's sampled token goes into that forward with
draft tokens looked up in its own sequence, and the drafts the model agrees with are emitted too
(`core.backends.speculation`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.backends.prefix_cache import PrefixCache
from core.backends.sampling import GREEDY_BELOW, PositionNoise, pick
from core.backends.speculation import accepted, propose, width
from core.errors import ModelError
from core.tokens.ids import common_prefix

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 16  # rows one decode step carries unless the spec says `max_batch=N`
PREFILL_TOKENS = 2048  # prompt tokens one prefill forward carries (rows × chunk): bounds its activations and masks
MIN_SHARED = 32  # a start several newcomers share is prefilled once on its own when at least this many tokens are new
SLACK = 64  # padding tokens a prefill group may carry beyond its half-of-the-work bound
FIXED_POSITIONS_CPU = 16.0  # see DecodeLoop.fixed_positions (benchmarks/speculation.py measures the trade)
FIXED_POSITIONS_ACCELERATOR = 256.0  # a GPU's decode forward barely notices a few more positions per row
PRIOR_WINDOW = 4096  # draft trials the batch-wide acceptance prior remembers at full weight (then halved)
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
    tokens: list[int] = field(default_factory=list)  # the sampled ids so far
    cached: int = 0  # real (unpadded) tokens in this row's KV cache
    cacheable: bool = True  # its ids say everything the model saw (False with images): the prefix cache may hold it
    weights: int = 0  # the batch's weights generation when this row was prefilled
    # speculation: drafts tried, each once every draft before it was accepted (verified, or checked afterwards
    # against the token sampled where it was not verified), and how many matched: the row's acceptance rate
    trials: int = 0
    hits: int = 0
    unverified: int | None = None  # the first draft of the last step's proposal left out of the forward
    # a vision-language prompt's extra prefill inputs (pixel values, grids, 3D positions) and the offset
    # its image tokens put between a token's index and its rotary position (Qwen2-VL's rope delta)
    prefill_inputs: dict[str, Any] = field(default_factory=dict)
    rope_delta: int = 0
    banned: Any = None  # LongTensor of ids never sampled (a vision model's image placeholders), or None
    noise: PositionNoise = field(init=False)  # its sampler's noise per answer position, from `generator`

    def __post_init__(self) -> None:
        self.noise = PositionNoise(self.generator)

    def choose(self, offset: int, logits: Any) -> tuple[int, float]:
        """The token this request's sampler takes at the position `offset` past its next one, given the logits there."""
        noise = None if self.temperature < GREEDY_BELOW else self.noise.at(offset, logits.shape[-1])
        return pick(logits, self.temperature, self.top_p, noise, self.banned)

    def finish(self, error: BaseException | None = None) -> None:
        """Tell the consumer this generation is over (with `error` if it failed) and resolve `done`."""
        if self.done.done():
            return
        if error is not None:
            self.emit(error if isinstance(error, Exception) else RuntimeError(str(error)))
        self.emit(DONE)
        self.done.set_result(self.produced)


def cache_of(out: Any) -> Any:
    """The KV cache a forward returned (transformers 5 may call it `cache`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@dataclass
class Found:
    """A prompt's start found in the prefix cache: its length and its kv states in pieces (see PrefixCache.lookup)."""

    tokens: int = 0
    segments: list[Any] = field(default_factory=list)


@dataclass
class Prefilled:
    """The outcome of one batched prefill: rows' KV cache (right-aligned pasts, suffixes after), mask, last logits."""

    cache: Any
    mask: Any  # [rows, columns] bool, True where a row has a real token
    logits: Any  # [rows, vocab] float32 on the CPU


class Batch:
    """The rows decoding together: their shared KV cache, padding mask and next-token logits.

    Prefill: each newcomer's longest start found in the prefix cache is reused (copied in, right-aligned,
    left-padded); a start several newcomers share that is not cached yet is prefilled once on its own
    first; the rest of every prompt is prefilled together in chunks of at most PREFILL_TOKENS tokens
    (right-padded, so no query row is ever fully masked), and each prompt goes into the prefix cache.
    A finished row's prompt + completion go into it too. Rows may then hold padding in the middle of
    their columns: the mask covers it, and position ids are per row.
    """

    def __init__(self, model: Any, device: str, cache_kwarg: str, prefix: PrefixCache | None = None) -> None:
        from core.backends.kv_cache import batchable

        self.model = model
        self.device = device
        self.cache_kwarg = cache_kwarg
        text = model.config.get_text_config()
        self.layers = int(text.num_hidden_layers)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        self.mergeable = batchable(model.config)  # else: one row at a time, transformers' own cache, no prefix reuse
        self.prefix = prefix if self.mergeable else None
        self.rows: list[Request] = []
        self.cache: Any = None
        self.mask: Any = None  # [rows, kv_len] bool, False over padding
        self.logits: Any = None  # [rows, vocab] float32 on the CPU: each row's next-token logits
        self.weights = 0  # generation of the weights: bumped by `forget`, so states from older weights are never cached
        self.prefilled_tokens = 0  # prompt tokens run through the model
        self.reused_tokens = 0  # prompt tokens taken from the prefix cache instead

    # ------------------------------------------------------------------ admission

    def admit(self, rows: list[Request]) -> None:
        """Prefill newcomers and add them to the batch; a failed prefill fails only its own rows."""
        text = [r for r in rows if not r.prefill_inputs]
        for row in [r for r in rows if r.prefill_inputs]:  # images: the whole prompt with its pixels, on its own
            self._run([row], lambda row=row: self._prefill_with_images(row))
        if text and self.prefix is not None:
            self._run(text, lambda: self._share_starts(text))
        found = [(r, self._lookup(r)) for r in text if not r.done.done()]
        for group in _groups(found):
            rows = [r for r, _ in group]
            self._run(rows, lambda rows=rows, group=group: self._prefill_rows(rows, [f for _, f in group]))

    def _run(self, rows: list[Request], fn: Callable[[], None]) -> None:
        """Run one prefill step for `rows`; on an error fail those rows (the consumer sees it) and leave the batch as it was."""
        try:
            fn()
        except BaseException as exc:
            log.debug("prefill failed for %d rows: %r", len(rows), exc)
            for row in rows:
                row.finish(exc)

    def _lookup(self, row: Request) -> Found:
        """The longest start of `row`'s prompt in the prefix cache (at most all but its last token: it needs logits)."""
        if self.prefix is None or not row.cacheable:
            return Found()
        return Found(*self.prefix.lookup(row.prompt_ids, len(row.prompt_ids) - 1))

    def _share_starts(self, rows: list[Request]) -> None:
        """Prefill once, on its own, each start that several newcomers share and the prefix cache lacks."""
        assert self.prefix is not None
        prompts = [np.asarray(r.prompt_ids, dtype=np.int64) for r in rows if r.cacheable]
        starts = []
        for i, ids in enumerate(prompts):
            shared = max((common_prefix(ids, other) for j, other in enumerate(prompts) if j != i), default=0)
            shared = min(shared, len(ids) - 1)
            if shared - self.prefix.match_length(ids, shared) >= MIN_SHARED:
                starts.append(ids[:shared].tolist())
        for start in sorted(starts, key=len, reverse=True):  # the longest first: the shorter are often inside it
            if len(start) - self.prefix.match_length(start) >= MIN_SHARED:
                found = Found(*self.prefix.lookup(start, len(start) - 1))
                done = self._prefill([start], [found])
                self._remember(start, done.cache, done.mask, 0)

    def _prefill_rows(self, rows: list[Request], found: list[Found]) -> None:
        """Prefill `rows` together, cache their prompts, and add them to the batch."""
        done = self._prefill([r.prompt_ids for r in rows], found)
        for i, row in enumerate(rows):
            row.cached, row.weights = len(row.prompt_ids), self.weights
            if self.prefix is not None and row.cacheable:
                self._remember(row.prompt_ids, done.cache, done.mask, i)
        self._add(rows, done)

    def _prefill(self, prompts: list[list[int]], found: list[Found]) -> Prefilled:
        """Run every prompt's uncached rest through the model, together, in chunks; the cached starts are copied in."""
        import torch

        from core.backends.kv_cache import MIN_SPARE, growing_cache

        n = len(prompts)
        cached = [f.tokens for f in found]
        rest = [len(p) - c for p, c in zip(prompts, cached, strict=True)]
        past, width = max(cached), max(rest)
        cache = growing_cache(self.layers) if self.mergeable else None
        mask = torch.zeros(n, past, dtype=torch.bool, device=self.device)
        if past:
            dtype = next(self.model.parameters()).dtype
            for layer in cache.layers:
                layer.reserve(n, self.kv_heads, past, self.head_dim, width + MIN_SPARE, dtype, self.device)
            for i, f in enumerate(found):
                column = past - f.tokens
                mask[i, column:] = True
                for segment in f.segments:
                    size = segment.shape[3]
                    for layer, states in zip(cache.layers, segment, strict=True):
                        layer.keys[i, :, column : column + size] = states[0]
                        layer.values[i, :, column : column + size] = states[1]
                    column += size
        logits: list[Any] = [None] * n
        step = max(1, PREFILL_TOKENS // n)
        lengths = torch.tensor(rest, device=self.device)
        for start in range(0, width, step):
            size = min(step, width - start)
            ids = torch.zeros(n, size, dtype=torch.long)
            for i, (prompt, c) in enumerate(zip(prompts, cached, strict=True)):
                piece = prompt[c + start : c + min(start + size, rest[i])]
                ids[i, : len(piece)] = torch.tensor(piece, dtype=torch.long)
            offsets = torch.arange(size, device=self.device)
            real = (offsets + start).unsqueeze(0) < lengths.unsqueeze(1)
            positions = torch.tensor(cached, device=self.device).unsqueeze(1) + start + offsets
            mask = torch.cat([mask, real], dim=1)
            ending = [i for i in range(n) if start <= rest[i] - 1 < start + size]
            keep = sorted({rest[i] - 1 - start for i in ending})
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=torch.tensor(keep, device=self.device) if keep else 1,
                **({self.cache_kwarg: cache} if cache is not None else {}),
            )
            cache = cache_of(out)
            for i in ending:
                logits[i] = out.logits[i, keep.index(rest[i] - 1 - start)].float().cpu()
        self.prefilled_tokens += sum(rest)
        self.reused_tokens += sum(cached)
        return Prefilled(cache, mask, torch.stack(logits))

    def _prefill_with_images(self, row: Request) -> None:
        """A vision-language prompt: one forward over all of it with its pixel inputs (its ids alone do not say what it saw)."""
        import torch

        from core.backends.kv_cache import growing_cache

        ids = torch.tensor([row.prompt_ids], dtype=torch.long, device=self.device)
        cache = {self.cache_kwarg: growing_cache(self.layers)} if self.mergeable else {}
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache, **row.prefill_inputs)
        row.prefill_inputs = {}  # the pixels are in the KV cache now
        row.cached = len(row.prompt_ids)
        self.prefilled_tokens += row.cached
        mask = torch.ones(1, row.cached, dtype=torch.bool, device=self.device)
        self._add([row], Prefilled(cache_of(out), mask, out.logits[:, -1].float().cpu()))

    def _add(self, rows: list[Request], done: Prefilled) -> None:
        """Merge prefilled rows into the batch, aligned on their last column (the shorter side left-padded)."""
        import torch

        if not self.rows:
            self.rows, self.cache, self.mask, self.logits = list(rows), done.cache, done.mask, done.logits
            self._trim()
            return
        if not self.mergeable:
            raise ModelError("this model's KV cache cannot be batched (sliding-window or recurrent layers)")
        width = max(self.mask.shape[1], done.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, done.cache.layers, strict=True):
            mine.stack(theirs)
        self.mask = torch.cat([_pad_mask(self.mask, width - self.mask.shape[1]), _pad_mask(done.mask, width - done.mask.shape[1])])
        self.logits = torch.cat([self.logits, done.logits], dim=0)
        self.rows += rows
        self._trim()

    def _trim(self) -> None:
        """Drop leading padding columns no row uses."""
        if not self.mergeable or self.mask.shape[1] == 0:
            return
        lead = int(torch_argmax_any(self.mask))
        if lead:
            self.mask = self.mask[:, lead:]
            for layer in self.cache.layers:
                layer.fill(layer.keys[:, :, lead:], layer.values[:, :, lead:])

    # ------------------------------------------------------------------ the prefix cache

    def _remember(self, ids: list[int], cache: Any, mask: Any, row: int) -> None:
        """Put `ids` (row `row` of `cache`, its real columns in order) into the prefix cache."""
        import torch

        assert self.prefix is not None
        columns = torch.nonzero(mask[row]).squeeze(1)
        if len(columns) != len(ids):  # never expected: the row's states and its ids must line up one to one
            log.warning("prefix cache: row holds %d states for %d ids; not cached", len(columns), len(ids))
            return

        def fetch(start: int, end: int) -> Any:
            picked = columns[start:end]
            return torch.stack([torch.stack([layer.keys[row][:, picked], layer.values[row][:, picked]]) for layer in cache.layers])

        self.prefix.insert(ids, fetch)

    def remember(self, index: int) -> None:
        """Cache what row `index` has run through the model so far (prompt + completion): a later call extends it."""
        row = self.rows[index]
        if self.prefix is None or not row.cacheable or row.weights != self.weights:  # part of it under older weights
            return
        self._remember((row.prompt_ids + row.tokens)[: row.cached], self.cache, self.mask, index)

    def forget(self) -> None:
        """Empty the prefix cache (new weights make every cached state stale)."""
        self.weights += 1
        if self.prefix is not None:
            self.prefix.clear()

    # ------------------------------------------------------------------ decoding

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
        lead = int(torch_argmax_any(self.mask))
        self.mask = self.mask[:, lead:]
        for layer in self.cache.layers:
            layer.fill(layer.keys[index, :, lead:], layer.values[index, :, lead:])

    def decode(self, feeds: list[list[int]]) -> Any:
        """Feed each row its sampled token and its drafts (one batched forward, shorter feeds right-padded).

        Returns the logits [rows, longest feed, vocab] on the CPU; `settle` then says how much of each feed stays.
        """
        import torch

        width = max(len(f) for f in feeds)
        ids = torch.zeros(len(feeds), width, dtype=torch.long)
        real = torch.zeros(len(feeds), width, dtype=torch.bool)
        for i, feed in enumerate(feeds):
            ids[i, : len(feed)] = torch.tensor(feed, dtype=torch.long)
            real[i, : len(feed)] = True
        starts = torch.tensor([r.cached + r.rope_delta for r in self.rows], dtype=torch.long)
        positions = (starts.unsqueeze(1) + torch.arange(width)).to(self.device)
        mask = torch.cat([self.mask, real.to(self.device)], dim=1)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_kwarg: self.cache},
        )
        self.cache, self.mask = cache_of(out), mask
        return out.logits.float().cpu()

    def settle(self, fed: list[int], width: int) -> None:
        """Keep the first `fed[i]` of row i's last `width` columns (the sampled token and its accepted drafts).

        The rest are masked out, and columns no row keeps are dropped from the cache.
        """
        used = max(fed)
        base = self.mask.shape[1] - width
        for i, (row, n) in enumerate(zip(self.rows, fed, strict=True)):
            row.cached += n
            if n < width:  # without drafts every row keeps its one column: nothing to mask on the common path
                self.mask[i, base + n :] = False
        if used < width:
            self.mask = self.mask[:, : base + used]
            for layer in self.cache.layers:
                layer.truncate(base + used)

    def clear(self, error: BaseException) -> None:
        """Fail every row (a forward raised) and empty the batch."""
        for row in self.rows:
            row.finish(error)
        self.rows, self.cache, self.mask, self.logits = [], None, None, None


def torch_argmax_any(mask: Any) -> Any:
    """The first column any row of a [rows, columns] bool mask uses."""
    import torch

    return torch.argmax(mask.any(dim=0).to(torch.int8))


def _groups(found: list[tuple[Request, Found]]) -> list[list[tuple[Request, Found]]]:
    """Newcomers (with their cached starts) split into prefill groups so padding stays under half of each group's work.

    Rows are sorted by (uncached rest, cached start); a row joins the current group while the group's
    padded rests and padded starts each stay within twice its real ones (plus a little slack).
    """
    sizes = sorted(((len(r.prompt_ids) - f.tokens, f.tokens, (r, f)) for r, f in found), key=lambda t: (t[0], t[1]))
    groups: list[list[tuple[Request, Found]]] = []
    current: list[tuple[int, int, tuple[Request, Found]]] = []
    for item in sizes:
        trial = [*current, item]
        rest, past = max(t[0] for t in trial), max(t[1] for t in trial)
        fits = len(trial) * rest <= 2 * sum(t[0] for t in trial) + SLACK and len(trial) * past <= 2 * sum(t[1] for t in trial) + SLACK
        if current and not fits:
            groups.append([t[2] for t in current])
            trial = [item]
        current = trial
    if current:
        groups.append([t[2] for t in current])
    return groups


def _pad_mask(mask: Any, n: int) -> Any:
    """Prepend `n` False columns to a [rows, len] mask."""
    import torch

    if n <= 0:
        return mask
    return torch.cat([torch.zeros(mask.shape[0], n, dtype=torch.bool, device=mask.device), mask], dim=1)


class DecodeLoop:
    """The worker thread: admits requests and runs queued calls at step boundaries, decodes the batch."""

    def __init__(
        self, model: Any, device: str, cache_kwarg: str, name: str, max_batch: int = DEFAULT_MAX_BATCH, prefix_cache_bytes: int = 0, speculate: int = 0
    ) -> None:
        import torch

        self._torch = torch
        self.max_batch = max(1, int(max_batch))
        self.speculate = max(0, int(speculate))  # draft tokens a row may verify per step (0: none)
        self.tokens_generated = 0
        self.drafted = 0  # draft tokens verified
        self.accepted = 0  # of them, the ones the model agreed with (emitted without a forward of their own)
        # drafts tried with every draft before them accepted (`Request.trials`, over every row) and the ones
        # that matched: the prior of a row without history. Halved past PRIOR_WINDOW trials, so it follows a
        # policy that changes under training (weights reloaded between GRPO steps) instead of its whole past.
        self.trials = 0.0
        self.hits = 0.0
        # what a decode forward costs beyond its positions, in positions (`speculation.width`): the weights'
        # reading on a CPU (SmolLM2-135M on 2 AVX2 cores: a step of 8 rows costs ~15 + 8 × width positions)
        self.fixed_positions = FIXED_POSITIONS_CPU if str(device).startswith("cpu") else FIXED_POSITIONS_ACCELERATOR
        self.peak_batch = 0  # the most rows one decode step has carried
        self.prefill_s = 0.0  # worker seconds spent prefilling prompts
        self.decode_s = 0.0  # worker seconds spent in decode steps (sampling included)
        prefix = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._batch = Batch(model, device, cache_kwarg, prefix)
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
            if not self._batch.mergeable:  # one sequence at a time
                room = 0 if self._batch.rows else 1
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
                    self._admit(newcomers)
                    if self._batch.rows:
                        started = time.perf_counter()
                        self._step()
                        self.decode_s += time.perf_counter() - started
            except BaseException as exc:  # a bug here must not kill the worker: fail the batch, go on
                log.exception("the built-in backend's decode loop failed")
                self._batch.clear(exc)

    def _admit(self, newcomers: list[Request]) -> None:
        """Prefill the waiting requests into the batch (those cancelled meanwhile just finish)."""
        for row in [r for r in newcomers if r.stop.is_set()]:
            row.finish()
        live = [r for r in newcomers if not r.stop.is_set()]
        if live:
            started = time.perf_counter()
            self._batch.admit(live)
            self.prefill_s += time.perf_counter() - started

    def stats(self) -> dict[str, float]:
        """Where the worker's time went and how much of the prompts the prefix cache saved (read between steps)."""
        batch, prefix = self._batch, self._batch.prefix
        return {
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "prefill_tokens": float(batch.prefilled_tokens),
            "reused_tokens": float(batch.reused_tokens),
            "decode_tokens": float(self.tokens_generated),
            "drafted_tokens": float(self.drafted),
            "accepted_tokens": float(self.accepted),
            "prefix_cache_bytes": float(prefix.bytes if prefix is not None else 0),
            "prefix_cache_sequences": float(prefix.leaves if prefix is not None else 0),
        }

    def forget_prefixes(self) -> None:
        """Drop every cached prefix (call on the worker, e.g. from a weight reload)."""
        self._batch.forget()

    def _step(self) -> None:
        """Sample one token for every row, drop finished and cancelled rows, decode the rest together (with their drafts)."""
        batch = self._batch
        keep: list[int] = []
        tokens: list[int] = []
        for i, row in enumerate(batch.rows):
            if row.done.done():  # it finished on an accepted draft in the last step (and was cached then)
                continue
            if row.stop.is_set():
                log.debug("generation cancelled after %d tokens", row.produced)
                row.finish()
                continue
            try:
                token, logprob = row.choose(0, batch.logits[i])
            except Exception as exc:  # e.g. non-finite logits: this row fails, the others go on
                row.finish(exc)
                continue
            if row.unverified is not None:  # would the draft left out have been accepted? (answers never depend on it)
                self._tried(row, 1, int(token == row.unverified))
                row.unverified = None
            if self._emit(row, token, logprob):
                row.finish()
                self._remember(i)
                continue
            keep.append(i)
            tokens.append(token)
        try:
            batch.keep(keep)
            if batch.rows:
                feeds = self._feeds(tokens)
                logits = batch.decode(feeds)
                self._verify(feeds, logits)
                self.peak_batch = max(self.peak_batch, len(batch.rows))
        except BaseException as exc:
            log.debug("decode step failed for %d rows: %r", len(batch.rows), exc)
            batch.clear(exc)

    def _emit(self, row: Request, token: int, logprob: float) -> bool:
        """Hand `row` its next token; whether that ends it (a stop token or its budget spent)."""
        row.produced += 1
        row.tokens.append(token)
        row.noise.advance()
        self.tokens_generated += 1
        finish = "stop" if token in row.stops else ("length" if row.produced >= row.budget else None)
        row.emit((token, logprob, finish))
        return finish is not None

    def _feeds(self, tokens: list[int]) -> list[list[int]]:
        """Each row's sampled token and the drafts this step verifies (as many as pay for their place in the forward)."""
        rows = self._batch.rows
        drafts = [self._drafts(row) for row in rows]
        if not any(drafts):
            return [[token] for token in tokens]
        prior = (self.hits + 1) / (self.trials + 2)
        rates = [(row.hits + 2 * prior) / (row.trials + 2) for row in rows]
        w = width(drafts, rates, self.fixed_positions)
        for row, d in zip(rows, drafts, strict=True):
            row.unverified = d[w - 1] if len(d) >= w else None
        return [[token, *d[: w - 1]] for token, d in zip(tokens, drafts, strict=True)]

    def _tried(self, row: Request, trials: int, hits: int) -> None:
        """Count drafts tried for `row` and how many matched (its acceptance rate, and the batch's)."""
        row.trials += trials
        row.hits += hits
        self.trials += trials
        self.hits += hits
        if self.trials > PRIOR_WINDOW:
            self.trials /= 2
            self.hits /= 2

    def _drafts(self, row: Request) -> list[int]:
        """Up to `speculate` draft tokens for `row` (within its budget; none without speculation)."""
        k = min(self.speculate, row.budget - row.produced)
        if k <= 0 or not self._batch.mergeable:
            return []
        return propose(row.prompt_ids + row.tokens, k)

    def _verify(self, feeds: list[list[int]], logits: Any) -> None:
        """Emit each row's drafts up to the first its sampler would not have chosen; keep their states and the logits that follow."""
        batch = self._batch
        fed: list[int] = []
        nexts = []
        ended: list[int] = []
        for i, (row, feed) in enumerate(zip(batch.rows, feeds, strict=True)):
            drafts = feed[1:]
            kept: list[float] = []
            if drafts:
                kept = accepted(logits[i], drafts, row.choose)
                rejected = len(kept) < len(drafts)  # then nothing after the rejected draft was tried
                self._tried(row, len(kept) + rejected, len(kept))
                if rejected:
                    row.unverified = None
            self.drafted += len(drafts)
            self.accepted += len(kept)
            n = 0
            for draft, logprob in zip(drafts, kept, strict=False):
                n += 1
                if self._emit(row, draft, logprob):
                    ended.append(i)
                    break
            fed.append(1 + n)
            nexts.append(logits[i, n])
        batch.settle(fed, len(max(feeds, key=len)))
        batch.logits = self._torch.stack(nexts)
        for i in ended:  # finished on a draft: answered now, cached while its states are in the batch, dropped next step
            batch.rows[i].finish()
            self._remember(i)

    def _remember(self, index: int) -> None:
        """Cache a finished row's prompt + completion; a failure here costs reuse, never the generation."""
        try:
            self._batch.remember(index)
        except Exception:  # noqa: BLE001 - the row has already been answered
            log.exception("prefix cache: could not keep a finished sequence")

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
