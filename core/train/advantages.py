"""Advantages for samples: veRL's outcome estimators over rollouts grouped by (step, task_id).

The unit of a group is the rollout, not the sample: a rollout's branch samples share one reward,
so each rollout is scored once (one row given to veRL's estimator) and its advantage is then
broadcast to all of its samples. A rollout split into three branches counts once in its group's
mean, not three times.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from core.errors import ConfigError, ForgetuiError
from core.train.types import Sample

log = logging.getLogger(__name__)

# our name → (veRL registry name, extra keyword arguments)
ESTIMATORS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo": ("grpo", {}),
    "dr_grpo": ("grpo", {"norm_adv_by_std_in_grpo": False}),
    "grpo_vectorized": ("grpo_vectorized", {}),
    "rloo": ("rloo", {}),
    "rloo_vectorized": ("rloo_vectorized", {}),
    "reinforce_plus_plus": ("reinforce_plus_plus", {}),
    "reinforce_plus_plus_baseline": ("reinforce_plus_plus_baseline", {}),
}
ALIASES = {"drgrpo": "dr_grpo", "dr.grpo": "dr_grpo", "rf++": "reinforce_plus_plus"}
_STD_AWARE = ("grpo", "grpo_vectorized")  # the veRL estimators that take norm_adv_by_std_in_grpo


@dataclass
class AdvantageStats:
    """What `compute_advantages` saw: counts of groups, rollouts and samples, and the reward spread."""

    estimator: str
    groups: int
    zero_variance_groups: int  # ≥ 2 rollouts, all with the same reward: advantage exactly 0
    singleton_groups: int  # one rollout: no baseline within the group
    rollouts: int
    samples: int
    mean_reward: float  # over rollouts (each counts once)
    std_reward: float  # population std over rollouts

    def as_dict(self) -> dict[str, Any]:
        """The stats as a flat dict (for metrics)."""
        return asdict(self)


@dataclass
class _Rollout:
    key: tuple[int, str]
    reward: float
    samples: list[Sample]


def _rollouts(samples: Sequence[Sample]) -> list[_Rollout]:
    """Samples grouped by rollout_id, in first-seen order; a rollout's samples must agree on reward, step and task."""
    by_id: dict[str, _Rollout] = {}
    for s in samples:
        r = by_id.get(s.rollout_id)
        if r is None:
            by_id[s.rollout_id] = _Rollout((s.step, s.task_id), float(s.reward), [s])
            continue
        if (s.step, s.task_id) != r.key:
            raise ForgetuiError(
                f"rollout {s.rollout_id}: sample {s.sample_id} has step/task {(s.step, s.task_id)}, "
                f"its other samples {r.key}; a rollout's samples must come from one step and task"
            )
        if not math.isclose(float(s.reward), r.reward, rel_tol=0.0, abs_tol=1e-9):
            raise ForgetuiError(
                f"rollout {s.rollout_id}: sample {s.sample_id} has reward {s.reward}, its other samples "
                f"{r.reward}; the reward belongs to the rollout, give every branch the same one"
            )
        r.samples.append(s)
    return list(by_id.values())


def resolve_estimator(estimator: str, norm_by_std: bool) -> tuple[str, dict[str, Any]]:
    """Our estimator name (and norm_by_std) → veRL's registry name and its keyword arguments."""
    name = ALIASES.get(estimator.lower(), estimator.lower())
    if name not in ESTIMATORS:
        raise ConfigError(
            f"advantage estimator {estimator!r} is not supported for outcome rewards; use one of {', '.join(ESTIMATORS)}"
        )
    verl_name, kwargs = ESTIMATORS[name]
    kwargs = dict(kwargs)
    if verl_name in _STD_AWARE and "norm_adv_by_std_in_grpo" not in kwargs:
        kwargs["norm_adv_by_std_in_grpo"] = norm_by_std
    elif not norm_by_std and verl_name not in _STD_AWARE:
        raise ConfigError(
            f"norm_by_std=False applies to grpo only (Dr.GRPO); {estimator!r} has no such switch"
        )
    return verl_name, kwargs


