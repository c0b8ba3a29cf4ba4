"""Choosing a token: the argmax of the logits plus noise drawn for that position of the answer (the Gumbel-max trick).

argmax(logits / T + g) with g i.i.d. Gumbel(0, 1) is distributed exactly as softmax(logits / T), so
this is plain temperature sampling (and top-p, over the nucleus). What the trick buys: a request's
seeded generator draws one noise vector per answer position, in order, whatever else happens, so
the token at a position is a function of the logits there and the seed alone. Speculative decoding
(`core.backends.speculation`) verifies a draft by asking whether the sampler itself would have
chosen it, and emits exactly the answer it would have emitted without drafts: the same tokens for
the same seed, with or without speculation, alone or batched, however many drafts each step tried.
"""

from __future__ import annotations

from collections import deque
from typing import Any

GREEDY_BELOW = 1e-5  # temperatures under this decode greedily (argmax, logprobs at T = 1)


class PositionNoise:
    """A request's Gumbel noise, one vector per answer position, drawn from its seeded generator in order."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self._ahead: deque[Any] = deque()  # drawn for the next positions (index 0: the next token's)

    def at(self, offset: int, vocab: int) -> Any:
        """The noise of the position `offset` past the next one (drawn now if it was not yet)."""
        import torch

        while len(self._ahead) <= offset:
            exponential = torch.empty(vocab, dtype=torch.float32).exponential_(generator=self.generator)
            self._ahead.append(-torch.log(exponential))  # −log Exp(1) is Gumbel(0, 1)
        return self._ahead[offset]

    def advance(self) -> None:
        """The next position's token was emitted: its noise is spent."""
        if self._ahead:  # (a greedy request never draws any)
            self._ahead.popleft()


def nucleus(probs: Any, top_p: float) -> Any:
    """The bool mask of the smallest set of most likely tokens whose probability reaches `top_p`."""
    import torch

    sorted_p, order = torch.sort(probs, descending=True)
    keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p
    keep[0] = True
    mask = torch.zeros_like(probs, dtype=torch.bool)
    mask[order[keep]] = True
    return mask


def pick(logits: Any, temperature: float, top_p: float, noise: Any, banned: Any = None) -> tuple[int, float]:
    """The token at a position and its logprob (log_softmax(logits / T) before top-p; greedy: T = 1, `noise` unused).

    `banned` (a LongTensor of ids) are never taken, like tokens outside the nucleus: the logprob stays the
    model's own, so the trainer's recomputation agrees without knowing the ban.
    """
    import torch

    if temperature < GREEDY_BELOW:
        candidates = logits if banned is None else logits.index_fill(-1, banned, float("-inf"))
        token = int(torch.argmax(candidates))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    scaled = logits / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    if top_p < 1.0:
        scaled = scaled.masked_fill(~nucleus(logp.exp(), top_p), float("-inf"))
    if banned is not None:
        scaled = scaled.index_fill(-1, banned, float("-inf"))
    token = int(torch.argmax(scaled + noise))
    return token, float(logp[token])
