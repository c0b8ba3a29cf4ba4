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
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SFT_FLOOR, GRPO_FLOOR = 0.4, 0.1


@dataclass
class Plan:
    """The schedule of one benchmark run."""

    model: str = "smollm2-135m"
    eval_n: int = 1  # eval tasks per family (plus hello)
    train_n: int = 4  # train tasks per family (plus hello)
    eval_samples: int = 4
    families: str = "write-file,sum-numbers,count-lines,make-dirs,rename"
    sft_epochs: int = 3
    sft_lr: float = 1e-4
    grpo_steps: int = 3
    grpo_tasks_per_step: int = 6
    grpo_samples: int = 4
    grpo_lr: float = 5e-6
    max_tokens: int = 128
    concurrency: int = 8
    only_hello: bool = False
    timings: dict[str, float] = field(default_factory=dict)


QUICK = Plan(model="smollm2-135m", eval_n=0, train_n=0, eval_samples=4, sft_epochs=4, sft_lr=1e-4, grpo_steps=2,
             grpo_tasks_per_step=1, grpo_samples=4, only_hello=True)


def base_config(plan: Plan, backend: str, split: str, n: int) -> Any:
    from core.config import RunConfig

    env: dict[str, Any] = {"name": "toy", "options": {"split": split, "n": n, "families": plan.families}}
    if plan.only_hello:
        env["tasks"] = ["hello"]
    return RunConfig.model_validate({
        "env": env,
        "harness": {"name": "react", "options": {"max_steps": 3}},
        "policy": {"backend": backend, "max_tokens": plan.max_tokens},
        "runtime": {"kind": "docker"},
        "run": {"n_samples": 1, "concurrency": plan.concurrency, "timeout_s": 600, "call_timeout_s": 600},
    })


def run(config: Any, label: str, plan: Plan) -> Any:
    from core.run import execute_run

    started = time.monotonic()
    summary = asyncio.run(execute_run(config))
    plan.timings[label] = time.monotonic() - started
    print(f"  {label}: {summary.rollouts} rollouts, pass {summary.passed}/{summary.rollouts - summary.infra_errors}, "
          f"mean reward {summary.mean_reward if summary.mean_reward is not None else 0:.3f}  ({plan.timings[label]:.0f} s)", flush=True)
    return summary


def evaluate(plan: Plan, backend: str, label: str) -> dict[str, Any]:
    config = base_config(plan, backend, "eval", plan.eval_n)
    config.run.n_samples = plan.eval_samples
    summary = run(config, label, plan)
    scored = summary.rollouts - summary.infra_errors
    return {"stage": label, "backend": backend, "pass_rate": summary.passed / scored if scored else 0.0,
            "mean_reward": summary.mean_reward or 0.0, "rollouts": summary.rollouts, "run_id": summary.run_id}


def teacher_script(plan: Plan, path: Path) -> Path:
    """Per-task turns that run each train task's reference solution through the harness's bash tool."""
    from envs.toy import ToyEnv
    from envs.toy.families import FAMILIES, HELLO

    tasks = ToyEnv(split="train", n=plan.train_n, families=plan.families).tasks()
    entries = []
    for task in tasks:
        family = HELLO if task.id == "hello" else FAMILIES[task.meta["family"]]
        entries.append({"match": task.instruction, "turns": [{"tool": "bash", "command": family.solution(task.meta.get("params", {}))},
                                                              {"text": "Done."}]})
    path.write_text(json.dumps({"tasks": entries, "turns": [{"text": "Done."}]}))
    return path


def teach(plan: Plan, out: Path) -> str:
    from core.models.resolve import resolve_model

    script = teacher_script(plan, out / "teacher.json")
    config = base_config(plan, f"scripted:{script}", "train", plan.train_n)
    config.policy.tokenizer = str(resolve_model(plan.model))  # the student's tokenizer: its token ids train as they are
    config.run.n_samples = 2 if plan.only_hello else 1
    return run(config, "teacher", plan).run_id


