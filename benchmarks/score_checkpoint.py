"""Score checkpoints with an earlier learning run's plan and seed, paired against that run's SFT stage.

    .venv/bin/python benchmarks/score_checkpoint.py RESULT.json LABEL=CHECKPOINT [LABEL=CHECKPOINT ...] [--split eval-phrasing]

RESULT.json is a learning_curve.json. Each checkpoint runs that plan's eval (same tasks, same seeded draws, same
sampler; with `sampler = "vllm"` one server for all of them) and is printed with its pass rate, per-family counts and
its paired gain over the run's SFT. Used to compare a run's merged and unmerged GRPO checkpoints
(`checkpoints.grpo`, `checkpoints.grpo_unmerged`) on the same draws. Writes scores.json beside RESULT.json
(or into --out).
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


def parse(items: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path).is_dir():
            raise SystemExit(f"{item!r}: expected LABEL=CHECKPOINT_FOLDER with an existing folder")
        pairs.append((label, path))
    return pairs


def score(result: dict[str, Any], checkpoints: list[tuple[str, str]], split: str, out: Path) -> dict[str, Any]:
    from forgetui.learning import evaluate, per_task_counts, policy
    from forgetui.learning_report import paired_gain
    from forgetui.learning_sampler import SharedVllm

    plan, before = plan_of(result, split), sft_counts(result, split)
    out.mkdir(parents=True, exist_ok=True)
    scores: dict[str, Any] = {}
    if plan.sampler == "vllm":
        plan.shared = SharedVllm.for_model(plan.model, plan.server_options(), out / "vllm-server.log")
        plan.shared.start()
    try:
        for label, path in checkpoints:
            r = evaluate(plan, policy(plan, path), label)["splits"][split]
            scores[label] = {"checkpoint": path, "split": split, "result": r, "vs_sft": paired_gain(before, per_task_counts(r))}
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
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    score(result, parse(args.checkpoints), args.split, args.out or args.result.parent)


if __name__ == "__main__":
    main()
