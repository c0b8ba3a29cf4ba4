"""Base → SFT on a scripted teacher → GRPO, inside one harness: the stages `benchmarks/learning_curve.py` and `forgetui demo` run.

Every stage is a real run through the engine (the harness in Docker on the toy env, each rollout in
its own sandbox, every model call through the recording proxy). The teacher is a scripted policy
that answers *in the harness's own format* (its tools, its way of finishing), recorded through the
same harness, so SFT learns what that harness expects. The held-out stages evaluate on the toy env's
`eval-phrasing` split (instruction templates, names and words no train task uses) and its `eval`
split (the train templates, held-out parameters); `hello` is a train task and in neither.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qsl

from core.backends.batching import DEFAULT_MAX_BATCH
from core.config import RunConfig
from core.models.precision import fastest_dtype
from core.models.resolve import resolve_model
from core.paths import runs_dir
from core.registry import load_env
from core.run import execute_run
from core.run.signals import cancel_on_signals
from core.session.setup import select_tasks
from core.status import Outcome, outcome_of
from core.store.query import run_query
from core.train.merge import interpolate
from core.train.selection import BestCheckpoint
from envs.toy import practice_id, solution_script
from envs.toy.families import FAMILIES, template_indices
from forgetui.learning_recipe import Wordings
from forgetui.learning_report import paired_gain, pass_interval, plot, split_line
from forgetui.learning_sampler import SharedVllm

SFT_FLOOR, GRPO_FLOOR = 0.4, 0.1
HARNESSES = ("react", "mini-swe-agent", "pi")
EVAL_SPLITS = ("eval-phrasing", "eval")
SAMPLERS = ("builtin", "vllm")
FLOOR_SPLIT = "eval-phrasing"
SELECT_SPLIT = "eval"  # the split that chooses among GRPO checkpoints (never FLOOR_SPLIT: that one only measures)
WORDINGS = get_args(Wordings)
START_STEP = -1  # the selection's step for GRPO's start, the SFT checkpoint (Plan.select_start)
SELECT_POOL = 8  # select_wordings "untaught" draws this many times select_eval_n eval tasks a family and keeps the untaught
STAGE_KEYS = ("pass_rate", "ci", "passed", "scored", "tasks", "seconds", "by_family", "timeouts")  # a split result's fields an event carries
MSWEA_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# Each harness's options for these runs: a cap on model calls where the harness has one (the teacher needs two:
# the command, then the final answer or submit; a model that flails costs no more than that), and a completion
# cap where the harness asks for its own (pi asks for 4096 tokens a call, which a flailing model would use).
# pi has no cap on its turns: there the proxy's run.max_calls (Plan.max_calls) ends a rollout at the same budget.
HARNESS_OPTIONS: dict[str, dict[str, Any]] = {
    "react": {"max_steps": 2},
    "mini-swe-agent": {"step_limit": 2},
    "pi": {"max_tokens": 96},
}

RUNTIME_FIELDS = ("timings", "shared")  # a Plan's fields that are its run's state, not its schedule
Report = Callable[[str], None]
Emit = Callable[[dict[str, Any]], None]  # a structured event (forgetui.learning_events): what the TUI's Learning screen shows


def _quiet(event: dict[str, Any]) -> None:
    """No event log."""


@dataclass
class Plan:
    """The schedule of one learning run."""

    harness: str = "react"
    model: str = "smollm2-135m"
    eval_splits: tuple[str, ...] = EVAL_SPLITS
    # an eval stage's 100 rollouts as 20 tasks a family x 1 sample, not 5 x 4: the paired gain's interval is over tasks,
    # and one sample's noise is 61% of a task's variance at 4 samples, so more tasks narrow it to 0.84x at the same cost
    # (benchmarks/eval_design.py over 49 runs, 2026-12-07; runs before that date were measured at 5 x 4)
    eval_n: int = 20  # eval tasks per family and split
    train_n: int = 20  # train tasks per family (plus hello)
    eval_samples: int = 1
    families: str = "write-file,sum-numbers,count-lines,make-dirs,rename"
    sft_epochs: int = 3
    sft_lr: float = 1e-4
    grpo_steps: int = 4
    grpo_tasks_per_step: int = 6
    grpo_samples: int = 4
    grpo_lr: float = 5e-6
    # train.warmup_steps: GRPO's learning rate rises linearly over this many steps. AdamW's first updates move every weight
    # by about the full rate whatever its gradient (m/√v is ±1 on step one): at 5e-5 one such step broke react's tool-call
    # endings (2026-12-06 results); warm-up makes those first steps small
    grpo_warmup: int = 0
    grpo_temperature: float = 1.0  # GRPO's sampling temperature (train.temperature: the trainer recomputes logprobs at it); evals sample as the harness asks
    grpo_extra_batches: int = 2  # dynamic sampling: refill steps whose groups all scored alike
    max_tokens: int = 96
    max_calls: int | None = 2  # run.max_calls: model calls per rollout, refused past it by the proxy (None: the harness's own caps only)
    runtime: str = "docker"
    concurrency: int = 8
    # rows one decode step of the built-in backend carries (None: the plan's concurrency, at least the backend's 16). On a
    # CPU a decode step reads every weight whatever its rows, so wider steps are nearly free: concurrency 32 evaluates
    # 100 base rollouts in 124 s against 177 s at 8 (react, SmolLM2-135M, 2 cores; benchmarks/README.md).
    max_batch: int | None = None
    # where the runs that sample do it: "builtin" (the in-process backend) or "vllm" (a vLLM server each run starts for its
    # model, `make vllm`; GRPO's full-parameter updates reach it by an in-place reload, core/train/vllm_sync.py). SFT
    # trains in-process either way.
    sampler: str = "builtin"
    vllm_options: str = "max_model_len=8192&kv_cache=4"  # the managed server's spec options (kv_cache: GiB; 4 holds 32 react rollouts)
    # what every stage computes in: the sampler (built-in backend or vLLM server) and the trainers (SFT, GRPO: float32 master
    # weights under autocast). "auto": float32 on a CPU. "bfloat16" on a CPU with native bfloat16 (AVX-512 BF16, AMX) trains
    # about 1.4-1.8x faster (benchmarks/cpu_loop.py --only dtype); GRPO's rollout correction then weighs the logprob mismatch.
    # "fast": bfloat16 where this machine has it natively, else float32 (a run records which it was)
    dtype: str = "auto"
    timeout_s: int = 600
    train_tasks: list[str] | None = None  # a fixed selection of train task ids (the demo's); None: the whole train split
    eval_tasks: list[str] | None = None  # likewise for the eval runs
    teacher_samples: int = 1  # teacher rollouts per train task
    teacher_mistakes: bool = False  # the teacher also records a wrong answer to each task, and SFT imitates both (the demo)
    # The teacher (so SFT) sees only the train tasks worded with the first k of each family's seen templates (None: all);
    # GRPO still trains on every train task, so it meets wordings its SFT never saw, the skill eval-phrasing tests.
    teacher_templates: int | None = None
    # "untaught": GRPO trains only on the train tasks worded with the seen templates the teacher did not show (ranks
    # teacher_templates and up), and the selection scores only eval-split tasks so worded: new wordings of known tasks,
    # the nearest thing to eval-phrasing that the train and eval splits hold ("all": every wording). "practice": GRPO trains on
    # the train tasks worded instead with the toy families' practice templates (none a train or eval-phrasing template, none
    # the teacher shows: RL needs a checker, not a demonstration), and the selection scores eval tasks so worded
    grpo_wordings: str = "all"
    select_wordings: str = "all"
    # with practice wordings: this many of each family's practice templates (a seeded pick) word only the selection's eval
    # tasks, never GRPO's train tasks, so the selection scores wordings GRPO never trained on, as eval-phrasing does (0: none)
    select_held_out: int = 0
    seed: int = 0  # run.seed and train.seed of every stage: GRPO's task order and refills, SFT's example order, the trainer's init
    grpo_kl_coef: float = 0.0  # train.kl_coef: KL to the SFT weights
    grpo_entropy_coef: float = 0.0  # train.entropy_coef: an entropy bonus
    grpo_call_discount: float = 1.0  # train.call_discount: per-call credit, call t of T gets the advantage × γ^(T−1−t)
    # train.stratify_by: each GRPO step's tasks dealt round-robin over the families ("family"), so no family goes a step
    # without its own signal while the others' advantages move the weights they share; None: one shuffle of all tasks
    grpo_stratify_by: str | None = None
    # the GRPO checkpoint the run keeps (after any selection), moved back towards the SFT weights: SFT + α·(GRPO − SFT)
    # (core/train/merge.py; WiSE-FT's remedy for a policy that drifted on inputs it never trained on). 1: GRPO's as is
    grpo_merge: float = 1.0
    # keep the GRPO checkpoint with the best pass rate on the `eval` split (select_eval_n tasks a family, select_samples
    # rollouts each), scored every select_every steps and at the last (0: keep the last); eval-phrasing never chooses
    select_every: int = 0
    select_eval_n: int = 5
    select_samples: int = 2
    # early stopping: GRPO ends once this many eval-split scores in a row have not beaten the best (None: every step runs)
    select_patience: int | None = None
    # score GRPO's start (the SFT checkpoint) first, on the same tasks: the selection's baseline, and the checkpoint kept
    # when no GRPO step beats it (patience counts from it)
    select_start: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    # with sampler "vllm": the one server every sampling stage of this learning run uses (`learning_curve` starts it);
    # None: each stage's run starts its own
    shared: SharedVllm | None = field(default=None, repr=False, compare=False)

    def compute_dtype(self) -> str:
        """`dtype` with "fast" made concrete for this machine."""
        return fastest_dtype() if self.dtype == "fast" else self.dtype

    def server_options(self) -> str:
        """The managed vLLM server's spec options: `vllm_options`, with the plan's dtype unless they name one."""
        dtype = self.compute_dtype()
        if dtype == "auto" or "dtype" in dict(parse_qsl(self.vllm_options)):
            return self.vllm_options
        return "&".join(filter(None, [self.vllm_options, f"dtype={dtype}"]))

    def describe(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if k not in RUNTIME_FIELDS}


# What `forgetui demo` shows in a few minutes: the tiny model in react on `hello`, its eval set the train task itself
# (the loop closing, not generalization). The teacher answers right half the time ("hi") and wrong the other half
# ("hello"); SFT imitates both, so the SFT model passes about half its rollouts and GRPO's step has rollouts that
# pass and rollouts that fail in one group: a step with signal, pushing towards the answer the verifier rewards.
DEMO = Plan(model="tiny", eval_splits=("train",), train_n=0, eval_samples=8, sft_epochs=160, sft_lr=1e-2, grpo_steps=1,
            grpo_tasks_per_step=1, grpo_samples=8, grpo_lr=1e-3, grpo_extra_batches=0, max_tokens=64,
            train_tasks=["hello"], eval_tasks=["hello"], teacher_samples=2, teacher_mistakes=True, runtime="auto")


def policy(plan: Plan, model: str, *, sampling: bool = True, load: bool = True) -> str:
    """The backend spec serving `model` (a built-in name or a checkpoint folder) in this plan's runs: the built-in backend, or
    with `plan.sampler = "vllm"` the learning run's shared vLLM server holding `model` (`load=False`: a trainer loads it),
    else a server the run starts for it (`sampling=False`: a run that only trains, SFT)."""
    if plan.sampler not in SAMPLERS:
        raise ValueError(f"sampler {plan.sampler!r}: one of {', '.join(SAMPLERS)}")
    if sampling and plan.sampler == "vllm" and plan.shared is not None:
        spec = plan.shared.spec(model, load=load)
        plan.timings["vllm-reloads"] = sum(plan.shared.reload_s)
        return spec
    if sampling and plan.sampler == "vllm":
        options = plan.server_options()
        return f"vllm:{model}?{options}" if options else f"vllm:{model}"
    rows = plan.max_batch if plan.max_batch is not None else max(plan.concurrency, DEFAULT_MAX_BATCH)
    return f"builtin:{model}" if rows == DEFAULT_MAX_BATCH else f"builtin:{model}?max_batch={rows}"


def base_config(plan: Plan, backend: str, split: str, n: int, tasks: list[str] | None = None, wording: str = "templates") -> Any:
    env: dict[str, Any] = {"name": "toy", "options": {"split": split, "n": n, "families": plan.families}}
    if wording != "templates":
        env["options"]["wording"] = wording
    if wording == "practice" and plan.select_held_out:
        env["options"]["practice_held_out"] = plan.select_held_out
    if tasks:
        env["tasks"] = list(tasks)
    return RunConfig.model_validate({
        "env": env,
        "harness": {"name": plan.harness, "options": dict(HARNESS_OPTIONS.get(plan.harness, {}))},
        "policy": {"backend": backend, "max_tokens": plan.max_tokens, "dtype": plan.compute_dtype()},  # dtype: the built-in sampler's
        "runtime": {"kind": plan.runtime},
        "run": {"n_samples": 1, "concurrency": plan.concurrency, "timeout_s": plan.timeout_s, "call_timeout_s": plan.timeout_s, "max_calls": plan.max_calls,
                "seed": plan.seed},
        "train": {"dtype": plan.compute_dtype()},
    })


def run(config: Any, label: str, plan: Plan, on_step: Callable[[dict[str, Any]], None] | None = None, resume: str | None = None) -> Any:
    """One stage's run through the engine (or the rest of run `resume`, up to `config.train.steps`), timed into `plan.timings[label]`."""
    started = time.monotonic()
    summary = asyncio.run(cancel_on_signals(execute_run(config, resume=resume, on_step=on_step)))  # a killed stage removes its sandboxes
    plan.timings[label] = plan.timings.get(label, 0.0) + time.monotonic() - started
    return summary


