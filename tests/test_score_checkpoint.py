"""benchmarks/score_checkpoint.py: checkpoints scored with an earlier run's plan, paired against its SFT stage."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from forgetui.learning import Plan, split_result

SPEC = importlib.util.spec_from_file_location("score_checkpoint", Path(__file__).resolve().parents[1] / "benchmarks" / "score_checkpoint.py")
assert SPEC and SPEC.loader
score_checkpoint = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(score_checkpoint)


def per_task(passed: list[int]) -> dict:
    return {f"t{i}": {"family": "rename", "passed": p, "scored": 4, "reward": 0.0} for i, p in enumerate(passed)}


def test_each_checkpoint_runs_the_results_plan_and_is_paired_against_its_sft(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import forgetui.learning as learning

    plan = Plan(seed=3, concurrency=32, grpo_merge=0.5)
    result = {"plan": {**plan.describe(), "an_old_field": 1},
              "stages": [{"stage": "sft", "splits": {"eval-phrasing": split_result(per_task([2, 2, 2, 2]), "s")}}]}
    merged, unmerged = tmp_path / "merged", tmp_path / "step-00011"
    merged.mkdir()
    unmerged.mkdir()
    seen = []

    def fake_evaluate(p, backend, label, report=print, events=None, wording="templates"):
        seen.append((label, backend, p.seed, p.concurrency, p.eval_splits))
        rates = [4, 4, 2, 2] if label == "merged" else [0, 2, 2, 2]
        return {"splits": {"eval-phrasing": split_result(per_task(rates), "r")}}

    monkeypatch.setattr(learning, "evaluate", fake_evaluate)
    scores = score_checkpoint.score(result, score_checkpoint.parse([f"merged={merged}", f"unmerged={unmerged}"]), "eval-phrasing", tmp_path)
    assert seen == [("merged", f"builtin:{merged}?max_batch=32", 3, 32, ("eval-phrasing",)),
                    ("unmerged", f"builtin:{unmerged}?max_batch=32", 3, 32, ("eval-phrasing",))]
    assert (scores["merged"]["vs_sft"]["gain"], scores["merged"]["vs_sft"]["up"]) == (0.25, 2)
    assert (scores["unmerged"]["vs_sft"]["gain"], scores["unmerged"]["vs_sft"]["down"]) == (-0.125, 1)
    assert json.loads((tmp_path / "scores.json").read_text())["merged"]["checkpoint"] == str(merged)


def test_a_missing_folder_or_a_result_without_sft_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="expected LABEL=CHECKPOINT_FOLDER"):
        score_checkpoint.parse([f"x={tmp_path / 'nope'}"])
    with pytest.raises(SystemExit, match="expected LABEL=CHECKPOINT_FOLDER"):
        score_checkpoint.parse([str(tmp_path)])
    with pytest.raises(SystemExit, match="no SFT stage on eval-phrasing"):
        score_checkpoint.sft_counts({"stages": [{"stage": "base", "splits": {}}]}, "eval-phrasing")
