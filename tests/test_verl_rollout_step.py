"""A veRL run's rollouts and its train_steps rows number the steps alike: from 0, the first training step 0."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("verl")

from core.train.verl import agent_loop  # noqa: E402 - after the skip
from core.train.verl.agent_loop import ForgetuiAgentLoop, rollout_step  # noqa: E402
from core.train.verl.metrics_sink import step_row  # noqa: E402


def test_a_rollout_has_the_step_of_the_train_steps_row_it_feeds() -> None:
    # veRL's trainer: global_steps = 0, += 1 before the first step; that value goes to the step's rollouts
    # (the V1 batch's `global_steps`) and into its metrics as training/global_step
    for global_steps in (1, 2, 7):
        row_step = step_row("run", {"step": global_steps, "data": {"training/global_step": global_steps}})["step"]
        assert rollout_step({"global_steps": np.int64(global_steps)}) == row_step == global_steps - 1
    assert rollout_step({"global_steps": 0}) == 0  # validation before training
    assert rollout_step({}) == 0  # veRL's legacy path keeps the step in meta_info


class _Started(Exception):
    """Raised by the fake worker with the step the agent loop gave the rollout."""


def test_the_agent_loop_starts_the_rollout_at_that_step(monkeypatch) -> None:
    class Worker:
        def find_task(self, task_id: str, env: str | None, options: dict) -> SimpleNamespace:
            return SimpleNamespace(id=task_id)

        async def run_task(self, task: SimpleNamespace, *, step: int, sample_index: int, sampling_params: dict) -> None:
            raise _Started(step, sample_index)

    async def worker_run(*args: object, **kwargs: object) -> Worker:
        return Worker()

    monkeypatch.setattr(agent_loop, "worker_run", worker_run)
    loop = object.__new__(ForgetuiAgentLoop)  # no veRL config needed before the rollout starts
    loop.server_manager = loop.tokenizer = loop.forgetui_config = loop.run_id = None
    loop.context_length = 64
    row = {"extra_info": {"task_id": "hello", "env": "toy"}, "global_steps": np.int64(3), "session_id": 5}
    with pytest.raises(_Started) as started:
        asyncio.run(loop.run({}, **row))
    assert started.value.args == (2, 5)  # veRL's third step is forgetui's step 2
