"""How an eval stage should spend its rollouts (tasks × samples) for the narrowest paired GRPO − SFT interval.

    .venv/bin/python benchmarks/eval_design.py [BASELINES_DIR] [--budget 100]

The paired gain is the mean over n tasks of d_i, GRPO's pass rate on task i minus SFT's, each a mean of k
samples. d_i is the task's own change plus sampling noise, so Var(gain) = (σ²_task + σ²_1 / k) / n, where σ²_task
is how much the true change varies between tasks and σ²_1 the noise of one sample of each stage. Both are
estimated (method of moments) from every learning_curve-*.json in BASELINES_DIR whose SFT and GRPO stages scored
eval-phrasing with one k ≥ 2 (at one sample a task noise and spread cannot be told apart): within a task the
unbiased noise of d_i is Σ p̂(1 − p̂)/(k − 1) over the two stages, and σ²_task is what the spread of d_i leaves
after it. Prints the two, the predicted 95% half-width of designs with the same rollouts per stage (the budget)
and with twice as many, each as a ratio to 25 × 4 (the plan's until 2026-12-07), and a check of the model
against the replicates (replicate-p005-p009-*.json: 25 fresh tasks pooled with the run's own 25, their bootstrap
interval against the prediction for 50 × 4).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forgetui.learning import per_task_counts  # noqa: E402
from forgetui.learning_report import paired_gain  # noqa: E402

SPLIT = "eval-phrasing"
BASELINE = (25, 4)  # the plan's eval until 2026-12-07: 5 tasks a family × 5 families, 4 samples each (since: 100 × 1)


def stage_tasks(result: dict[str, Any], stage: str) -> dict[str, tuple[int, int]] | None:
    """{task: (passed, samples)} of a stage's eval-phrasing score, or None when the run recorded none per task (an
    older result's counts live only in its run's store, which this machine may not hold)."""
    for entry in result.get("stages", []):
        if isinstance(entry, dict) and entry.get("stage") == stage:
            split = entry.get("splits", {}).get(SPLIT, {})
            return per_task_counts(split) if split.get("per_task") else None
    return None


def components(sft: dict[str, tuple[int, int]], grpo: dict[str, tuple[int, int]]) -> tuple[float, float] | None:
    """(σ²_task, σ²_1) of one run's paired tasks; None unless every task has the same k ≥ 2 in both stages."""
    tasks = sorted(set(sft) & set(grpo))
    ks = {sft[t][1] for t in tasks} | {grpo[t][1] for t in tasks}
    if len(tasks) < 2 or len(ks) != 1 or (k := ks.pop()) < 2:
        return None
    diffs = [grpo[t][0] / k - sft[t][0] / k for t in tasks]
    noise = statistics.fmean(sum(p / k * (1 - p / k) / (k - 1) for p in (sft[t][0], grpo[t][0])) for t in tasks)
    return max(statistics.variance(diffs) - noise, 0.0), noise * k


def half_width(task_var: float, one_var: float, n: int, k: int) -> float:
    """The predicted 95% half-width of the paired gain over n tasks of k samples each."""
    return 1.96 * math.sqrt((task_var + one_var / k) / n)


def designs(budget: int) -> list[tuple[int, int]]:
    """Tasks × samples that spend `budget` rollouts and `2 · budget`, each with n a multiple of 5 (one per family)."""
    out = []
    for spend in (budget, 2 * budget):
        out += [(spend // k, k) for k in (8, 4, 2, 1) if spend % k == 0 and (spend // k) % 5 == 0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baselines", type=Path, nargs="?", default=Path(__file__).parent / "baselines")
    parser.add_argument("--budget", type=int, default=BASELINE[0] * BASELINE[1], help="rollouts per eval stage (default 100)")
    args = parser.parse_args()
    runs: dict[str, tuple[float, float]] = {}
    for path in sorted(args.baselines.glob("learning_curve-*.json")):
        result = json.loads(path.read_text())
        sft, grpo = stage_tasks(result, "sft"), stage_tasks(result, "grpo")
        found = components(sft, grpo) if sft and grpo else None
        if found is not None:
            runs[path.stem.removeprefix("learning_curve-")] = found
    if not runs:
        print(f"no learning_curve-*.json in {args.baselines} with SFT and GRPO scored on {SPLIT}")
        return 1
    task_var = statistics.fmean(v[0] for v in runs.values())
    one_var = statistics.fmean(v[1] for v in runs.values())
    print(f"{len(runs)} runs: σ²_task = {task_var:.4f} (the true change varies between tasks), σ²_1 = {one_var:.4f} (one sample's noise,"
          f" both stages): at k = {BASELINE[1]} the noise is {one_var / BASELINE[1] / (task_var + one_var / BASELINE[1]):.0%} of a task's variance")
    base = half_width(task_var, one_var, *BASELINE)
    print(f"{'tasks × samples':>16} {'rollouts':>9} {'half-width':>11} {'vs 25 × 4':>10}")
    for n, k in designs(args.budget):
        width = half_width(task_var, one_var, n, k)
        print(f"{f'{n} × {k}':>16} {n * k:>9} {width:>11.3f} {width / base:>9.2f}x")
    observed = []
    for path in sorted(args.baselines.glob("replicate-p005-p009-*.json")):
        name = path.stem.removeprefix("replicate-p005-p009-")
        original = args.baselines / f"learning_curve-{name}.json"
        if not original.exists():
            continue
        result, fresh = json.loads(original.read_text()), json.loads(path.read_text())
        sft, grpo = dict(stage_tasks(result, "sft") or {}), dict(stage_tasks(result, "grpo") or {})
        sft.update(per_task_counts(fresh["sft"]["result"]))
        grpo.update(per_task_counts(fresh["grpo"]["result"]))
        pooled = paired_gain(sft, grpo)
        observed.append((pooled["ci"][1] - pooled["ci"][0]) / 2)
        print(f"replicate {name}: {pooled['tasks']} tasks, gain {pooled['gain']:+.3f}, half-width {observed[-1]:.3f}")
    if observed:
        print(f"model check: the replicates' mean half-width {statistics.fmean(observed):.3f} against {half_width(task_var, one_var, 50, 4):.3f}"
              " predicted for 50 × 4")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
