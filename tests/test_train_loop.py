"""The local trainer end to end: rollouts in Docker through the real proxy and store, samples, GRPO steps, new weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest

from core.config import RunConfig, load_config
from core.errors import ConfigError
from core.run import execute_run

pytestmark = pytest.mark.docker


def coin_config(**overrides) -> RunConfig:
    """The `hello` task under CoinHarness: one tiny-model call per rollout, reward 1 for half the answers."""
    sets = {
        "env.name": "toy", "env.tasks": "hello", "harness.name": "tests.harness_fixtures:CoinHarness",
        "policy.backend": "builtin:tiny", "runtime.kind": "docker", "run.n_samples": 12, "run.concurrency": 6,
        "run.timeout_s": 120, "train.steps": 2, "train.lr": 1e-3, "train.save_every": 1, "train.seed": 0,
    }
    sets.update(overrides)
    return load_config(None, [f"{k}={v}" if not isinstance(v, str) else f'{k}="{v}"' for k, v in sets.items()])


def rows(store: str, sql: str) -> list[tuple]:
    with duckdb.connect(store, read_only=True) as con:
        return con.execute(sql).fetchall()


def sequence_logprobs(model: str | Path, samples) -> list[float]:
    """Summed logprob of each sample's sampled tokens under `model`."""
    from core.train.local import LocalTrainer

    trainer = LocalTrainer(model)
    return [sum(lp for lp, m in zip(lps, s.loss_mask, strict=True) if m) for lps, s in zip(trainer.logprobs(samples), samples, strict=True)]


def test_grpo_steps_through_the_proxy_raise_rewarded_completions(docker_client, base_image) -> None:
    from core.train.samples import samples_for_run

    summary = asyncio.run(execute_run(coin_config()))
    store = summary.store
    assert summary.rollouts == 24 and summary.infra_errors == 0

    # every call records the weights that sampled it: step 0 the loaded ones, step 1 those after one update
    versions = dict(rows(store, "SELECT r.step, list(DISTINCT c.weights_version) FROM calls c JOIN rollouts r USING (rollout_id) GROUP BY 1"))
    assert versions == {0: [0], 1: [1]}
    (n_ids,) = rows(store, "SELECT count(DISTINCT rollout_id) FROM rollouts")[0]
    assert n_ids == 24  # ids unique across steps

    steps = rows(store, "SELECT step, loss, reward_mean, metrics->>'logprob_diff_max', CAST(metrics->>'samples_trained' AS INT), "
                        "CAST(metrics->>'zero_variance_groups' AS INT) FROM train_steps ORDER BY step")
    assert [s[0] for s in steps] == [0, 1]
    for step, _loss, reward_mean, diff_max, trained, flat in steps:
        assert float(diff_max) <= 1e-3, f"step {step}: recorded and recomputed logprobs disagree by {diff_max}"
        assert 0.0 < reward_mean < 1.0 and trained == 12 and flat == 0  # 12 coin flips are never all equal here

    # the samples table holds what the trainer used: advantages of both signs, one sample per rollout
    stored = rows(store, "SELECT step, count(*), sum(CASE WHEN advantage > 0 THEN 1 ELSE 0 END), sum(CASE WHEN advantage < 0 THEN 1 ELSE 0 END) "
                         "FROM samples GROUP BY step ORDER BY step")
    assert [(s, n) for s, n, _, _ in stored] == [(0, 12), (1, 12)] and all(pos and neg for _, _, pos, neg in stored)

    # the learning signal's sign: after step 0's update, its rewarded answers are likelier and the others less likely
    con = duckdb.connect(store, read_only=True)
    samples = samples_for_run(con, summary.run_id, step=0)
    con.close()
    run_dir = Path(store).parent
    before = sequence_logprobs("tiny", samples)
    after = sequence_logprobs(run_dir / "checkpoints" / "step-00000", samples)
    up = [a - b for a, b, s in zip(after, before, samples, strict=True) if s.reward > 0]
    down = [a - b for a, b, s in zip(after, before, samples, strict=True) if s.reward == 0]
    assert sum(up) / len(up) > 0 > sum(down) / len(down)

    assert (run_dir / "checkpoints" / "step-00001" / "config.json").exists()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy.backend": "litellm:gpt-4o"}, "passthrough"),
        ({"train.trainer": "verl"}, "GPU"),
        ({"env.tasks": "*", "env.options.split": "eval", "harness.name": "react"}, "eval split"),
    ],
)
def test_untrainable_configs_fail_before_any_rollout(overrides, message, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        asyncio.run(execute_run(coin_config(**overrides)))
    stores = list(tmp_path.glob("runs/*/store.duckdb"))
    assert all(rows(str(s), "SELECT count(*) FROM rollouts") == [(0,)] for s in stores)


def test_resume_of_a_missing_run_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="no run"):
        asyncio.run(execute_run(coin_config(), resume="20990101-000000-dead"))
