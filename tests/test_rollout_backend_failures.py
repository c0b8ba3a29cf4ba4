"""A model backend that fails a rollout's calls: the rollout is an infra error, never scored as the policy's failure."""

from __future__ import annotations

import asyncio
import socket

import pytest

from core.run import execute_run
from tests.test_train_loop import coin_config, rows

pytestmark = pytest.mark.docker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rollouts_whose_backend_is_unreachable_are_infra_errors_outside_the_score(docker_client, base_image) -> None:
    """Every call fails (nothing listens on the upstream's port): each rollout is retried, then an infra error naming the
    backend's failure; none counts as failed, and every failed call is still recorded."""
    port = free_port()
    config = coin_config(**{"policy.backend": f"litellm:openai/fake?api_base=http://127.0.0.1:{port}/v1", "policy.tokenizer": "tiny",
                            "train.steps": 0, "run.n_samples": 2, "run.concurrency": 2, "run.max_retries": 1})
    summary = asyncio.run(execute_run(config))
    assert (summary.rollouts, summary.infra_errors, summary.passed, summary.failed) == (2, 2, 0, 0)
    got = rows(summary.store, "SELECT status, attempt, passed, error FROM rollouts")
    assert all(status == "infra_error" and attempt == 1 and passed is None for status, attempt, passed, _ in got), got
    assert all("the model backend failed 1 of this rollout's calls" in error and "cannot reach" in error for *_, error in got), got
    calls = rows(summary.store, "SELECT status, error FROM calls")
    assert len(calls) == 4 and all(status == "error" and "cannot reach" in error for status, error in calls)  # 2 rollouts x 2 attempts
