"""Samples of one rollout → the fields of veRL's `AgentLoopOutput`, one per branch (pure: no veRL import)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.train.types import Sample

log = logging.getLogger(__name__)


@dataclass
class Limits:
    """veRL's per-sample budget: rollout.prompt_length and rollout.response_length."""

    prompt_length: int
    response_length: int


def branch_fields(sample: Sample, limits: Limits, *, passed: bool | None = None) -> dict[str, Any]:
    """prompt = the branch's first prompt; response = the rest (mask 1 exactly on sampled tokens, logprobs aligned)."""
    cut = sample.prompt_tokens
    prompt, response = sample.token_ids[:cut], sample.token_ids[cut:]
    mask, logprobs = sample.loss_mask[cut:], sample.logprobs[cut:]
    if len(prompt) > limits.prompt_length:
        log.warning("sample %s: prompt of %d tokens > rollout.prompt_length=%d; left-truncated (raise prompt_length)", sample.sample_id, len(prompt), limits.prompt_length)
        prompt = prompt[-limits.prompt_length :]
    if len(response) > limits.response_length:
        log.warning(
            "sample %s: response of %d tokens > rollout.response_length=%d; cut (%d sampled tokens lost)",
            sample.sample_id, len(response), limits.response_length, sum(mask[limits.response_length :]),
        )
        response, mask, logprobs = (x[: limits.response_length] for x in (response, mask, logprobs))
    return {
        # plain Python numbers whether the sample holds lists or numpy arrays (`samples_for_run` builds arrays)
        "prompt_ids": np.asarray(prompt, dtype=np.int64).tolist(),
        "response_ids": np.asarray(response, dtype=np.int64).tolist(),
        "response_mask": np.asarray(mask, dtype=np.int64).tolist(),
        "response_logprobs": np.asarray(logprobs, dtype=np.float64).tolist(),
        "reward_score": float(sample.reward),
        "num_turns": 2 * sample.n_calls,  # each merged call: one prompt turn, one assistant turn
        "extra_fields": extra_fields(sample.rollout_id, sample.sample_id, sample.branch, sample.reward, passed),
    }


def placeholder_fields(prompt_ids: list[int], filler_id: int, reward: float, rollout_id: str, passed: bool | None) -> dict[str, Any]:
    """A rollout whose harness made no model call: one masked token, nothing to learn but its reward in the group."""
    return {
        "prompt_ids": list(prompt_ids),
        "response_ids": [int(filler_id)],
        "response_mask": [0],
        "response_logprobs": [0.0],
        "reward_score": float(reward),
        "num_turns": 1,
        "extra_fields": extra_fields(rollout_id, f"{rollout_id}#none", -1, reward, passed),
    }


def extra_fields(rollout_id: str, sample_id: str, branch: int, reward: float, passed: bool | None) -> dict[str, Any]:
    """The same keys for every output (veRL stacks them across a batch)."""
    return {
        "turn_scores": [],
        "tool_rewards": [],
        "reward_extra_info": {"passed": float(bool(passed)) if passed is not None else float(reward >= 1.0)},
        "forgetui_rollout_id": rollout_id,
        "forgetui_sample_id": sample_id,
        "forgetui_branch": int(branch),
    }


def pick_single(samples: list[Sample]) -> Sample:
    """For veRL's legacy path (one output per rollout): the branch with the most sampled tokens."""
    return max(samples, key=lambda s: (s.trainable_tokens, s.branch))
