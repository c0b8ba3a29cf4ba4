"""The unit of training data: one sample per rollout branch."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from core.chat import ImagePart


@dataclass
class Sample:
    """Merged calls of one rollout branch: tokens, loss mask (1 = sampled by the model), aligned logprobs."""

    sample_id: str
    run_id: str
    rollout_id: str
    task_id: str
    branch: int
    step: int
    # lists, or numpy arrays (int32, int32, float64) as `samples_for_run` builds them
    token_ids: list[int] | np.ndarray
    loss_mask: list[int] | np.ndarray
    logprobs: list[float] | np.ndarray  # 0.0 where loss_mask is 0
    prompt_tokens: int  # tokens before the first sampled token
    call_ids: list[str] = field(default_factory=list)
    completion_starts: list[int] = field(default_factory=list)
    completion_ends: list[int] = field(default_factory=list)
    weights_version: int | None = None
    reward: float = 0.0
    advantage: float = 0.0
    # per call, what its completion tokens' advantage is multiplied by (`discount_calls`); empty: 1 for every call
    call_weights: list[float] = field(default_factory=list)
    # a vision-language sample's images in prompt order, bytes loaded (`core.train.vision.sample_images`);
    # not a column: `blobs` holds them, the recorded requests name them
    images: list[ImagePart] = field(default_factory=list, repr=False)

    @property
    def n_calls(self) -> int:
        return len(self.call_ids)

    @property
    def trainable_tokens(self) -> int:
        return int(np.count_nonzero(np.asarray(self.loss_mask)))

    def row(self) -> dict[str, Any]:
        """The `samples` row."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("images", "call_weights")}, "n_calls": self.n_calls}
