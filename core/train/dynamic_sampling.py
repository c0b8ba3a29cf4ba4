"""Dynamic sampling (DAPO): how many more tasks a GRPO step runs so that enough of its groups carry signal.

A group whose rollouts all scored alike has advantage 0 and no gradient. DAPO keeps sampling until the
step holds as many groups with signal as its batch has tasks; each refill here is sized by the share
of groups that had signal so far (Laplace-smoothed, so a step with none yet still asks for a bounded
number), capped per refill, and the loop bounds the number of refills (`train.max_extra_batches`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.train.advantages import AdvantageStats


@dataclass(frozen=True)
class Refill:
    """What a step's groups so far say: groups with signal, groups scored, and the tasks the next refill should add."""

    informative: int
    scored: int
    tasks: int


def informative_groups(stats: AdvantageStats) -> int:
    """Groups whose rewards differ: the only ones that carry a gradient."""
    return stats.groups - stats.zero_variance_groups - stats.singleton_groups


def plan_refill(stats: AdvantageStats, target: int, cap: int) -> Refill:
    """The next refill's size: enough tasks to expect `target` groups with signal, at most `cap`; 0 once reached.

    The expected share of tasks whose group has signal is (informative + 1) / (scored + 2) over the
    groups of at least two rollouts so far: 2 of 6 asks for ⌈4 / 0.375⌉ = 11 more tasks, 5 of 6 for 2,
    0 of 6 for the cap.
    """
    if target < 1 or cap < 0:
        raise ValueError(f"target must be ≥ 1 and cap ≥ 0, not {target} and {cap}")
    informative = informative_groups(stats)
    scored = stats.groups - stats.singleton_groups
    shortfall = target - informative
    if shortfall <= 0 or cap == 0:
        return Refill(informative, scored, 0)
    share = (informative + 1) / (scored + 2)
    return Refill(informative, scored, min(cap, math.ceil(shortfall / share)))
