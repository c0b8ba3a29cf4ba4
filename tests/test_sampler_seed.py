"""run.seed seeds the sampler's draws: the same seed gives a rollout the same tokens, whatever order or batch it ran in."""

from __future__ import annotations

import asyncio

from core.proxy.sessions import SessionRegistry, draw_seed
from core.run import execute_run
from tests.test_train_loop import coin_config, rows


def test_a_rollouts_draws_are_named_by_its_run_seed_task_step_sample_and_attempt() -> None:
    key = ("hello", "0", "3", "0")
    first, again = SessionRegistry("r1", adhoc=False, seed=7), SessionRegistry("r2", adhoc=False, seed=7)
    a, b = first.register("ro-1", draw_key=key), again.register("ro-other", draw_key=key)
    assert a.seed == b.seed is not None and 0 <= a.seed < 2**63  # the rollout id and the run id do not enter it
    assert [a.call_seed(i) for i in range(3)] == [b.call_seed(i) for i in range(3)]
    assert len({a.call_seed(i) for i in range(3)}) == 3  # each call of a rollout draws its own
    others = {first.register("x", draw_key=other).seed for other in (("hello", "0", "4", "0"), ("hello", "1", "3", "0"),
                                                                     ("hello", "0", "3", "1"), ("hell", "0", "3", "0"))}
    assert len(others) == 4 and a.seed not in others
    assert SessionRegistry("r", adhoc=False, seed=8).register("y", draw_key=key).seed != a.seed
    unseeded = SessionRegistry("r", adhoc=False).register("z", draw_key=key)
    assert unseeded.seed is None and unseeded.call_seed(0) is None
    assert draw_seed(7, "a", "b") != draw_seed(7, "ab")  # keys are separated, not concatenated


def sampled(seed: int) -> dict[int, str]:
    """A run of 6 `hello` rollouts with the tiny model at temperature 1: each sample's completion tokens."""
    summary = asyncio.run(execute_run(coin_config(**{"train.steps": 0, "run.n_samples": 6, "run.concurrency": 6, "run.seed": seed})))
    got = rows(summary.store, "SELECT r.sample_index, c.completion_token_ids FROM calls c JOIN rollouts r USING (rollout_id)")
    assert len(got) == 6
    return dict(got)


def test_the_same_run_seed_samples_the_same_tokens_and_another_does_not(docker_client, base_image) -> None:
    first, again, other = sampled(11), sampled(11), sampled(12)
    assert first == again  # six rollouts in flight at once, batched as they came: the same tokens per sample
    assert len(set(first.values())) > 1  # the samples of one task still differ from each other
    assert first != other
