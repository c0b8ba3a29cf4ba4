"""veRL's per-step metrics become `train_steps` rows: veRL's real `Tracking` (its `file` backend) → the launcher's sink → the store.

The metrics are the dicts veRL's trainer logs, computed by veRL's own functions on a CPU batch
(`compute_data_metrics`: critic/score/mean, ...; a vanilla policy loss reduced by `reduce_metrics`:
actor/pg_loss, ...; `training/global_step` as `fit` adds it). The launcher test runs veRL's
`Tracking` in a child process, as `verl.trainer.main_ppo` would, crashes it, and resumes it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import pytest

from core.train.verl.launch import logs_to_file
from core.train.verl.metrics_sink import FILE_LOGGER_ENV, MetricsSink, metrics_path, run_recording_metrics

pytest.importorskip("verl")

RUN_ID = "20990101-000000-verl"
# what veRL logs alone before training (and merges into a step's dict when it validates then)
VALIDATION = {"val-core/forgetui/toy/reward/mean@2": 0.5, "val-aux/num_turns/min": 2}

CHILD = """
import json, pathlib, sys, time
from verl.utils.tracking import Tracking

tracking = Tracking(project_name="forgetui", experiment_name=sys.argv[2], default_backend=["console", "file"])
for step, data in json.loads(sys.argv[1]):
    tracking.log(data=data, step=step)
deadline = time.monotonic() + 60
while not pathlib.Path(sys.argv[4]).exists() and time.monotonic() < deadline:  # until the launcher has the rows
    time.sleep(0.05)
tracking.finish()
sys.exit(int(sys.argv[3]))
"""


def verl_step_metrics(step: int, rewards: list[float]) -> dict:
    """What veRL's fit loop logs for one training step (a subset: data metrics, actor metrics, the step)."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_policy_loss_fn
    from verl.trainer.ppo.metric_utils import compute_data_metrics
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict
    from verl.workers.config.actor import FSDPActorConfig

    n, prompt, response = len(rewards), 3, 2
    scores = torch.zeros(n, response)
    scores[:, -1] = torch.tensor(rewards)
    mask = torch.ones(n, response)
    adv, returns = compute_grpo_outcome_advantage(scores, mask, np.array(["t"] * n, dtype=object))
    tensors = {
        "token_level_scores": scores,
        "token_level_rewards": scores,
        "advantages": adv,
        "returns": returns,
        "prompts": torch.ones(n, prompt, dtype=torch.long),
        "responses": torch.ones(n, response, dtype=torch.long),
        "response_mask": mask,
        "attention_mask": torch.ones(n, prompt + response),
    }
    metrics = compute_data_metrics(DataProto.from_dict(tensors=tensors), use_critic=False)
    actor = FSDPActorConfig(
        strategy="fsdp", rollout_n=n, ppo_mini_batch_size=n, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2
    )
    old = torch.full((n, response), -1.0)
    loss, pg = get_policy_loss_fn("vanilla")(
        old_log_prob=old,
        log_prob=old + 0.1,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode="token-mean",
        config=actor,
    )
    actor_metrics = {
        "actor/pg_loss": [float(loss)],
        "actor/kl_loss": [0.01 * step],
        "actor/grad_norm": [1.5],
        "actor/lr": [1e-6],
    }
    actor_metrics.update(
        rename_dict({k: [float(v)] for k, v in pg.items()}, "actor/")
    )  # as the trainer names them
    metrics.update(reduce_metrics(actor_metrics))
    metrics.update({"training/global_step": step, "training/epoch": 0})
    return {k: float(v) if hasattr(v, "item") else v for k, v in metrics.items()}


