"""Score checkpoints with an earlier learning run's plan and seed, paired against that run's SFT stage.

    .venv/bin/python benchmarks/score_checkpoint.py RESULT.json LABEL=CHECKPOINT [LABEL=CHECKPOINT ...] [--split eval-phrasing]

RESULT.json is a learning_curve.json. Each checkpoint runs that plan's eval (same tasks, same seeded draws, same
sampler; with `sampler = "vllm"` one server for all of them) and is printed with its pass rate, per-family counts and
its paired gain over the run's SFT. Used to compare a run's merged and unmerged GRPO checkpoints
(`checkpoints.grpo`, `checkpoints.grpo_unmerged`) on the same draws. Writes scores.json beside RESULT.json
(or into --out).

`--new-tasks K` scores K more tasks a family instead, the ones after the plan's `eval_n` that the run never scored
(a replicate of its eval on fresh tasks of the same split); the run's SFT stage did not score them, so the pairing
is against the checkpoint labelled `sft`, which must be among those given:

    .venv/bin/python benchmarks/score_checkpoint.py RESULT.json sft=SFT_CKPT grpo=GRPO_CKPT --new-tasks 5
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def plan_of(result: dict[str, Any], split: str) -> Any:
    """The learning plan `result` ran, evaluating `split` only (fields it predates keep the plan's defaults)."""
    from forgetui.learning import RUNTIME_FIELDS, Plan

    known = {f.name for f in fields(Plan)} - set(RUNTIME_FIELDS)
    values = {k: v for k, v in result["plan"].items() if k in known}
    return Plan(**{**values, "eval_splits": (split,)})


def sft_counts(result: dict[str, Any], split: str) -> dict[str, tuple[int, int]]:
    from forgetui.learning import per_task_counts

    stage = next((s for s in result["stages"] if s["stage"] == "sft"), None)
    if stage is None or split not in stage["splits"]:
        raise SystemExit(f"the result has no SFT stage on {split}: nothing to pair against")
    return per_task_counts(stage["splits"][split])


def new_tasks(plan: Any, extra: int) -> tuple[int, list[str]]:
    """(tasks a family to draw, ids to score): the `extra` tasks a family after the plan's first `eval_n` in its eval split."""
    from core.registry import load_env

    (split,) = plan.eval_splits
    drawn = load_env("toy", split=split, n=plan.eval_n + extra, families=plan.families).tasks()
    per_family: dict[str, list[str]] = {}
    for task in drawn:
        per_family.setdefault(task.meta.get("family", ""), []).append(task.id)
    return plan.eval_n + extra, [t for ids in per_family.values() for t in ids[plan.eval_n:]]


def parse(items: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path).is_dir():
            raise SystemExit(f"{item!r}: expected LABEL=CHECKPOINT_FOLDER with an existing folder")
        pairs.append((label, path))
    return pairs


def score(result: dict[str, Any], checkpoints: list[tuple[str, str]], split: str, out: Path, extra: int = 0) -> dict[str, Any]:
    from forgetui.learning import evaluate, per_task_counts, policy
    from forgetui.learning_report import paired_gain
    from forgetui.learning_sampler import SharedVllm

    plan = plan_of(result, split)
    if extra:
        if "sft" not in dict(checkpoints):
            raise SystemExit("--new-tasks: the run's SFT stage never scored those tasks; give its checkpoint as sft=FOLDER")
        plan.eval_n, plan.eval_tasks = new_tasks(plan, extra)
        checkpoints = sorted(checkpoints, key=lambda c: c[0] != "sft")  # SFT first: the others pair against it
        before = None
    else:
        before = sft_counts(result, split)
    out.mkdir(parents=True, exist_ok=True)
    scores: dict[str, Any] = {}
    if plan.sampler == "vllm":
        plan.shared = SharedVllm.for_model(plan.model, plan.server_options(), out / "vllm-server.log")
        plan.shared.start()
    try:
        for label, path in checkpoints:
            r = evaluate(plan, policy(plan, path), label)["splits"][split]
            if before is None:  # --new-tasks: the scored SFT checkpoint is the baseline
                before = per_task_counts(r)
            scores[label] = {"checkpoint": path, "split": split, "tasks": plan.eval_tasks, "result": r,
                             "vs_sft": paired_gain(before, per_task_counts(r))}
            g = scores[label]["vs_sft"]
            print(f"{label}: {r['pass_rate']:.3f} {r['by_family']}; − SFT {g['gain']:+.3f} [{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}] "
                  f"({g['up']} up, {g['down']} down)", flush=True)
            (out / "scores.json").write_text(json.dumps(scores, indent=2, default=str))
    finally:
        if plan.shared is not None:
            plan.shared.stop()
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("result", type=Path, help="a learning_curve.json")
    parser.add_argument("checkpoints", nargs="+", help="LABEL=CHECKPOINT_FOLDER")
    parser.add_argument("--split", default="eval-phrasing")
    parser.add_argument("--out", type=Path, default=None, help="where scores.json goes (default: beside RESULT.json)")
    parser.add_argument("--new-tasks", type=int, default=0, metavar="K",
                        help="score K more tasks a family, after the run's eval_n (paired against the checkpoint labelled sft)")
    args = parser.parse_args()
    if args.new_tasks < 0:
        parser.error(f"--new-tasks {args.new_tasks}: a number of tasks a family, 0 or more")
    result = json.loads(args.result.read_text())
    score(result, parse(args.checkpoints), args.split, args.out or args.result.parent, args.new_tasks)


if __name__ == "__main__":
    main()
