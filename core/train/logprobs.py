"""Per-token logprobs of samples under a causal LM, computed the way the samplers record them.

A sampled token's logprob is ``log_softmax(logits / temperature)[token]`` (before any top-p
truncation), as `BuiltinBackend` records it.

Samples are packed: a micro-batch's samples are laid end to end in one row (no padding), each
with its own position ids and its own causal attention (`core.models.attention`'s segments), so
a forward costs exactly the samples' tokens. Only the positions that predict a loss-mask-1 token
go through the LM head, and in chunks of at most LOGIT_CHUNK_ELEMENTS logits, each recomputed in
the backward pass (activation checkpointing), so no [tokens, vocabulary] tensor is ever held for a
whole sample: a long trajectory made mostly of tool output costs one hidden state per token.

A micro-batch's samples that begin alike (the same system prompt and task template; a GRPO
group's shared prompt) share that beginning: it is laid once at the head of the row and every
sample's rest attends to it (`core.models.attention`'s context segments), so the forward runs the
common prefix once instead of once per sample. Exact: each sample's tokens see the same keys at the
same positions as alone, and the prefix's gradient is the sum of what every sample sends back.
Rows are packed in token order when sharing, so samples of one prompt land in one row.

The (B, K) tensors put each sample's trained positions in its own row, left-aligned (mask 0 after
them): what veRL's per-sequence loss aggregations expect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.chat import ImagePart
from core.errors import ForgetuiError
from core.tokens.ids import common_prefix
from core.train.types import Sample

LOGIT_CHUNK_ELEMENTS = 1 << 25  # logits (positions × vocabulary) computed at once: 128 MB in float32
MIN_SHARED_PREFIX = 16  # a shorter common beginning is laid out per sample (sharing it would save next to nothing)


@dataclass
class Batch:
    """Samples packed into one row; the (B, K) tensors hold each sample's trained positions, left-aligned."""

    input_ids: Any  # (1, T) long: the samples end to end
    position_ids: Any  # (1, T) long: each sample counts from 0
    # the attention's segments: (start, end) attends causally to itself; (start, end, 0, shared) also sees the shared prefix
    segments: list[tuple[int, ...]]
    positions: Any  # (N,) long: columns p whose next token (p + 1) is trained, sample by sample
    rows: Any  # (N,) long: the sample (row of the (B, K) tensors) of each such column
    cols: Any  # (N,) long: its index within that row
    targets: Any  # (N,) long: the token at p + 1
    mask: Any  # (B, K) float: 1 where a trained token is
    recorded: Any  # (B, K) float: the recorded logprob of that token (0 where mask is 0)
    advantages: Any  # (B, K) float: the sample's advantage × its call's weight on every trained token (0 past them)
    # what else the forward takes: a vision-language sample's pixel values, image grids and 3D positions
    inputs: dict[str, Any] = field(default_factory=dict)
    shared: int = 0  # tokens of the common prefix laid once at the head of the row (0: none shared)

    @property
    def tokens(self) -> int:
        """Trainable tokens in the batch."""
        return int(self.mask.sum().item())

    @property
    def width(self) -> int:
        """Tokens the forward runs (the packed row's length)."""
        return int(self.input_ids.shape[1])

    def scatter(self, values: Any) -> Any:
        """(N,) values of the trained columns → (B, K), zeros elsewhere (differentiable)."""
        out = values.new_zeros(self.mask.shape)
        return out.index_put((self.rows, self.cols), values)


ImageInputs = Callable[[Any, Any, list[ImagePart]], dict[str, Any]]


def call_weights(sample: Sample, positions: Any) -> Any:
    """Per position (a numpy array of token indices): its call's weight in `sample.call_weights`, 1 outside them (float32)."""
    out = np.ones(len(positions), dtype=np.float32)
    for weight, start, end in zip(sample.call_weights, sample.completion_starts, sample.completion_ends, strict=False):
        out[(positions >= start) & (positions < end)] = weight
    return out


def shared_prefix(samples: Sequence[Sample]) -> int:
    """The tokens every sample begins with, when worth sharing (≥ MIN_SHARED_PREFIX and ≥ 2 samples), else 0."""
    if len(samples) < 2:
        return 0
    first = samples[0].token_ids
    shared = min(common_prefix(first, s.token_ids) for s in samples[1:])
    return shared if shared >= MIN_SHARED_PREFIX else 0


