"""Prompt-lookup speculative decoding for the built-in backend: draft tokens from the sequence itself, verified in one forward.

An agent's answer copies a great deal from what it was shown: file names and words of the task, the
JSON of the tool calls earlier in its history, its own repeated phrases. The draft for a row is what
followed the latest earlier occurrence of its last few tokens (prompt + answer so far), as in
transformers' `prompt_lookup_num_tokens` and vLLM's n-gram speculator. The model runs the sampled
token and the drafts in one forward (on a CPU a forward's cost is mostly reading the weights, so a
few more positions cost little) and `accept` keeps the drafts the model would have produced.

Exact in distribution (speculative sampling with a draft that is a point mass): draft d is accepted
with probability p(d); at the first rejection the next token is sampled from p without d, the
residual max(p − q, 0) renormalised. Every emitted token's recorded logprob is log p(token), the
target distribution's, as without speculation; greedy decoding emits the same tokens. What changes is
how the row's seeded random stream is consumed, so a seed draws a different (equally likely) answer.
We write our own instead of calling transformers' `generate(prompt_lookup_num_tokens=...)` because
the built-in backend decodes many sequences in one batch with its own KV cache and prefix reuse, which
`generate` does not do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_NGRAM = 3  # the longest tail that is looked up; shorter ones are tried when it is not found
MIN_NGRAM = 1


def propose(context: list[int], k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of `context`'s longest matching tail (none: [])."""
    if k <= 0 or len(context) < 2:
        return []
    ids = np.asarray(context, dtype=np.int64)
    end = len(ids)
    for n in range(min(max_ngram, end - 1), min_ngram - 1, -1):
        tail = ids[end - n :]
        # starts of earlier windows of length n equal to the tail (the tail itself excluded)
        starts = np.nonzero(ids[: end - n] == tail[0])[0]
        for j in range(1, n):
            if not len(starts):
                break
            starts = starts[ids[starts + j] == tail[j]]
        if len(starts):
            follow = int(starts[-1]) + n
            return ids[follow : follow + k].tolist()
    return []


def accept(logits: Any, drafts: list[int], temperature: float, generator: Any, greedy_below: float) -> tuple[list[float], int | None]:
    """Verify `drafts` against `logits` [len(drafts) + 1, vocab] (row j: the distribution of draft j).

    Returns the logprobs of the accepted drafts (a prefix of `drafts`) and the rejected draft, if one
    was (the next token is then sampled without it).
    """
    import torch

    kept: list[float] = []
    greedy = temperature < greedy_below
    for j, draft in enumerate(drafts):
        row = logits[j]
        if greedy and int(torch.argmax(row)) != draft:
            return kept, draft
        logp = torch.log_softmax(row if greedy else row / temperature, dim=-1)
        if not greedy and float(torch.rand(1, generator=generator)) >= float(logp[draft].exp()):
            return kept, draft
        kept.append(float(logp[draft]))
    return kept, None