def store_rows(run_dir: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(run_dir / "store.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def steps_in(run_dir: Path) -> dict[int, tuple]:
    rows = store_rows(
        run_dir,
        f"SELECT step, loss, reward_mean, metrics FROM train_steps WHERE run_id = '{RUN_ID}' ORDER BY step",
    )
    assert len(rows) == len({r[0] for r in rows}), f"a step has several rows: {[r[0] for r in rows]}"
    return {step: (loss, reward, json.loads(metrics)) for step, loss, reward, metrics in rows}


@pytest.fixture
def run_dir(tmp_path) -> Path:
    folder = tmp_path / "runs" / RUN_ID
    (folder / "verl").mkdir(parents=True)  # `prepare` writes the plan there
    return folder


def test_verl_tracking_metrics_become_one_row_per_step_even_when_veRL_starts_its_file_anew(
    run_dir, monkeypatch
) -> None:
    from verl.utils.tracking import Tracking

    monkeypatch.setenv(FILE_LOGGER_ENV, str(metrics_path(run_dir)))
    sink = MetricsSink(RUN_ID, run_dir, {"train": {"steps": 4}})
    sink.begin()
    first = {s: verl_step_metrics(s, r) for s, r in ((1, [1, 0, 1, 1]), (2, [0, 0, 1, 0]), (3, [1, 1, 0, 1]))}
    tracking = Tracking(project_name="forgetui", experiment_name=RUN_ID, default_backend=["file"])
    tracking.log(data=VALIDATION, step=0)
    tracking.log(data=first[1], step=1)
    assert sink.poll() == 1
    for step in (2, 3):
        tracking.log(data=first[step], step=step)
    tracking.finish()
    assert sink.poll() == 2

    rows = steps_in(run_dir)
    # veRL's global steps 1..3, counted from 0; the validation record is no step
    assert sorted(rows) == [0, 1, 2]
    loss, reward, metrics = rows[0]
    assert reward == pytest.approx(0.75) == metrics["critic/score/mean"]
    assert loss == pytest.approx(first[1]["actor/pg_loss"]) and metrics["training/global_step"] == 1
    assert {
        "critic/advantages/mean",
        "response_length/mean",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
    } <= metrics.keys()
    # the local trainer's names too
    assert (metrics["kl"], metrics["grad_norm"], metrics["lr"]) == (0.01, 1.5, 1e-6)
    assert not any(k.startswith("val-") for k in metrics)

    # resumed from veRL's checkpoint of step 2: a new Tracking reopens the file and logs step 3 again
    tracking = Tracking(project_name="forgetui", experiment_name=RUN_ID, default_backend=["file"])
    tracking.log(data=VALIDATION, step=2)
    tracking.log(data=verl_step_metrics(3, [0, 0, 0, 0]), step=3)
    tracking.log(data=verl_step_metrics(4, [1, 1, 1, 0]), step=4)
    tracking.finish()
    sink.end("done")
    rows = steps_in(run_dir)
    assert sorted(rows) == [0, 1, 2, 3]
    # step 2 kept its first row
    assert rows[2][1] == pytest.approx(0.75) and rows[3][1] == pytest.approx(0.75)
    assert store_rows(run_dir, "SELECT run_id, status FROM runs") == [(RUN_ID, "done")]

    from core.train.tracking import train_step_rows

    with duckdb.connect(str(run_dir / "store.duckdb"), read_only=True) as con:
        curve = train_step_rows(con, RUN_ID)
    assert [r["step"] for r in curve] == [0, 1, 2, 3] and curve[1]["reward_mean"] == pytest.approx(0.25)


def test_launcher_records_veRL_steps_while_it_runs_and_across_a_crash_and_resume(run_dir) -> None:
    """Two launches of a child running veRL's Tracking: the first dies after step 3 (checkpoint at 2), the second redoes 3."""

    class Sink(MetricsSink):
        """Tells the child (through a file) when its steps are in the store, so it ends only after that."""

        expected = 0

        def poll(self, status: str | None = None) -> int:
            new = super().poll(status)
            if status is None and self.written >= self.expected:  # a poll while veRL runs
                marker.touch()
            return new

    marker = run_dir / "rows-seen"

    def launch(records: list[tuple[int, dict]], exit_code: int, expected: int) -> int:
        marker.unlink(missing_ok=True)
        sink = Sink(RUN_ID, run_dir, {"train": {"steps": 4}, "env": {"name": "toy"}})
        sink.expected = expected
        env = {"PATH": "/usr/bin:/bin", FILE_LOGGER_ENV: str(metrics_path(run_dir))}
        command = [sys.executable, "-c", CHILD, json.dumps(records), RUN_ID, str(exit_code), str(marker)]
        code = run_recording_metrics(command, env, sink, poll_s=0.2)
        assert marker.exists(), "the rows were not written while veRL ran"
        return code

    steps = {s: verl_step_metrics(s, [1, 0, 0, 0] if s < 3 else [1, 1, 0, 0]) for s in (1, 2, 3, 4)}
    assert (
        launch([(0, VALIDATION), (1, steps[1]), (2, steps[2]), (3, steps[3])], exit_code=1, expected=3) == 1
    )
    assert sorted(steps_in(run_dir)) == [0, 1, 2]
    assert store_rows(run_dir, "SELECT status FROM runs") == [("failed",)]

    resumed = {3: verl_step_metrics(3, [0, 0, 0, 0]), 4: steps[4]}
    assert launch([(2, VALIDATION), (3, resumed[3]), (4, resumed[4])], exit_code=0, expected=1) == 0
    rows = steps_in(run_dir)
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[2][1] == pytest.approx(0.5)  # the first launch's row of veRL step 3, not the redo's 0.0
    assert rows[3][2]["training/global_step"] == 4
    assert store_rows(run_dir, "SELECT status FROM runs") == [("done",)]
    assert list((run_dir / "verl").glob("metrics.*.jsonl")), "the first launch's file was overwritten"


def test_launch_overrides_turn_on_veRLs_file_logger(tmp_path, monkeypatch) -> None:
    from core.config import load_config
    from core.train.verl.launch import ClusterOptions, prepare

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    config = load_config(
        None, ['env.name="toy"', 'env.tasks="hello"', 'policy.backend="builtin:tiny"', "train.steps=2"]
    )
    plan = prepare(config, ClusterOptions(nnodes=1, n_gpus_per_node=1))
    values = dict(o.lstrip("+").split("=", 1) for o in plan.overrides)
    assert values[f"ray_kwargs.ray_init.runtime_env.env_vars.{FILE_LOGGER_ENV}"] == str(
        metrics_path(tmp_path / "runs" / plan.run_id)
    )
    assert logs_to_file(plan.overrides) and plan.config is config
    assert not logs_to_file([*plan.overrides, "trainer.logger=[console,wandb]"])
