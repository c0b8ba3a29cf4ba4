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
    assert versions == {0: [0], 1: [1]}  # step 0's 12 coin flips are never all equal here, so it updated
    (n_ids,) = rows(store, "SELECT count(DISTINCT rollout_id) FROM rollouts")[0]
    assert n_ids == 24  # ids unique across steps

    steps = rows(store, "SELECT step, loss, reward_mean, metrics->>'logprob_diff_max', CAST(metrics->>'samples_trained' AS INT), "
                        "CAST(metrics->>'zero_variance_groups' AS INT) FROM train_steps ORDER BY step")
    assert [s[0] for s in steps] == [0, 1]
    for step, _loss, _reward_mean, diff_max, _trained, _flat in steps:
        assert float(diff_max) <= 1e-3, f"step {step}: recorded and recomputed logprobs disagree by {diff_max}"
    _, _, reward_mean, _, trained, flat = steps[0]
    assert 0.0 < reward_mean < 1.0 and trained == 12 and flat == 0
    # the sampler's share of each step: answer tokens decoded, drafts verified and accepted among them
    sampler = rows(store, "SELECT CAST(metrics->>'decode_tokens' AS INT), CAST(metrics->>'drafted_tokens' AS INT), "
                          "CAST(metrics->>'accepted_tokens' AS INT) FROM train_steps ORDER BY step")
    assert all(decoded >= 12 and 0 <= accepted <= drafted and accepted <= decoded for decoded, drafted, accepted in sampler)

    # the samples table holds what the trainer used: advantages of both signs, one sample per rollout
    stored = rows(store, "SELECT step, count(*), sum(CASE WHEN advantage > 0 THEN 1 ELSE 0 END), sum(CASE WHEN advantage < 0 THEN 1 ELSE 0 END) "
                         "FROM samples GROUP BY step ORDER BY step")
    assert [(s, n) for s, n, _, _ in stored] == [(0, 12), (1, 12)] and stored[0][2] and stored[0][3]

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
    # only the newest checkpoint keeps the optimizer state a resume needs (train.keep_states = 1); step 0 kept its weights, read above
    from core.train.checkpoints import TRAINER_STATE, is_pruned

    assert [is_pruned(run_dir / "checkpoints" / s / TRAINER_STATE) for s in ("step-00000", "step-00001")] == [True, False]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"policy.backend": "litellm:gpt-4o"}, "passthrough"),
        ({"train.trainer": "verl"}, "GPU"),
        ({"env.tasks": "*", "env.options.split": "eval", "harness.name": "react"}, "eval split"),
        ({"env.tasks": "*", "env.options.split": "eval-phrasing", "harness.name": "react"}, "in the eval-phrasing split"),
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


def test_a_crash_mid_training_resumes_after_the_last_checkpoint(tmp_path, docker_client, base_image) -> None:
    """kill -9 during step 1; `--resume` finishes steps 1 and 2 and writes each row once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    home = tmp_path / "home"
    cfg = tmp_path / "train.toml"
    cfg.write_text(
        '[env]\nname = "toy"\ntasks = ["hello"]\n[harness]\nname = "tests.harness_fixtures:CoinHarness"\n'
        '[policy]\nbackend = "builtin:tiny"\n[runtime]\nkind = "docker"\n[run]\nn_samples = 6\nconcurrency = 3\ntimeout_s = 120\n'
        "[train]\nsteps = 3\nlr = 1e-3\nsave_every = 1\n"
    )
    env = {**os.environ, "FORGETUI_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "forgetui.cli", "run", str(cfg), "--no-ui"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 240
    while not list(home.glob("runs/*/checkpoints/step-00000/trainer_state.pt")):
        assert proc.poll() is None and time.monotonic() < deadline, "step 0 never finished"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (run_dir,) = home.glob("runs/*")
    resumed = subprocess.run([sys.executable, "-m", "forgetui.cli", "run", "--resume", run_dir.name, "--no-ui"], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    store = str(run_dir / "store.duckdb")
    assert rows(store, "SELECT step, count(*) FROM train_steps GROUP BY step ORDER BY step") == [(0, 1), (1, 1), (2, 1)]
    assert rows(store, "SELECT step, count(*) FROM samples GROUP BY step ORDER BY step") == [(0, 6), (1, 6), (2, 6)]
    assert rows(store, "SELECT count(*) FROM store_errors") == [(0,)]
    # every sample merges the calls of one attempt only: one call per rollout here
    assert rows(store, "SELECT max(n_calls) FROM samples") == [(1,)]
    versions = dict(rows(store, "SELECT r.step, list(DISTINCT c.weights_version ORDER BY c.weights_version) FROM calls c "
                                "JOIN rollouts r ON c.rollout_id = r.rollout_id AND c.attempt = r.attempt GROUP BY 1"))
    # each step samples with the weights after every earlier update (a step whose group was flat makes none)
    updated = [int(n) > 0 for (n,) in rows(store, "SELECT metrics->>'samples_trained' FROM train_steps ORDER BY step")]
    assert versions == {s: [sum(updated[:s])] for s in range(3)}
    assert (run_dir / "checkpoints" / "step-00002" / "trainer_state.pt").exists()


def test_dynamic_sampling_refills_a_flat_step_with_unused_tasks(docker_client, base_image) -> None:
    """write-file-000 always scores 0 under CoinHarness (a flat group): the step draws `hello`, whose coin flips differ."""
    config = coin_config(**{"env.tasks": "hello,write-file-000", "train.steps": 2, "train.tasks_per_step": 1,
                            "train.max_extra_batches": 2, "train.save_every": 0, "train.lr": 1e-5,
                            "train.shuffle": False})  # small steps: hello stays a coin flip
    summary = asyncio.run(execute_run(config))
    store = summary.store
    tasks_by_step = dict(rows(store, "SELECT step, list(DISTINCT task_id ORDER BY task_id) FROM rollouts GROUP BY step"))
    assert tasks_by_step == {0: ["hello"], 1: ["hello", "write-file-000"]}  # step 1's batch was write-file-000 alone
    extra = dict(rows(store, "SELECT step, CAST(metrics->>'extra_batches' AS INT) FROM train_steps"))
    assert extra == {0: 0, 1: 1}
    trained = dict(rows(store, "SELECT step, CAST(metrics->>'samples_trained' AS INT) FROM train_steps"))
    assert trained[1] == 12  # the refill's group trains; the flat one is stored with advantage 0
    assert rows(store, "SELECT count(*), max(abs(advantage)) FROM samples WHERE step = 1 AND task_id = 'write-file-000'") == [(12, 0.0)]
