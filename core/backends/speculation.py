"""Prompt-lookup speculative decoding for the built-in backend: draft tokens from the sequence itself, verified in one forward.

An agent's answer copies a great deal from what it was shown: file names and words of the task, the
JSON of the tool calls earlier in its history, its own repeated phrases. The draft for a row is what
followed the latest earlier occurrence of its last few tokens (prompt + answer so far), as in
transformers' `prompt_lookup_num_tokens` and vLLM's n-gram speculator. The model runs the sampled
token and the drafts in one forward (on a CPU a forward's cost is much of it reading the weights, so
a few more positions cost less than a forward of their own) and `accepted` keeps the drafts the model
would have produced.

Exact, and more than in distribution: a draft is accepted when the sampler would have chosen it at
that position (`core.backends.sampling`: the token at a position is a function of its logits and the
request's noise for that position), so an answer is the same tokens, with the same recorded logprobs,
as without speculation (greedy or sampled, any seed). Only the speed changes, so how many drafts a
step verifies is free to depend on the whole batch: `width` weighs each extra column's expected
accepted tokens against what it costs every row in the forward.

We write our own instead of calling transformers' `generate(prompt_lookup_num_tokens=...)` because
the built-in backend decodes many sequences in one batch with its own KV cache and prefix reuse, which
`generate` does not do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

MAX_NGRAM = 3  # the longest tail that is looked up; shorter ones are tried when it is not found
MIN_NGRAM = 1


def propose(context: list[int], k: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """`k` tokens that followed the latest earlier occurrence of `context`'s longest matching tail (none: []).

    Where that continuation reaches the end of `context`, it continues with its own drafts (period end − follow).
    """
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
            drafts = ids[follow : follow + k].tolist()
            # a continuation that runs into the end goes on with itself: a repeating stretch repeats on
            while len(drafts) < k:
                drafts.append(drafts[follow + len(drafts) - end])
            return drafts
    return []


def accepted(logits: Any, drafts: list[int], choose: Callable[[int, Any], tuple[int, float]]) -> list[float]:
    """The logprobs of the drafts the sampler itself chooses, up to the first it does not.

    `logits` [len(drafts) + 1, vocab]: row j is the distribution at draft j's position; `choose(j, row)`
    is the sampler's token and logprob there.
    """
    kept: list[float] = []
    for j, draft in enumerate(drafts):
        token, logprob = choose(j, logits[j])
        if token != draft:
            break
        kept.append(logprob)
    return kept


def width(drafts: list[list[int]], acceptance: list[float], fixed: float) -> int:
    """The decode forward's width (1 + drafts per row) that maximises expected tokens per unit of cost.

    A forward over rows × w positions costs `fixed` + rows × w (in positions: `fixed` is what reading
    the weights costs, counted in positions' worth of compute); row i with its drafts yields
    1 + Σ_{j ≤ min(w − 1, len)} a_i^j tokens where a_i is its acceptance rate per draft.
    """
    rows = len(drafts)
    best, best_rate, tokens = 1, rows / (fixed + rows), float(rows)
    for w in range(2, 1 + max((len(d) for d in drafts), default=0) + 1):
        tokens += sum(a ** (w - 1) for d, a in zip(drafts, acceptance, strict=True) if len(d) >= w - 1)
        rate = tokens / (fixed + rows * w)
        if rate > best_rate:
            best, best_rate = w, rate
    return best
