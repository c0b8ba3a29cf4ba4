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


def test_new_tasks_score_the_next_tasks_of_each_family_paired_against_the_scored_sft(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--new-tasks K: the K tasks a family after the plan's eval_n (never scored by the run), SFT scored first and the
    baseline of the others, since the run's own SFT stage never saw those tasks."""
    import forgetui.learning as learning

    plan = Plan(seed=1, eval_n=2, families="rename,write-file")
    result = {"plan": plan.describe(), "stages": [{"stage": "sft", "splits": {"eval-phrasing": split_result(per_task([4, 4]), "s")}}]}
    folders = {name: tmp_path / name for name in ("sft", "grpo")}
    for folder in folders.values():
        folder.mkdir()
    seen = []

    def fake_evaluate(p, backend, label, report=print, events=None, wording="templates"):
        seen.append((label, p.eval_n, list(p.eval_tasks)))
        rates = [1, 1, 1, 1] if label == "sft" else [3, 1, 1, 1]
        return {"splits": {"eval-phrasing": split_result(per_task(rates), "r")}}

    monkeypatch.setattr(learning, "evaluate", fake_evaluate)
    given = score_checkpoint.parse([f"grpo={folders['grpo']}", f"sft={folders['sft']}"])
    scores = score_checkpoint.score(result, given, "eval-phrasing", tmp_path, extra=2)
    fresh = ["rename-p002", "rename-p003", "write-file-p002", "write-file-p003"]
    assert [(label, n, sorted(tasks)) for label, n, tasks in seen] == [("sft", 4, fresh), ("grpo", 4, fresh)]
    assert scores["sft"]["vs_sft"]["gain"] == 0.0  # against itself, not against the run's 4-of-4 SFT stage
    assert (scores["grpo"]["vs_sft"]["gain"], scores["grpo"]["vs_sft"]["up"]) == (0.125, 1)
    with pytest.raises(SystemExit, match="give its checkpoint as sft=FOLDER"):
        score_checkpoint.score(result, [("grpo", str(folders["grpo"]))], "eval-phrasing", tmp_path, extra=2)


def test_a_negative_new_tasks_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr("sys.argv", ["score_checkpoint.py", str(tmp_path / "missing.json"), f"sft={tmp_path}", "--new-tasks", "-1"])
    with pytest.raises(SystemExit) as exit_:
        score_checkpoint.main()
    assert exit_.value.code == 2 and "--new-tasks -1: a number of tasks a family, 0 or more" in capsys.readouterr().err
