"""Proof that it learns: base → SFT on a scripted teacher → GRPO, pass rate on held-out toy tasks.

    .venv/bin/python benchmarks/learning_curve.py [--quick] [--model smollm2-135m] [--out DIR]

The built-in ReAct harness on the toy env in Docker, SmolLM2-135M-Instruct on CPU, every model call
through the real recording proxy:
1. base: the model on the eval split (held out: no task id or parameters shared with train);
2. teacher: a scripted policy that runs each train task's reference solution, through the same harness;
3. SFT: full fine-tuning on the teacher's passing rollouts (loss on the teacher's sampled tokens only);
4. eval of the SFT checkpoint on the eval split;
5. GRPO from the SFT checkpoint on the train split (`train.steps` steps);
6. eval of the GRPO checkpoint on the eval split.
Prints the table, writes learning_curve.json and learning_curve.png (reward per GRPO step, held-out
pass rate per stage) into --out. Exit code 0 when the floors hold: SFT ≥ base + 0.4 and GRPO ≥ SFT + 0.1.
`--quick` (what `make demo` shows) uses the `hello` task only and a short schedule: reward moves in a
few minutes, but train and eval share the task, so it shows the loop working, not generalization.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the hello task only, a short schedule (a few minutes)")
    parser.add_argument("--model", default=None, help="built-in model or local folder (default smollm2-135m)")
    parser.add_argument("--grpo-steps", type=int, default=None)
    parser.add_argument("--sft-epochs", type=int, default=None)
    parser.add_argument("--sft-lr", type=float, default=None)
    parser.add_argument("--grpo-lr", type=float, default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/learning_curve"))
    args = parser.parse_args()
    from core.models.quiet import silence_third_party
    from forgetui.learning import GRPO_FLOOR, QUICK, SFT_FLOOR, Plan, learning_curve

    plan = QUICK if args.quick else Plan()
    if args.model:
        plan.model = args.model
    for name in ("grpo_steps", "sft_epochs", "sft_lr", "grpo_lr"):
        if getattr(args, name) is not None:
            setattr(plan, name, getattr(args, name))
    silence_third_party()
    print(f"learning curve: {plan.model}, {'hello only (quick)' if plan.only_hello else 'toy eval split held out'}", flush=True)
    result = learning_curve(plan, args.out, lambda line: print(line, flush=True))
    stages = result["stages"]
    print("\nstage   held-out pass rate   mean reward")
    for s in stages:
        print(f"{s['stage']:<7} {s['pass_rate']:>18.3f} {s['mean_reward']:>13.3f}")
    base, after_sft, after_grpo = (s["pass_rate"] for s in stages)
    ok = after_sft >= base + SFT_FLOOR and after_grpo >= after_sft + GRPO_FLOOR
    print(f"\nSFT − base = {after_sft - base:+.3f} (floor +{SFT_FLOOR}); GRPO − SFT = {after_grpo - after_sft:+.3f} (floor +{GRPO_FLOOR}); "
          f"{result['total_s'] / 60:.1f} min in all; plot: {result['plot']}")
    return 0 if ok or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