def task_results(store: str) -> dict[str, dict[str, Any]]:
    """Per task of a finished run: family, passed and scored rollouts (infra errors are not scores), reward sum."""
    rows = run_query(store, "SELECT task_id, status, passed, reward, meta->>'$.task_meta.family' FROM rollouts", max_rows=1_000_000).rows
    out: dict[str, dict[str, Any]] = {}
    for task_id, status, passed, reward, family in rows:
        outcome = outcome_of(status, passed)
        if outcome is None or outcome == Outcome.INFRA_ERROR:
            continue
        t = out.setdefault(task_id, {"family": family or "?", "passed": 0, "scored": 0, "reward": 0.0, "timeouts": 0})
        t["scored"] += 1
        t["passed"] += outcome == Outcome.PASSED
        t["timeouts"] += outcome == Outcome.TIMEOUT  # scored as a fail: on a busy machine, load shows up here
        t["reward"] += float(reward or 0.0)
    return out


def split_result(per_task: dict[str, dict[str, Any]], run_id: str) -> dict[str, Any]:
    """Pass rate, its 95% bootstrap interval over tasks, and per-family counts."""
    passed = sum(t["passed"] for t in per_task.values())
    scored = sum(t["scored"] for t in per_task.values())
    by_family: dict[str, list[int]] = {}
    for t in per_task.values():
        counts = by_family.setdefault(t["family"], [0, 0])
        counts[0] += t["passed"]
        counts[1] += t["scored"]
    lo, hi = pass_interval({k: (t["passed"], t["scored"]) for k, t in per_task.items()})
    return {"pass_rate": passed / scored if scored else 0.0, "ci": [lo, hi], "passed": passed, "scored": scored,
            "tasks": len(per_task), "mean_reward": sum(t["reward"] for t in per_task.values()) / scored if scored else 0.0,
            "by_family": {f: tuple(c) for f, c in by_family.items()}, "run_id": run_id,
            "timeouts": sum(t.get("timeouts", 0) for t in per_task.values()),
            "per_task": {k: [t["passed"], t["scored"]] for k, t in sorted(per_task.items())}}


