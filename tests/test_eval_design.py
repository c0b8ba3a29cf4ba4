"""benchmarks/eval_design.py: the variance components of the paired gain and the designs they predict."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("eval_design", ROOT / "benchmarks" / "eval_design.py")
assert SPEC is not None and SPEC.loader is not None
eval_design = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(eval_design)


def test_the_noise_is_taken_out_of_the_spread_of_the_task_gains() -> None:
    # both tasks gain 0.5 (no spread between tasks); each has one stage at p = 0.5 of 4 samples: noise 0.25 / 3
    sft = {"a": (2, 4), "b": (0, 4)}
    grpo = {"a": (4, 4), "b": (2, 4)}
    task_var, one_var = eval_design.components(sft, grpo)
    assert task_var == 0.0 and one_var == pytest.approx(4 * 0.25 / 3)
    # tasks that move apart: the spread is the task variance once the (zero) noise is out
    task_var, one_var = eval_design.components({"a": (0, 4), "b": (0, 4)}, {"a": (4, 4), "b": (0, 4)})
    assert (task_var, one_var) == (pytest.approx(0.5), 0.0)


def test_runs_it_cannot_read_give_nothing() -> None:
    assert eval_design.components({"a": (1, 4), "b": (1, 2)}, {"a": (2, 4), "b": (1, 2)}) is None  # two k
    assert eval_design.components({"a": (1, 1), "b": (0, 1)}, {"a": (1, 1), "b": (1, 1)}) is None  # k = 1: no noise estimate
    assert eval_design.stage_tasks({"stages": [{"stage": "sft", "splits": {"eval": {}}}]}, "sft") is None


def test_more_tasks_of_fewer_samples_narrow_the_interval_at_the_same_cost() -> None:
    assert eval_design.designs(100) == [(25, 4), (50, 2), (100, 1), (25, 8), (50, 4), (100, 2), (200, 1)]
    widths = [eval_design.half_width(0.04, 0.24, n, k) for n, k in ((25, 4), (50, 2), (100, 1))]
    assert widths == sorted(widths, reverse=True) and widths[0] == pytest.approx(1.96 * ((0.04 + 0.06) / 25) ** 0.5)
    assert eval_design.half_width(0.0, 0.24, 100, 1) == pytest.approx(eval_design.half_width(0.0, 0.24, 25, 4))  # noise alone: only rollouts count


def test_the_script_reads_a_folder_of_runs_and_checks_its_replicate(tmp_path: Path) -> None:
    def stage(name: str, per_task: dict[str, list[int]]) -> dict:
        return {"stage": name, "splits": {"eval-phrasing": {"per_task": per_task}}}

    sft = {f"t{i}": [i % 3, 4] for i in range(10)}
    grpo = {f"t{i}": [min(4, i % 3 + i % 2), 4] for i in range(10)}
    (tmp_path / "learning_curve-run.json").write_text(json.dumps({"stages": [stage("sft", sft), stage("grpo", grpo)]}))
    fresh = {f"u{i}": [1, 4] for i in range(10)}
    (tmp_path / "replicate-p005-p009-run.json").write_text(json.dumps({"sft": {"result": {"per_task": fresh}},
                                                                       "grpo": {"result": {"per_task": fresh}}}))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_design.py"), str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("1 runs:") and "100 × 1" in out and "1.00x" in out
    assert "replicate run: 20 tasks, gain +0.06" in out and "model check" in out
    empty = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eval_design.py"), str(tmp_path / "none")], capture_output=True, text=True)
    assert empty.returncode == 1 and "no learning_curve-*.json" in empty.stdout