def _verl_advantages(
    verl_name: str,
    kwargs: dict[str, Any],
    rewards: list[float],
    index: list[int],
    epsilon: float,
    gamma: float,
) -> list[float]:
    """One scalar advantage per rollout from veRL's estimator (each rollout a one-token response)."""
    import numpy as np
    import torch
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    fn = get_adv_estimator_fn(verl_name)
    scores = torch.tensor(rewards, dtype=torch.float64).unsqueeze(-1)
    mask = torch.ones_like(scores)
    advantages, _ = fn(
        token_level_rewards=scores,
        response_mask=mask,
        index=np.array(index),
        epsilon=epsilon,
        config=AlgoConfig(gamma=gamma),
        **kwargs,
    )
    return [float(a) for a in advantages[:, 0]]


def compute_advantages(
    samples: Sequence[Sample],
    estimator: str = "grpo",
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
    gamma: float = 1.0,
    zero_equal_groups: bool = True,
) -> AdvantageStats:
    """Set `sample.advantage` in place (per rollout, broadcast to its branches); return what was seen.

    `estimator`: grpo (Dr.GRPO is grpo with ``norm_by_std=False``, or ``"dr_grpo"``), rloo,
    reinforce_plus_plus, reinforce_plus_plus_baseline and the vectorized variants, all looked up in
    veRL's registry. Groups are (step, task_id). With `zero_equal_groups` (default) a group of two or
    more rollouts that all scored the same gets advantage exactly 0 whatever the estimator: it says
    nothing about what to do differently, and a group-mean baseline computed in floating point can
    leave a residue that a std of 0 + epsilon blows up. (For reinforce_plus_plus, whose baseline is
    the whole batch, this is a deliberate departure; pass False to keep veRL's values.)
    """
    verl_name, kwargs = resolve_estimator(estimator, norm_by_std)
    rollouts = _rollouts(samples)
    stats = AdvantageStats(
        estimator=estimator,
        groups=0,
        zero_variance_groups=0,
        singleton_groups=0,
        rollouts=len(rollouts),
        samples=len(samples),
        mean_reward=0.0,
        std_reward=0.0,
    )
    if not rollouts:
        return stats
    group_ids: dict[tuple[int, str], int] = {}
    index = [group_ids.setdefault(r.key, len(group_ids)) for r in rollouts]
    rewards = [r.reward for r in rollouts]
    members: dict[int, list[float]] = {}
    for g, reward in zip(index, rewards, strict=True):
        members.setdefault(g, []).append(reward)
    flat = {g for g, rs in members.items() if len(rs) > 1 and max(rs) - min(rs) <= 0.0}
    advantages = _verl_advantages(verl_name, kwargs, rewards, index, epsilon, gamma)
    for r, g, adv in zip(rollouts, index, advantages, strict=True):
        value = 0.0 if (zero_equal_groups and g in flat) else adv
        for s in r.samples:
            s.advantage = value
    mean = sum(rewards) / len(rewards)
    stats.groups = len(members)
    stats.zero_variance_groups = len(flat)
    stats.singleton_groups = sum(1 for rs in members.values() if len(rs) == 1)
    stats.mean_reward = mean
    stats.std_reward = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
    log.debug("advantages (%s): %s", estimator, stats)
    return stats


def discount_calls(samples: Sequence[Sample], gamma: float) -> None:
    """Per-call credit (the OpenForgeRL paper's option): call t of a sample's T calls gets its advantage × γ^(T−1−t).

    The last call keeps the whole advantage, earlier ones less and less (γ < 1): the outcome is credited
    most to the calls nearest it. γ = 1 leaves every call the shared advantage (the default).
    """
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"call discount must be in (0, 1], not {gamma}")
    for s in samples:
        last = s.n_calls - 1
        s.call_weights = [] if gamma == 1.0 else [gamma ** (last - t) for t in range(s.n_calls)]
