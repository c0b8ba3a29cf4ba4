"""The unit of training data: one sample per rollout branch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Sample:
    """Merged calls of one rollout branch: tokens, loss mask (1 = sampled by the model), aligned logprobs."""

    sample_id: str
    run_id: str
    rollout_id: str
    task_id: str
    branch: int
    step: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]  # 0.0 where loss_mask is 0
    prompt_tokens: int  # tokens before the first sampled token
    call_ids: list[str] = field(default_factory=list)
    completion_starts: list[int] = field(default_factory=list)
    completion_ends: list[int] = field(default_factory=list)
    weights_version: int | None = None
    reward: float = 0.0
    advantage: float = 0.0

    @property
    def n_calls(self) -> int:
        return len(self.call_ids)

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    def row(self) -> dict[str, Any]:
        """The `samples` row."""
        return {**asdict(self), "n_calls": self.n_calls}