def collate(
    samples: Sequence[Sample], device: Any = "cpu", image_inputs: ImageInputs | None = None, *, share_prefix: bool = True
) -> Batch:
    """Pack samples into one row and pick the columns that predict a sampled token.

    `share_prefix`: the samples' common beginning (`shared_prefix`) is laid once at the head of
    the row and each sample's rest after it, attending to it (see the module's docstring).
    Samples with images need `image_inputs(input_ids, attention_mask, images)`: the forward's
    pixel inputs for the row's images (`core.tokens.vision.forward_inputs`); the model computes
    their 3D positions itself, from the whole row, so a row with images holds one sample.
    """
    import torch

    # a sample's ids, mask and logprobs are lists or numpy arrays (samples_for_run builds arrays): numpy for both
    ids = [np.asarray(s.token_ids, dtype=np.int64) for s in samples]
    images = [image for s in samples for image in s.images]
    shared = shared_prefix(samples) if share_prefix and not images else 0
    pieces: list[Any] = [ids[0][:shared]] if shared else []
    places: list[Any] = [np.arange(shared)] if shared else []  # each column's position id
    segments: list[tuple[int, ...]] = [(0, shared)] if shared else []
    positions: list[Any] = []
    targets: list[Any] = []
    recorded: list[Any] = []
    weights: list[Any] = []  # per trained token: the sample's advantage × its call's share (`Sample.call_weights`)
    start = shared
    for s, tokens in zip(samples, ids, strict=True):
        size = len(tokens)
        if not (len(s.loss_mask) == len(s.logprobs) == size):
            raise ForgetuiError(
                f"sample {s.sample_id}: {size} tokens, {len(s.loss_mask)} mask entries, {len(s.logprobs)} "
                "logprobs; they must be aligned one per token"
            )
        pieces.append(tokens[shared:])
        places.append(np.arange(shared, size))
        if size > shared:
            segments.append((start, start + size - shared, 0, shared) if shared else (start, start + size))
        # the first token has no prediction: a sample's first sampled token comes after its prompt
        trained = np.flatnonzero(np.asarray(s.loss_mask[1:]))
        # token p predicts p + 1; its column: in the shared head (p < shared) or in this sample's rest
        positions.append(np.where(trained < shared, trained, start + trained - shared))
        targets.append(tokens[trained + 1])
        recorded.append(np.asarray(s.logprobs, dtype=np.float32)[trained + 1])
        weights.append(float(s.advantage) * call_weights(s, trained + 1))
        start += size - shared
    n, k = len(samples), max((len(r) for r in recorded), default=0)
    mask, logged, adv = torch.zeros(n, k), torch.zeros(n, k), torch.zeros(n, k)
    for i, (values, weighted) in enumerate(zip(recorded, weights, strict=True)):
        mask[i, : len(values)] = 1.0
        logged[i, : len(values)] = torch.from_numpy(values)
        adv[i, : len(values)] = torch.from_numpy(weighted)
    rows = np.repeat(np.arange(n), [len(r) for r in recorded])
    cols = np.concatenate([np.arange(len(r)) for r in recorded]) if recorded else np.zeros(0, dtype=np.int64)

    def joined(parts: list[Any]) -> Any:
        return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)).long()

    row = joined(pieces).unsqueeze(0)
    inputs: dict[str, Any] = {}
    if images:
        if image_inputs is None:
            raise ForgetuiError("these samples carry images, and the model being trained takes text only")
        if n != 1:
            raise ForgetuiError("a packed row with images holds one sample (its 3D positions span the row)")
        inputs = image_inputs(row.to(device), torch.ones_like(row).to(device), images)
    return Batch(
        input_ids=row.to(device),
        position_ids=joined(places).unsqueeze(0).to(device),
        segments=segments,
        positions=joined(positions).to(device),
        rows=torch.from_numpy(rows).long().to(device),
        cols=torch.from_numpy(cols).long().to(device),
        targets=joined(targets).to(device),
        mask=mask.to(device),
        recorded=logged.to(device),
        advantages=adv.to(device),
        inputs=inputs,
        shared=shared,
    )


