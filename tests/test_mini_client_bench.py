"""benchmarks/mini_client.py: its eval stays the 25 tasks its help and recorded results state, whatever the plan's default."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("mini_client", Path(__file__).resolve().parents[1] / "benchmarks" / "mini_client.py")
assert SPEC is not None and SPEC.loader is not None
mini_client = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(mini_client)


def test_one_eval_is_25_tasks_of_the_given_samples_with_the_given_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from forgetui import learning

    seen = []

    def fake_evaluate(plan, backend, label):  # noqa: ANN001, ANN202
        seen.append((plan.eval_n * len(plan.families.split(",")), plan.eval_samples, plan.concurrency, learning.HARNESS_OPTIONS["mini-swe-agent"]["client"]))
        return {"splits": {"eval-phrasing": {"pass_rate": 0.25}}}

    monkeypatch.setattr(learning, "evaluate", fake_evaluate)
    monkeypatch.setitem(learning.HARNESS_OPTIONS, "mini-swe-agent", dict(learning.HARNESS_OPTIONS["mini-swe-agent"]))
    wall, _cpu, rate = mini_client.eval_once("requests", 2, 16, "builtin")
    assert seen == [(25, 2, 16, "requests")] and rate == 0.25 and wall >= 0
