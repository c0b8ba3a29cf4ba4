"""A learning benchmark's eval stage at two decode widths: rollouts at concurrency N, a decode step of up to N rows.

    .venv/bin/python benchmarks/eval_width.py [--harness react] [--narrow 8] [--wide 32] [--rounds 1]

The base model (SmolLM2-135M) in the harness on the toy env's `eval-phrasing` split, 25 tasks × 4
samples, the learning benchmark's limits (96 tokens a call, 2 calls a rollout), each rollout in its
own Docker sandbox: once at --narrow concurrency with the backend's own 16-row batches, once at
--wide concurrency with --wide rows (`forgetui.learning.policy`), alternating --rounds times. On a
CPU a decode step reads every weight whatever its rows, so a wider step is nearly free: prints each
side's wall seconds and the ratio of the medians. Needs Docker and the base image.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def eval_seconds(harness: str, concurrency: int) -> float:
    """One base-model eval of the plan's `eval-phrasing` tasks at `concurrency`; wall seconds."""
    from forgetui.learning import Plan, evaluate, policy

    plan = Plan(harness=harness, eval_splits=("eval-phrasing",), concurrency=concurrency)
    started = time.monotonic()
    evaluate(plan, policy(plan, plan.model), f"base at {concurrency}")
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--harness", default="react")
    parser.add_argument("--narrow", type=int, default=8)
    parser.add_argument("--wide", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    narrow: list[float] = []
    wide: list[float] = []
    for _ in range(args.rounds):
        wide.append(eval_seconds(args.harness, args.wide))
        narrow.append(eval_seconds(args.harness, args.narrow))
        print(f"round: {args.wide} wide {wide[-1]:.0f} s, {args.narrow} wide {narrow[-1]:.0f} s", flush=True)
    ratio = statistics.median(narrow) / statistics.median(wide)
    print(f"{args.harness} base eval (100 rollouts): concurrency {args.narrow} {statistics.median(narrow):.0f} s, "
          f"{args.wide} {statistics.median(wide):.0f} s: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
