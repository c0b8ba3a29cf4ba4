"""Base → SFT on a scripted teacher → GRPO: the stages `benchmarks/learning_curve.py` and `forgetui demo` run.

Every stage is a real run through the engine (the built-in ReAct harness on the toy env, each
rollout in its own sandbox, every model call through the recording proxy); the held-out stages
evaluate on the toy env's eval split, which shares no task id or parameters with the train split.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SFT_FLOOR, GRPO_FLOOR = 0.4, 0.1


@dataclass
class Plan:
    """The schedule of one benchmark run."""

    model: str = "smollm2-135m"
    eval_n: int = 1  # eval tasks per family (plus hello)
    train_n: int = 4  # train tasks per family (plus hello)
    eval_samples: int = 8
    families: str = "write-file,sum-numbers,count-lines,make-dirs,rename"
    sft_epochs: int = 3
    sft_lr: float = 1e-4
    grpo_steps: int = 4
    grpo_tasks_per_step: int = 6
    grpo_samples: int = 4
    grpo_lr: float = 5e-6
    grpo_extra_batches: int = 2  # dynamic sampling: refill steps whose groups all scored alike
    max_tokens: int = 128
    concurrency: int = 8
    only_hello: bool = False
    timings: dict[str, float] = field(default_factory=dict)


QUICK = Plan(model="smollm2-135m", eval_n=0, train_n=0, eval_samples=4, sft_epochs=4, sft_lr=1e-4, grpo_steps=2,
             grpo_tasks_per_step=1, grpo_samples=4, only_hello=True)
# what `forgetui demo` shows: the tiny model memorises the teacher's answer to `hello` (reward 0 → 1 in minutes)
DEMO = Plan(model="tiny", eval_n=0, train_n=0, eval_samples=4, sft_epochs=150, sft_lr=1e-2, grpo_steps=1,
            grpo_tasks_per_step=1, grpo_samples=4, grpo_lr=1e-3, max_tokens=64, only_hello=True)


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


Report = Callable[[str], None]


def run(config: Any, label: str, plan: Plan, report: Report = print, on_step: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """One stage's run through the engine; reports its outcome in a line."""
    from core.run import execute_run

    started = time.monotonic()
    summary = asyncio.run(execute_run(config, on_step=on_step))
    plan.timings[label] = time.monotonic() - started
    if summary.rollouts:
        report(f"  {label}: {summary.rollouts} rollouts, pass {summary.passed}/{summary.rollouts - summary.infra_errors}, "
               f"mean reward {summary.mean_reward if summary.mean_reward is not None else 0:.3f}  ({plan.timings[label]:.0f} s)")
    else:
        report(f"  {label}: {summary.extra.get('examples', '?')} examples, loss {summary.extra.get('first_loss', 0):.3f} → "
               f"{summary.extra.get('final_loss', 0):.3f}  ({plan.timings[label]:.0f} s)")
    return summary


def evaluate(plan: Plan, backend: str, label: str, report: Report = print) -> dict[str, Any]:
    """Pass rate and mean reward of `backend` on the eval split (`plan.eval_samples` rollouts per task)."""
    config = base_config(plan, backend, "eval", plan.eval_n)
    config.run.n_samples = plan.eval_samples
    summary = run(config, label, plan, report)
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


def teach(plan: Plan, out: Path, report: Report = print) -> str:
    """Record the scripted teacher on the train split; returns its run id."""
    from core.models.resolve import resolve_model

    script = teacher_script(plan, out / "teacher.json")
    config = base_config(plan, f"scripted:{script}", "train", plan.train_n)
    config.policy.tokenizer = str(resolve_model(plan.model))  # the student's tokenizer: its token ids train as they are
    config.run.n_samples = 2 if plan.only_hello else 1
    return run(config, "teacher", plan, report).run_id


def sft(plan: Plan, teacher_run: str, report: Report = print) -> str:
    """Fine-tune the model on the teacher's passing rollouts; returns the checkpoint folder."""
    config = base_config(plan, f"builtin:{plan.model}", "train", plan.train_n)
    config.train.trainer = "sft"
    config.train.steps = 1
    config.train.from_runs = [teacher_run]
    config.train.epochs = plan.sft_epochs
    config.train.lr = plan.sft_lr
    config.train.min_reward = 1.0
    summary = run(config, "sft-train", plan, report)
    return summary.extra["checkpoint"]


def grpo(plan: Plan, start: str, report: Report = print) -> tuple[str, list[dict[str, Any]]]:
    """GRPO from `start` on the train split; returns the final checkpoint and each step's metrics."""
    config = base_config(plan, f"builtin:{start}", "train", plan.train_n)
    config.run.n_samples = plan.grpo_samples
    config.train.steps = plan.grpo_steps
    config.train.tasks_per_step = plan.grpo_tasks_per_step
    config.train.lr = plan.grpo_lr
    config.train.max_extra_batches = plan.grpo_extra_batches
    steps: list[dict[str, Any]] = []

    def on_step(m: dict[str, Any]) -> None:
        steps.append(m)
        report(f"    step {m['step']}: reward {m['reward_mean']:.3f} pass {m['pass_rate']:.2f} trained {m['samples_trained']}/{m['samples']} "
               f"Δlogprob max {m.get('logprob_diff_max', 0):.1e}")

    summary = run(config, "grpo-train", plan, report, on_step)
    return summary.extra["checkpoint"], steps


def learning_curve(plan: Plan, out: Path, report: Report = print) -> dict[str, Any]:
    """Every stage in order; writes learning_curve.json and learning_curve.png into `out` and returns the result."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    stages = [evaluate(plan, f"builtin:{plan.model}", "base", report)]
    teacher_run = teach(plan, out, report)
    sft_ckpt = sft(plan, teacher_run, report)
    stages.append(evaluate(plan, f"builtin:{sft_ckpt}", "sft", report))
    grpo_ckpt, steps = grpo(plan, sft_ckpt, report)
    stages.append(evaluate(plan, f"builtin:{grpo_ckpt}", "grpo", report))
    result = {"plan": {k: v for k, v in plan.__dict__.items() if k != "timings"}, "stages": stages, "grpo_steps": steps,
              "timings_s": plan.timings, "total_s": time.monotonic() - started, "plot": str(out / "learning_curve.png")}
    (out / "learning_curve.json").write_text(json.dumps(result, indent=2, default=str))
    plot(stages, steps, out / "learning_curve.png")
    return result


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


