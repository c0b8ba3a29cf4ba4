"""One outcome rule everywhere: the run summary, the eval report, the headless tally and the TUI count alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.eval.report import build_report
from core.eval.summary import summarize
from core.status import Outcome, Tally, outcome_of
from core.store.writer import Store

# (status, passed, reward): a harness that exited non-zero but left a passing workspace is passed
ROWS = [
    ("done", True, 1.0),
    ("failed", True, 1.0),
    ("failed", False, 0.0),
    ("done", False, 0.2),
    ("timeout", False, 0.0),
    ("infra_error", None, None),
    ("running", None, None),
]
EXPECTED = {"passed": 2, "below_threshold": 1, "harness_failed": 1, "timeout": 1, "infra_error": 1}


@pytest.mark.parametrize(
    ("status", "passed", "outcome"),
    [("done", True, Outcome.PASSED), ("failed", True, Outcome.PASSED), ("failed", False, Outcome.HARNESS_FAILED),
     ("done", False, Outcome.BELOW_THRESHOLD),
     ("timeout", True, Outcome.TIMEOUT), ("infra_error", True, Outcome.INFRA_ERROR), ("verifying", None, None), ("pending", None, None)],
)
def test_outcome_of(status, passed, outcome) -> None:
    assert outcome_of(status, passed) == outcome


def test_tally_counts_each_outcome_once() -> None:
    tally = Tally()
    for status, passed, _ in ROWS:
        tally.add(status, passed)
    assert tally.nonzero() == EXPECTED and tally.finished == 6 and tally.scored == 5 and tally.failed == 2


def test_summary_report_and_tui_agree(tmp_path: Path) -> None:
    from forgetui.tui.progress import RunProgress
    from forgetui.tui.rows import RolloutRow

    with Store.open(tmp_path / "s.duckdb") as store:
        for i, (status, passed, reward) in enumerate(ROWS):
            store.upsert_rollout({"rollout_id": f"r/t{i}/0", "run_id": "r", "task_id": f"t{i}", "env": "toy", "harness": "h",
                                  "status": status, "passed": passed, "reward": reward})
        summary = summarize(store, "r", tmp_path / "s.duckdb", [1])
    assert (summary.passed, summary.failed, summary.timeouts, summary.infra_errors) == (2, 2, 1, 1)
    # a partial score under the threshold and a crashed harness are reported apart
    assert (summary.below_threshold, summary.harness_failed) == (1, 1)
    assert summary.to_json()["below_threshold"] == 1 and summary.to_json()["harness_failed"] == 1
    assert summary.pass_at_k["1"] == pytest.approx(2 / 5)

    report = build_report([{"task_id": f"t{i}", "env": "toy", "harness": "h", "status": s, "passed": p, "reward": r, "meta": {}}
                           for i, (s, p, r) in enumerate(ROWS)], [1], model="m")
    (group,) = report["groups"]
    assert group["pass_at_k"]["1"] == pytest.approx(2 / 5) and group["unfinished"] == 1 and group["infra_errors"] == 1
    assert (group["below_threshold"], group["harness_failed"]) == (1, 1)

    progress = RunProgress()
    progress.apply_rows([RolloutRow(rollout_id=f"r/t{i}/0", run_id="r", task_id=f"t{i}", sample_index=0, status=s, reward=r, passed=p)
                         for i, (s, p, r) in enumerate(ROWS)])
    tally = progress.tally()
    assert (tally.passed, tally.failed, tally.timeout, tally.infra_error) == (2, 2, 1, 1)
    assert (tally.below_threshold, tally.harness_failed) == (1, 1)