def pack(
    samples: Sequence[Sample], max_samples: int, max_tokens: int, alone: bool = False, *, share_prefix: bool = False
) -> list[list[Sample]]:
    """Samples in rows of at most `max_samples` samples and `max_tokens` tokens (a longer sample alone); `alone`: one per row.

    Sorted by length, so a row's samples are alike and the rows are evenly filled; with
    `share_prefix`, sorted by their tokens instead, so samples that begin alike share a row, and a
    row's tokens count its common prefix once (what `collate` will run). A sample that would shrink
    the row's common prefix by more than it saves starts a new row: GRPO groups whose prompts share
    only a short start (mini-swe-agent puts the task first) keep a row each, while groups under one
    long system prompt (react's) fill a row together.
    """
    if share_prefix:
        order = sorted(samples, key=lambda s: tuple(int(t) for t in s.token_ids))
    else:
        order = sorted(samples, key=lambda s: len(s.token_ids))
    rows: list[list[Sample]] = []
    current: list[Sample] = []
    plain = common = 0  # the row's tokens laid out one sample after another; its samples' common beginning
    for s in order:
        size = len(s.token_ids)
        joined = min(common, common_prefix(current[-1].token_ids, s.token_ids)) if share_prefix and current else size
        shared = joined if share_prefix and joined >= MIN_SHARED_PREFIX else 0
        cost = plain + size - shared * len(current)  # the prefix once, not once per sample
        # joining lays (n + 1) samples sharing `shared`; a row of its own lays this one whole, the row's n keep theirs
        before = common if len(current) > 1 and common >= MIN_SHARED_PREFIX else 0
        worse = share_prefix and shared * len(current) < before * (len(current) - 1)
        if current and (alone or len(current) >= max_samples or cost > max_tokens or worse):
            rows.append(current)
            current, plain, joined = [], 0, size
        current.append(s)
        plain, common = plain + size, joined
    if current:
        rows.append(current)
    return rows


def token_logprobs(
    model: Any, batch: Batch, temperature: float, *, with_entropy: bool = False, entropy_grad: bool = False
) -> tuple[Any, Any]:
    """(logprobs (B, K), entropy (B, K) or None) of the batch's target tokens under `model`.

    Gradients flow through the logprobs when the caller has them enabled; through the entropy
    (of the temperature-scaled distribution) only with `entropy_grad` (an entropy bonus).
    """
    import torch

    if batch.positions.numel() == 0:
        empty = torch.zeros_like(batch.mask)
        return empty, (empty if with_entropy else None)
    hidden = _hidden_states(model, batch)[0, batch.positions]
    head = model.get_output_embeddings()
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // int(head.weight.shape[0]))
    # with several chunks, each one's logits are recomputed in the backward pass instead of kept (one alone is the bound)
    recompute = torch.is_grad_enabled() and hidden.shape[0] > chunk
    picked, entropies = [], []
    for start in range(0, hidden.shape[0], chunk):
        args = (head, hidden[start : start + chunk], batch.targets[start : start + chunk], temperature, with_entropy, entropy_grad)
        if recompute:
            from torch.utils.checkpoint import checkpoint

            lp, ent = checkpoint(_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _chunk(*args)
        picked.append(lp)
        entropies.append(ent)
    logp = batch.scatter(torch.cat(picked)) * batch.mask
    entropy = batch.scatter(torch.cat(entropies)) * batch.mask if with_entropy else None
    return logp, entropy


def _hidden_states(model: Any, batch: Batch) -> Any:
    """The last hidden states (1, T, hidden) of the packed row: the model's body, without its LM head."""
    import torch

    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    body = getattr(base, base.base_model_prefix)
    kwargs: dict[str, Any] = {
        "input_ids": batch.input_ids,
        # all ones: transformers builds no [T, T] mask (segments get their causal attention one by one in
        # core.models.attention) and does not derive one from the position ids' resets either
        "attention_mask": torch.ones_like(batch.input_ids),
        "position_ids": batch.position_ids,
        "use_cache": False,
        **batch.inputs,  # a vision-language sample: its pixels and its own 3D positions
    }
    if len(batch.segments) > 1:
        kwargs["segments"] = batch.segments
    out = body(**kwargs)
    return out.last_hidden_state


def _chunk(head: Any, hidden: Any, targets: Any, temperature: float, with_entropy: bool, entropy_grad: bool) -> tuple[Any, Any]:
    """Logprobs (and entropies) of `targets` from a chunk of hidden states: one [chunk, vocabulary] logits tensor."""
    import torch

    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    picked = torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy and entropy_grad and torch.is_grad_enabled():  # an entropy bonus: veRL's, differentiable
        from verl.utils.torch_functional import entropy_from_logits

        entropy = entropy_from_logits(logits)
    elif with_entropy:  # a metric only: −Σ p log p from the log-softmax already there (no second pass over the logits)
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(dim=-1)
    return picked, entropy


def sampler_temperature(temperature: float, greedy_below: float = 1e-5) -> float:
    """The temperature logprobs are recomputed with: the sampler's, or 1 for greedy (as recorded)."""
    return 1.0 if temperature < greedy_below else float(temperature)