def sft(plan: Plan, teacher_run: str) -> str:
    config = base_config(plan, f"builtin:{plan.model}", "train", plan.train_n)
    config.train.trainer = "sft"
    config.train.steps = 1
    config.train.from_runs = [teacher_run]
    config.train.epochs = plan.sft_epochs
    config.train.lr = plan.sft_lr
    config.train.min_reward = 1.0
    summary = run(config, "sft", plan)
    return summary.extra["checkpoint"]


def grpo(plan: Plan, start: str) -> tuple[str, list[dict[str, Any]]]:
    config = base_config(plan, f"builtin:{start}", "train", plan.train_n)
    config.run.n_samples = plan.grpo_samples
    config.train.steps = plan.grpo_steps
    config.train.tasks_per_step = plan.grpo_tasks_per_step
    config.train.lr = plan.grpo_lr
    steps: list[dict[str, Any]] = []
    from core.run import execute_run

    started = time.monotonic()
    summary = asyncio.run(execute_run(config, on_step=lambda m: (steps.append(m), print(
        f"    step {m['step']}: reward {m['reward_mean']:.3f} pass {m['pass_rate']:.2f} trained {m['samples_trained']}/{m['samples']} "
        f"Δlogprob max {m.get('logprob_diff_max', 0):.1e}", flush=True))))
    plan.timings["grpo"] = time.monotonic() - started
    return summary.extra["checkpoint"], steps


def plot(stages: list[dict[str, Any]], steps: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), dpi=120)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    left.bar([s["stage"] for s in stages], [s["pass_rate"] for s in stages], color=["#999", "#4a7", "#37c"][: len(stages)])
    left.set_ylim(0, 1)
    left.set_title("held-out pass rate")
    right.plot([m["step"] for m in steps], [m["reward_mean"] for m in steps], marker="o")
    right.set_ylim(0, 1)
    right.set_xlabel("GRPO step")
    right.set_title("train reward per step")
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the hello task only, a short schedule (a few minutes)")
    parser.add_argument("--model", default=None, help="built-in model or local folder (default smollm2-135m)")
    parser.add_argument("--grpo-steps", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/learning_curve"))
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan()
    if args.model:
        plan.model = args.model
    if args.grpo_steps is not None:
        plan.grpo_steps = args.grpo_steps
    args.out.mkdir(parents=True, exist_ok=True)
    from core.models.quiet import silence_third_party

    silence_third_party()
    started = time.monotonic()
    print(f"learning curve: {plan.model}, {'hello only (quick)' if plan.only_hello else 'toy eval split held out'}", flush=True)
    stages = [evaluate(plan, f"builtin:{plan.model}", "base")]
    teacher_run = teach(plan, args.out)
    sft_ckpt = sft(plan, teacher_run)
    stages.append(evaluate(plan, f"builtin:{sft_ckpt}", "sft"))
    grpo_ckpt, steps = grpo(plan, sft_ckpt)
    stages.append(evaluate(plan, f"builtin:{grpo_ckpt}", "grpo"))
    total = time.monotonic() - started
    result = {"plan": {k: v for k, v in plan.__dict__.items() if k != "timings"}, "stages": stages, "grpo_steps": steps,
              "timings_s": plan.timings, "total_s": total}
    (args.out / "learning_curve.json").write_text(json.dumps(result, indent=2, default=str))
    plot(stages, steps, args.out / "learning_curve.png")
    print("\nstage   held-out pass rate   mean reward")
    for s in stages:
        print(f"{s['stage']:<7} {s['pass_rate']:>18.3f} {s['mean_reward']:>13.3f}")
    base, after_sft, after_grpo = (s["pass_rate"] for s in stages)
    ok = after_sft >= base + SFT_FLOOR and after_grpo >= after_sft + GRPO_FLOOR
    print(f"\nSFT − base = {after_sft - base:+.3f} (floor +{SFT_FLOOR}); GRPO − SFT = {after_grpo - after_sft:+.3f} (floor +{GRPO_FLOOR}); "
          f"{total / 60:.1f} min in all; plot: {args.out / 'learning_curve.png'}")
    return 0 if ok or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