def per_task_counts(r: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """A split result's (passed, scored) per task: stored in it, or (results written before they were) read from its run's store."""
    if "per_task" in r:
        return {k: (int(p), int(n)) for k, (p, n) in r["per_task"].items()}
    return {k: (t["passed"], t["scored"]) for k, t in task_results(str(runs_dir() / r["run_id"] / "store.duckdb")).items()}


def gains(result: dict[str, Any], split: str = FLOOR_SPLIT) -> dict[str, dict[str, Any]]:
    """SFT − base and GRPO − SFT on `split`, paired over its tasks (`paired_gain`)."""
    by_stage = {s["stage"]: per_task_counts(s["splits"][split]) for s in result["stages"] if split in s["splits"]}
    return {f"{b} - {a}": paired_gain(by_stage[a], by_stage[b]) for a, b in (("base", "sft"), ("sft", "grpo")) if a in by_stage and b in by_stage}


def evaluate(plan: Plan, backend: str, label: str, report: Report = print, events: Emit = _quiet, wording: str = "templates") -> dict[str, Any]:
    """`backend` in the plan's harness on every eval split of the plan (`plan.eval_samples` rollouts per task; `wording`: the toy env's)."""
    splits: dict[str, Any] = {}
    for split in plan.eval_splits:
        events({"event": "phase", "phase": f"{label} eval · {split}", "state": "running"})
        config = base_config(plan, backend, split, plan.eval_n, plan.eval_tasks, wording)
        config.run.n_samples = plan.eval_samples
        started = time.monotonic()
        summary = run(config, f"{label}/{split}", plan)
        splits[split] = split_result(task_results(summary.store), summary.run_id)
        splits[split]["seconds"] = time.monotonic() - started
        report(split_line(label, split, splits[split]) + f"  ({splits[split]['seconds']:.0f} s)")
        events({"event": "phase", "phase": f"{label} eval · {split}", "state": "done", "seconds": splits[split]["seconds"]})
        events({"event": "stage", "stage": label, "split": split, **{k: splits[split][k] for k in STAGE_KEYS}})
    return {"stage": label, "backend": backend, "harness": plan.harness, "splits": splits}


def teacher_turns(harness: str, task: Any) -> list[dict[str, Any]]:
    """What the scripted teacher says for `task`, in `harness`'s own format.

    react: the bash tool, then a short final answer. mini-swe-agent (its mini.yaml): reasoning text and
    one bash tool call a turn, finished by the submit command alone. pi: its own tools (`write` for a
    new file, `bash` otherwise), then a final answer without a tool call.
    """
    command = solution_script(task)
    if harness == "mini-swe-agent":
        return [{"text": "I will run one command that does the task.", "tool": "bash", "command": command},
                {"text": "The task is done, so I submit.", "tool": "bash", "command": MSWEA_SUBMIT}]
    if harness == "pi" and task.meta.get("family") == "write-file":
        p = task.meta["params"]
        return [{"tool": "write_file", "path": p["path"], "content": p["content"]}, {"text": "Done."}]
    return [{"tool": "bash", "command": command}, {"text": "Done."}]


def mistaken_turns(harness: str, task: Any) -> list[dict[str, Any]]:
    """The teacher's wrong answer to a task whose answer is a text (hello, write-file): the right command, a wrong text."""
    family = task.meta.get("family")
    if family == "hello":
        wrong = replace(task, meta={**task.meta, "family": "write-file", "params": {"path": "hello.txt", "content": "hello"}})
    elif family == "write-file":
        wrong = replace(task, meta={**task.meta, "params": {**task.meta["params"], "content": task.meta["params"]["content"] + "s"}})
    else:
        raise ValueError(f"no scripted mistake for {family} tasks (only hello and write-file)")
    return teacher_turns(harness, wrong)


def train_split_tasks(plan: Plan) -> list[Any]:
    """The plan's train tasks (its `train_tasks` selection, else the whole train split)."""
    return select_tasks(load_env("toy", split="train", n=plan.train_n, families=plan.families), plan.train_tasks, None)


def teacher_tasks(plan: Plan) -> list[Any]:
    """The train tasks the teacher records: the plan's train tasks, only those of its first `teacher_templates` seen templates."""
    tasks = train_split_tasks(plan)
    if plan.teacher_templates is None:
        return tasks
    taught = [t for t in tasks if seen_template_rank(t) < plan.teacher_templates]
    if not taught:  # an empty selection would mean "the whole split" to the run's config
        raise ValueError(f"no train task of this plan is worded with the first {plan.teacher_templates} seen template(s) of its family: "
                         "raise teacher_templates or choose other train_tasks")
    return taught


def untaught(plan: Plan, tasks: list[Any], setting: str) -> list[Any]:
    """The tasks of `tasks` worded with a seen template the teacher did not show (rank `teacher_templates` and up); ValueError if none."""
    if plan.teacher_templates is None:
        raise ValueError(f"{setting} = \"untaught\" needs teacher_templates: with every template taught, no wording is untaught")
    out = [t for t in tasks if t.meta.get("family") in FAMILIES and seen_template_rank(t) >= plan.teacher_templates]
    if not out:
        raise ValueError(f"{setting} = \"untaught\": no task is worded with a seen template past the first {plan.teacher_templates}")
    return out


def grpo_tasks(plan: Plan) -> list[str] | None:
    """The train task ids GRPO draws from: the plan's (None: the whole split), with grpo_wordings "untaught" only those untaught,
    with "practice" the plan's reworded (`practice_ids`)."""
    wordings(plan.grpo_wordings, "grpo_wordings")
    if plan.grpo_wordings == "all":
        return plan.train_tasks
    if plan.grpo_wordings == "practice":
        return practice_ids(plan.train_tasks, "grpo_wordings")
    return [t.id for t in untaught(plan, train_split_tasks(plan), "grpo_wordings")]


def practice_ids(task_ids: list[str] | None, setting: str) -> list[str] | None:
    """The ids the toy env's practice wording gives `task_ids` (``<family>-NNN`` → ``<family>-rNNN``; None: the whole split)."""
    if task_ids is None:
        return None
    out = [practice_id(t) for t in task_ids if t.rpartition("-")[0] in FAMILIES]
    if not out:
        raise ValueError(f"{setting} = \"practice\": none of the tasks {task_ids} is a toy family's (practice wordings skip hello)")
    return out


def wording_of(setting: str) -> str:
    """The toy env's wording a grpo_wordings or select_wordings value asks for."""
    return "practice" if setting == "practice" else "templates"


def select_tasks_of(plan: Plan) -> tuple[int, list[str] | None]:
    """The eval split's size per family and the task ids the selection scores: the first select_eval_n a family (all wordings;
    with select_wordings "practice" those tasks reworded), or with "untaught" the first select_eval_n a family worded with an
    untaught template (from a larger draw)."""
    wordings(plan.select_wordings, "select_wordings")
    if plan.select_held_out and plan.select_wordings != "practice":
        raise ValueError(f"select_held_out {plan.select_held_out} holds out practice templates for the selection: it needs "
                         "select_wordings \"practice\"")
    if plan.select_wordings in ("all", "practice"):
        return plan.select_eval_n, None
    n = plan.select_eval_n * SELECT_POOL
    pool = untaught(plan, load_env("toy", split=SELECT_SPLIT, n=n, families=plan.families).tasks(), "select_wordings")
    per_family: dict[str, list[str]] = {}
    for task in pool:
        kept = per_family.setdefault(task.meta["family"], [])
        if len(kept) < plan.select_eval_n:
            kept.append(task.id)
    return n, [t for ids in per_family.values() for t in ids]


def wordings(value: str, setting: str) -> None:
    if value not in WORDINGS:
        raise ValueError(f"{setting} {value!r}: one of {', '.join(WORDINGS)}")


def seen_template_rank(task: Any) -> int:
    """The position of a toy task's template among its family's seen templates (hello, with one template: 0)."""
    family = FAMILIES.get(task.meta.get("family", ""))
    index = task.meta.get("params", {}).get("template", 0)
    return template_indices(family.templates, "seen").index(index) if family else 0


def teacher_script(plan: Plan, tasks: list[Any], path: Path, *, mistakes: bool = False) -> Path:
    """Per-task turns for each of `tasks` (`teacher_tasks`), matched by its instruction (longest first: no task's text hides another's)."""
    turns = mistaken_turns if mistakes else teacher_turns
    entries = [{"match": t.instruction, "turns": turns(plan.harness, t)} for t in tasks]
    entries.sort(key=lambda e: -len(e["match"]))
    path.write_text(json.dumps({"tasks": entries, "turns": [{"text": "Done."}]}))
    return path


def teach(plan: Plan, out: Path, report: Report = print) -> list[str]:
    """Record the scripted teacher on the train split through the plan's harness (and its mistakes, when the plan says); the run ids."""
    runs = []
    taught = teacher_tasks(plan)
    task_ids = plan.train_tasks if plan.teacher_templates is None else [t.id for t in taught]
    for mistakes in (False, True) if plan.teacher_mistakes else (False,):
        name = "teacher-mistakes" if mistakes else "teacher"
        script = teacher_script(plan, taught, out / f"{name}-{plan.harness}.json", mistakes=mistakes)
        config = base_config(plan, f"scripted:{script}", "train", plan.train_n, task_ids)
        config.policy.tokenizer = str(resolve_model(plan.model))  # the student's tokenizer: its token ids train as they are
        config.run.n_samples = plan.teacher_samples
        summary = run(config, name, plan)
        report(f"  {name}: {summary.passed}/{summary.rollouts - summary.infra_errors} train rollouts pass ({plan.timings[name]:.0f} s)")
        runs.append(summary.run_id)
    return runs


def sft(plan: Plan, teacher_runs: list[str], report: Report = print) -> str:
    """Fine-tune the model on the teacher's passing rollouts (all of them with `teacher_mistakes`); returns the checkpoint folder."""
    config = base_config(plan, policy(plan, plan.model, sampling=False), "train", plan.train_n, plan.train_tasks)
    config.train.trainer = "sft"
    config.train.steps = 1
    config.train.from_runs = list(teacher_runs)
    config.train.epochs = plan.sft_epochs
    config.train.lr = plan.sft_lr
    config.train.min_reward = 0.0 if plan.teacher_mistakes else 1.0
    config.train.seed = plan.seed
    summary = run(config, "sft-train", plan)
    x = summary.extra
    report(f"  SFT: {x.get('examples', '?')} examples × {plan.sft_epochs} epochs, loss {x.get('first_loss', 0):.3f} → "
           f"{x.get('final_loss', 0):.3f} ({plan.timings['sft-train']:.0f} s)")
    return x["checkpoint"]


def grpo_step_line(m: dict[str, Any]) -> str:
    """One GRPO step as the learning benchmark prints it (the sampler's counters only where the backend keeps them)."""
    # the built-in backend counts its prefill and decode; a vLLM server reports none, so nothing is said of them
    sampler = (f" (prefill {m['prefill_s']:.0f} s, decode {m.get('decode_s', 0):.0f} s, {m.get('reused_tokens', 0):.0f} prompt tokens "
               f"reused, {m.get('accepted_tokens', 0):.0f} of {m.get('decode_tokens', 0):.0f} answer tokens from accepted drafts)"
               if "prefill_s" in m else "")
    return (f"  GRPO step {m['step']}: train reward {m['reward_mean']:.3f} over {m['samples']} samples, trained on "
            f"{m['samples_trained']} (the rest in groups that scored alike), Δlogprob max {m.get('logprob_diff_max', 0):.1e}; "
            f"rollouts {m.get('rollout_s', 0):.0f} s{sampler}, update {m.get('update_s', 0):.0f} s")


def grpo_config(plan: Plan, start: str) -> Any:
    """The GRPO stage's run: from checkpoint `start` on the train split, the plan's schedule and sampling temperature."""
    # the trainer gives a shared server its starting weights itself (vllm_sync.check_server): no load here
    config = base_config(plan, policy(plan, start, load=False), "train", plan.train_n, grpo_tasks(plan), wording_of(plan.grpo_wordings))
    config.run.n_samples = plan.grpo_samples
    config.train.steps = plan.grpo_steps
    config.train.tasks_per_step = plan.grpo_tasks_per_step
    config.train.lr = plan.grpo_lr
    config.train.warmup_steps = plan.grpo_warmup
    config.train.max_extra_batches = plan.grpo_extra_batches
    config.train.temperature = plan.grpo_temperature
    config.train.seed = plan.seed
    config.train.kl_coef = plan.grpo_kl_coef
    config.train.entropy_coef = plan.grpo_entropy_coef
    config.train.call_discount = plan.grpo_call_discount
    config.train.stratify_by = plan.grpo_stratify_by
    config.train.save_every = plan.select_every  # the checkpoints the eval-split selection scores
    return config


def grpo(plan: Plan, start: str, report: Report = print, events: Emit = _quiet) -> tuple[str, list[dict[str, Any]], dict[str, Any] | None]:
    """GRPO from `start` on the train split; returns the checkpoint it keeps, each step's metrics and the selection (None without one).

    With `select_every`, training pauses at each of `select_steps` and that step's checkpoint is scored on the
    `eval` split; the best is kept, and with `select_patience` training stops once that many scores in a row
    did not beat it (the rest of the schedule never runs). Each pause ends a segment of one run: the next
    resumes it from that checkpoint (weights, optimizer and schedule), so a stopped run is the run so far.
    """
    config = grpo_config(plan, start)
    steps: list[dict[str, Any]] = []

    def on_step(m: dict[str, Any]) -> None:
        steps.append(m)
        events({"event": "grpo_step", **{k: m.get(k) for k in STEP_KEYS}})
        report(grpo_step_line(m))

    def train_to(end: int, resume: str | None) -> tuple[str, str]:
        config.train.steps = end
        summary = run(config, "grpo-train", plan, on_step, resume)
        return summary.run_id, summary.extra["checkpoint"]

    if plan.select_every <= 0:
        return train_to(plan.grpo_steps, None)[1], steps, None
    best = BestCheckpoint(patience=plan.select_patience)
    run_id: str | None = None
    final = start
    for step in ([START_STEP] if plan.select_start else []) + select_steps(plan):
        if step != START_STEP:
            run_id, final = train_to(step + 1, run_id)
        try:
            scored = score_checkpoint(plan, step, final, report, events)
        except Exception as exc:  # noqa: BLE001 - an optional choice must not cost the run's GRPO stage: the last step stands, said
            report(f"  selection failed ({type(exc).__name__}: {exc}): training to the last step and keeping it")
            if step + 1 < plan.grpo_steps:
                final = train_to(plan.grpo_steps, run_id)[1]
            return final, steps, {"error": f"{type(exc).__name__}: {exc}", "best_path": final, **best.as_dict()}
        better = best.offer(step, final, scored["pass_rate"])
        events({"event": "select", "step": step, "pass_rate": scored["pass_rate"], "ci": scored["ci"], "best": better})
        if best.stop and step + 1 < plan.grpo_steps:
            assert best.best is not None
            report(f"  early stop after step {step}: {best.since_best} eval-split scores in a row without beating {checkpoint_name(best.best.step)}'s "
                   f"{best.best.score:.3f}; steps {step + 1}-{plan.grpo_steps - 1} not run")
            events({"event": "early_stop", "step": step, "best_step": best.best.step})
            break
    assert best.best is not None
    report(f"  selection on {SELECT_SPLIT}: " + ", ".join(f"{checkpoint_name(c.step)} {c.score:.3f}" for c in best.seen)
           + f"; kept {checkpoint_name(best.best.step)}")
    return best.best.path, steps, {**best.as_dict(), "stopped_after": steps[-1]["step"] if steps else None,
                                   "early_stop": steps[-1]["step"] < plan.grpo_steps - 1 if steps else False}


STEP_KEYS = ("step", "reward_mean", "pass_rate", "samples", "samples_trained", "groups", "zero_variance_groups", "informative_groups",
             "extra_batches", "rollouts", "rollout_s", "update_s", "entropy", "kl", "logprob_diff_max")


def checkpoint_name(step: int) -> str:
    """How the selection names a checkpoint it scored: GRPO's start, the SFT checkpoint (START_STEP), or a step."""
    return "SFT" if step == START_STEP else f"step {step}"


def select_steps(plan: Plan) -> list[int]:
    """The GRPO steps whose checkpoints the eval-split selection scores: every `select_every`-th and the last."""
    if plan.select_every <= 0:
        return []
    return sorted({*range(plan.select_every - 1, plan.grpo_steps, plan.select_every), plan.grpo_steps - 1})


def score_checkpoint(plan: Plan, step: int, path: str, report: Report = print, events: Emit = _quiet) -> dict[str, Any]:
    """GRPO step `step`'s checkpoint's result on the `eval` split (select_eval_n tasks a family, select_samples rollouts each)."""
    n, tasks = select_tasks_of(plan)
    one = replace(plan, eval_splits=(SELECT_SPLIT,), eval_n=n, eval_samples=plan.select_samples, eval_tasks=tasks, timings=plan.timings)
    label = "select start" if step == START_STEP else f"select step {step}"
    result: dict[str, Any] = evaluate(one, policy(plan, path), label, report, events, wording=wording_of(plan.select_wordings))["splits"][SELECT_SPLIT]
    return result


# The plan fields the base, teacher and SFT stages depend on: a result whose plan agrees on them can lend those stages.
BEFORE_GRPO = ("harness", "model", "eval_splits", "eval_n", "train_n", "eval_samples", "families", "sft_epochs", "sft_lr",
               "max_tokens", "max_calls", "train_tasks", "eval_tasks", "teacher_samples", "teacher_mistakes", "teacher_templates", "seed", "dtype")


# the timing labels of the stages a reused result lends (its GRPO, selection scores and vLLM server are not lent)
LENT_STAGES = ("base", "teacher", "teacher-mistakes", "sft-train", "sft")


def reused_timings(timings: dict[str, float]) -> dict[str, float]:
    """The wall times of the stages an earlier result lends (`LENT_STAGES`, with their per-split evals), nothing else."""
    return {k: v for k, v in timings.items() if k.split("/")[0] in LENT_STAGES}


def reusable(plan: Plan, earlier: dict[str, Any]) -> None:
    """Raise ValueError unless `earlier` (a learning_curve.json) ran this plan's stages before GRPO and its SFT checkpoint is still there."""
    mine, default = plan.describe(), Plan().describe()  # a field the earlier plan predates ran as its default then
    theirs = {k: earlier["plan"].get(k, default[k]) for k in BEFORE_GRPO}
    differs = [k for k in BEFORE_GRPO if theirs[k] != mine[k]]
    if differs:
        raise ValueError("the earlier run's plan differs before GRPO in " + ", ".join(f"{k} ({theirs[k]!r} ≠ {mine[k]!r})" for k in differs))
    if not Path(earlier["checkpoints"]["sft"]).is_dir():
        raise ValueError(f"the earlier run's SFT checkpoint {earlier['checkpoints']['sft']} is gone")


def learning_curve(plan: Plan, out: Path, report: Report = print, reuse: dict[str, Any] | None = None,
                   events: Emit = _quiet) -> dict[str, Any]:
    """Every stage in order; writes learning_curve.json and learning_curve-<harness>.png into `out` and returns the result.

    `reuse`: an earlier result of the same plan up to SFT (see `reusable`) whose base and SFT stages and
    SFT checkpoint stand in for running them again (GRPO variants from one SFT checkpoint); their
    wall times count in `total_s` and the result names where they came from. `events` gets each stage's
    start, end and pass rates as they happen (`forgetui.learning_events`).
    """
    grpo_tasks(plan)  # a wordings setting that selects nothing fails here, not after the stages before GRPO
    plan.dtype = plan.compute_dtype()  # the result records what "fast" was on this machine
    if not 0.0 <= plan.grpo_merge <= 1.0:
        raise ValueError(f"grpo_merge {plan.grpo_merge}: in [0, 1] (1: GRPO's checkpoint as is, 0: SFT's)")
    if plan.select_every > 0:
        select_tasks_of(plan)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    events({"event": "start", "harness": plan.harness, "model": plan.model, "seed": plan.seed, "splits": list(plan.eval_splits),
            "plan": plan.describe(), "out": str(out)})
    if plan.sampler != "vllm" or plan.shared is not None:
        return _stages(plan, out, report, reuse, events, started)
    plan.shared = SharedVllm.for_model(plan.model, plan.server_options(), out / "vllm-server.log")
    try:
        events({"event": "phase", "phase": "vLLM server", "state": "running"})
        plan.timings["vllm-start"] = plan.shared.start()
        report(f"  vLLM server for the whole run at {plan.shared.base_url} (ready in {plan.timings['vllm-start']:.0f} s; log {out / 'vllm-server.log'})")
        events({"event": "phase", "phase": "vLLM server", "state": "done", "seconds": plan.timings["vllm-start"]})
        return _stages(plan, out, report, reuse, events, started)
    finally:
        plan.shared.stop()
        plan.shared = None


def _stages(plan: Plan, out: Path, report: Report, reuse: dict[str, Any] | None, events: Emit, started: float) -> dict[str, Any]:
    """`learning_curve`'s stages, in order, with whatever sampler the plan holds."""

    def phase(name: str, label: str, work: Callable[[], Any]) -> Any:
        events({"event": "phase", "phase": name, "state": "running"})
        value = work()
        events({"event": "phase", "phase": name, "state": "done", "seconds": plan.timings.get(label, 0.0)})
        return value

    if reuse is None:
        stages = [evaluate(plan, policy(plan, plan.model), "base", report, events)]
        teacher_runs = phase("teacher", "teacher", lambda: teach(plan, out, report))
        sft_ckpt = phase("SFT", "sft-train", lambda: sft(plan, teacher_runs, report))
        stages.append(evaluate(plan, policy(plan, sft_ckpt), "sft", report, events))
        lent = 0.0
    else:
        reusable(plan, reuse)
        stages, sft_ckpt = [s for s in reuse["stages"] if s["stage"] in ("base", "sft")], reuse["checkpoints"]["sft"]
        # its stages' times, not its vLLM server's (this run started its own, timed as it ran)
        plan.timings.update(reused_timings(reuse["timings_s"]))
        lent = sum(plan.timings.values())
        for stage in stages:
            for split, r in stage["splits"].items():
                report(split_line(stage["stage"], split, r) + "  (from the earlier run)")
                events({"event": "stage", "stage": stage["stage"], "split": split, "reused": True, **{k: r.get(k) for k in STAGE_KEYS}})
    grpo_ckpt, steps, selection = phase("GRPO", "grpo-train", lambda: grpo(plan, sft_ckpt, report, events))
    checkpoints = {"sft": sft_ckpt, "grpo": grpo_ckpt}
    if plan.grpo_merge < 1.0 and grpo_ckpt != sft_ckpt:
        checkpoints["grpo_unmerged"] = grpo_ckpt
        grpo_ckpt = checkpoints["grpo"] = phase("merge", "merge", lambda: merge_towards_sft(plan, sft_ckpt, grpo_ckpt, report))
    stages.append(evaluate(plan, policy(plan, grpo_ckpt), "grpo", report, events))
    result = {"plan": plan.describe(), "seed": plan.seed, "stages": stages, "grpo_steps": steps,
              "checkpoints": checkpoints, "timings_s": plan.timings,
              "total_s": lent + time.monotonic() - started, "plot": str(out / f"learning_curve-{plan.harness}.png")}
    if selection is not None:
        result["selection"] = {"split": SELECT_SPLIT, **selection}
    result["gains"] = {split: gains(result, split) for split in plan.eval_splits}
    events({"event": "done", "gains": result["gains"], "total_s": result["total_s"], "checkpoint": grpo_ckpt})
    if reuse is not None:
        result["reused"] = {"stages": ["base", "teacher", "sft"], "run_ids": [s["splits"][k]["run_id"] for s in stages[:2] for k in s["splits"]]}
    (out / "learning_curve.json").write_text(json.dumps(result, indent=2, default=str))
    plot(result, Path(result["plot"]))
    return result


def merge_towards_sft(plan: Plan, sft_ckpt: str, grpo_ckpt: str, report: Report = print) -> str:
    """The kept GRPO checkpoint moved back towards SFT by `plan.grpo_merge` (a model folder beside GRPO's checkpoints), timed."""
    started = time.monotonic()
    kept = Path(grpo_ckpt)
    out = kept.parent.parent / "merged" / f"{kept.name}-sft-{plan.grpo_merge:.2f}"
    interpolate(Path(sft_ckpt), kept, plan.grpo_merge, out)
    plan.timings["merge"] = time.monotonic() - started
    report(f"  merged: SFT + {plan.grpo_merge:.2f} × ({kept.name} − SFT) in {out} ({plan.timings['merge']:.0f} s)")
    return str(out)


def floors(result: dict[str, Any], split: str = FLOOR_SPLIT) -> tuple[float, float, bool]:
    """(SFT − base, GRPO − SFT, both floors met) on `split`: SFT ≥ base + SFT_FLOOR, GRPO ≥ SFT + GRPO_FLOOR, and where the
    result holds the paired GRPO − SFT interval, its lower bound above 0."""
    rates = [s["splits"][split]["pass_rate"] for s in result["stages"]]
    sft_gain, grpo_gain = rates[1] - rates[0], rates[2] - rates[1]
    interval = result.get("gains", {}).get(split, {}).get("grpo - sft", {}).get("ci")
    above_zero = interval is None or interval[0] > 0
    return sft_gain, grpo_gain, sft_gain >= SFT_FLOOR and grpo_gain >= GRPO_FLOOR and above_zero


def transfer(results: dict[str, dict[str, Any]], plan: Plan, report: Report = print, stage: str = "grpo",
             columns: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """Each trained harness's `stage` checkpoint evaluated in every harness of `columns` (default: the trained ones) on the
    plan's first eval split: {trained: {evaluated: result}}; a harness's own cell is its learning curve's."""
    split = plan.eval_splits[0]
    table: dict[str, dict[str, Any]] = {}
    for trained, result in results.items():
        ckpt = result["checkpoints"][stage]
        own = next(s for s in result["stages"] if s["stage"] == stage)["splits"][split]
        row = table.setdefault(trained, {trained: own})
        for other in columns or tuple(results):
            if other == trained:
                continue
            one = Plan(**{**plan.__dict__, "harness": other, "eval_splits": (split,), "timings": {}})
            row[other] = evaluate(one, policy(plan, ckpt), f"{stage} trained in {trained}, run in {other}", report)["splits"][split]
    return table
