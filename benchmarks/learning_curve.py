"""Proof that it learns inside a real harness: base → SFT on a scripted teacher → GRPO, pass rate on held-out toy tasks.

    .venv/bin/python benchmarks/learning_curve.py --harness react|mini-swe-agent|pi [--split eval-phrasing|eval|both]
    .venv/bin/python benchmarks/learning_curve.py --transfer [--harness react,mini-swe-agent,pi]
    .venv/bin/python benchmarks/learning_curve.py --demo --harness mini-swe-agent   (the demo's schedule: minutes)

The toy env in Docker, SmolLM2-135M-Instruct on CPU, every model call through the real recording proxy,
all of it inside the chosen harness:
1. base: the model on the eval splits: `eval-phrasing` (instruction templates, file names and words no
   train task uses) and `eval` (train's templates, held-out parameters); `hello` is in neither;
2. teacher: a scripted policy that runs each train task's reference solution in the harness's own
   format (react: its bash tool; mini-swe-agent: reasoning text + one bash tool call a turn, then its
   submit command; pi: its `write` and `bash` tools), through the same harness;
3. SFT: full fine-tuning on the teacher's passing rollouts (loss on the teacher's sampled tokens only);
4. eval of the SFT checkpoint; 5. GRPO from it on the train split; 6. eval of the GRPO checkpoint.
Every pass rate is printed with its 95% bootstrap interval over tasks. Writes learning_curve.json and
learning_curve-<harness>.png (held-out pass rate per stage and split, train reward per GRPO step) into
--out/<harness>/. Exit code 0 when the floors hold on eval-phrasing: SFT ≥ base + 0.4, GRPO ≥ SFT + 0.1 with the paired interval's lower
bound above 0.

`--reuse PATH` takes the base and SFT stages (and the SFT checkpoint) from an earlier learning_curve.json
whose plan agrees up to SFT, and runs only GRPO and its eval: a GRPO variant in half the time.

`--transfer` reads each harness's learning_curve.json under --out and evaluates its GRPO (or, with
`--transfer-stage sft`, its SFT) checkpoint in the other harnesses on eval-phrasing: the 3×3 table of where
a policy was trained × where it runs. A harness without a learning curve yet is a column only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import get_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TUNABLE = ("train_n", "eval_n", "eval_samples", "sft_epochs", "sft_lr", "grpo_steps", "grpo_tasks_per_step", "grpo_samples",
           "grpo_lr", "grpo_warmup", "grpo_temperature", "grpo_extra_batches", "max_tokens", "max_calls", "concurrency", "max_batch", "timeout_s",
           "teacher_samples", "teacher_templates", "seed", "grpo_kl_coef", "grpo_entropy_coef", "grpo_call_discount", "grpo_stratify_by", "grpo_merge", "select_every",
           "select_eval_n", "select_samples", "select_patience", "grpo_wordings", "select_wordings", "select_start",
           "select_held_out")


def parse_args() -> argparse.Namespace:
    from forgetui.learning_recipe import Wordings

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--harness", default=None, help="react | mini-swe-agent | pi (comma-separated with --transfer; default: the "
                        "recipe's, else react)")
    parser.add_argument("--recipe", type=Path, default=None, help="a learning recipe (examples/learn/<harness>.toml): its schedule, "
                        "which the flags below override field by field")
    parser.add_argument("--split", default="both", choices=["eval-phrasing", "eval", "both"], help="held-out split(s) to evaluate on")
    parser.add_argument("--model", default=None, help="built-in model or local folder (default smollm2-135m; `tiny` to try the pipeline)")
    parser.add_argument("--sampler", default=None, choices=["builtin", "vllm"], help="where the stages sample: the built-in backend "
                        "(default) or one vLLM server the learning run starts, each stage's checkpoint reloaded into it (`make vllm`; GRPO's full-parameter updates reach it by reload)")
    parser.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "fast"], help="what every stage computes in, "
                        "sampling and training (default: the recipe's, else auto: float32 on a CPU; fast: bfloat16 where native, else float32)")
    parser.add_argument("--vllm-options", default=None, help="the vLLM server's spec options (default max_model_len=8192&kv_cache=4)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/learning_curve"))
    parser.add_argument("--reuse", type=Path, default=None, help="an earlier learning_curve.json of the same plan up to SFT: "
                        "its base and SFT stages and SFT checkpoint stand in for running them (GRPO variants)")
    parser.add_argument("--transfer", action="store_true", help="evaluate each harness's GRPO checkpoint in the other harnesses")
    parser.add_argument("--rows", default=None, help="with --transfer: the trained harnesses whose rows to run (default: every one with a "
                        "curve); rows already in transfer-<stage>.json for other harnesses are kept")
    parser.add_argument("--transfer-stage", default="grpo", choices=["sft", "grpo"], help="which checkpoint --transfer evaluates")
    parser.add_argument("--demo", action="store_true", help="the demo's schedule (tiny model, `hello`, evaluated on that train task: "
                        "the loop closing in the harness, not generalization; minutes)")
    for name in TUNABLE:
        if name == "select_start":
            parser.add_argument("--select-start", default=None, action=argparse.BooleanOptionalAction,
                                help="score GRPO's start (the SFT checkpoint) in the selection too, kept when no step beats it")
            continue
        if name.endswith("_wordings"):
            parser.add_argument("--" + name.replace("_", "-"), default=None, choices=get_args(Wordings))
            continue
        if name == "grpo_stratify_by":
            parser.add_argument("--grpo-stratify-by", default=None, metavar="KEY", help="deal each GRPO step's tasks round-robin "
                                "over this task meta key's values (family: every step holds every family)")
            continue
        kind = float if name.endswith(("_lr", "_temperature", "_coef", "_discount", "_merge")) else int
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    return parser.parse_args()


def make_plan(args: argparse.Namespace, harness: str):
    from forgetui.learning import DEMO, EVAL_SPLITS, Plan

    if args.demo:  # the demo's schedule; flags still override single fields
        plan = dataclasses.replace(DEMO, harness=harness, timings={})
    else:
        plan = Plan(harness=harness, eval_splits=EVAL_SPLITS if args.split == "both" else (args.split,))
    if getattr(args, "recipe", None) is not None:
        apply_recipe(plan, args.recipe)
    if args.model:
        plan.model = args.model
    if getattr(args, "sampler", None):
        plan.sampler = args.sampler
    if getattr(args, "vllm_options", None) is not None:
        plan.vllm_options = args.vllm_options
    if getattr(args, "dtype", None):
        plan.dtype = args.dtype
    for name in TUNABLE:
        if getattr(args, name) is not None:
            setattr(plan, name, getattr(args, name))
    return plan


def apply_recipe(plan, path: Path) -> None:
    """The recipe's fields onto `plan` (a field the plan does not have is refused unless the recipe leaves it at its default)."""
    from forgetui.learning_recipe import Recipe, load_recipe

    recipe = load_recipe(path)
    if recipe.harness != plan.harness:
        raise SystemExit(f"recipe {path} is for {recipe.harness}, not {plan.harness}: drop --harness or pick examples/learn/{plan.harness}.toml")
    defaults = Recipe(harness=recipe.harness).plan_fields()
    for name, value in recipe.plan_fields().items():
        if hasattr(plan, name):
            setattr(plan, name, value)
        elif value != defaults[name]:
            raise SystemExit(f"recipe {path}: {name} = {value!r} needs a learning plan that has {name} (this checkout's does not)")


def resolve_harness(args: argparse.Namespace) -> str:
    """--harness, else the recipe's harness, else react."""
    if args.harness:
        return args.harness
    if getattr(args, "recipe", None) is not None:
        from forgetui.learning_recipe import load_recipe

        return load_recipe(args.recipe).harness
    return "react"


def print_table(results: dict, splits: list[str]) -> None:
    from forgetui.learning_report import table

    print("\n" + table(results, splits))


def run_transfer(args: argparse.Namespace) -> int:
    from forgetui.learning import FLOOR_SPLIT, transfer

    harnesses = [h.strip() for h in args.harness.split(",")]
    results = {h: json.loads((args.out / h / "learning_curve.json").read_text()) for h in harnesses if (args.out / h / "learning_curve.json").exists()}
    if not results:
        print(f"no learning_curve.json under {args.out}/<harness>/: run `benchmarks/learning_curve.py --harness {harnesses[0]}` first", file=sys.stderr)
        return 2
    untrained = [h for h in harnesses if h not in results]
    if untrained:
        print(f"no learning curve for {', '.join(untrained)} yet: their rows are left out, their columns run", flush=True)
    if args.rows:
        rows = [h.strip() for h in args.rows.split(",")]
        missing = [h for h in rows if h not in results]
        if missing:
            print(f"no learning_curve.json under {args.out}/ for {', '.join(missing)}: --rows names trained harnesses", file=sys.stderr)
            return 2
        results = {h: results[h] for h in rows}
    plan = make_plan(args, harnesses[0])
    plan.eval_splits = (FLOOR_SPLIT,)
    plan.model = next(iter(results.values()))["plan"]["model"]
    stage = args.transfer_stage
    print(f"transfer: each trained harness's {stage} checkpoint in every harness, on {FLOOR_SPLIT}", flush=True)
    path = args.out / f"transfer-{stage}.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    table.update(transfer(results, plan, lambda line: print(line, flush=True), stage, tuple(harnesses)))
    path.write_text(json.dumps(table, indent=2, default=str))
    print("\n| trained in ↓ / run in → | " + " | ".join(harnesses) + " |")
    print("|" + "---|" * (len(harnesses) + 1))
    for trained, row in table.items():
        cells = [f"{row[h]['pass_rate']:.3f} [{row[h]['ci'][0]:.2f}, {row[h]['ci'][1]:.2f}] ({row[h]['passed']}/{row[h]['scored']})" if h in row else "not run"
                 for h in harnesses]
        print(f"| {trained} | " + " | ".join(cells) + " |")
    return 0


def main() -> int:
    args = parse_args()
    from core.models.quiet import silence_third_party

    silence_third_party()
    args.harness = resolve_harness(args)
    if args.transfer:
        return run_transfer(args)
    from forgetui.learning import FLOOR_SPLIT, GRPO_FLOOR, SFT_FLOOR, floors, learning_curve

    plan = make_plan(args, args.harness)
    from forgetui.learning_events import EventLog, new_log_path

    events = EventLog(new_log_path(plan.harness))
    print(f"learning curve: {plan.model} in {plan.harness}, held out: {', '.join(plan.eval_splits)}; seed {plan.seed}; "
          f"recipe {args.recipe or 'none'}; plan {plan.describe()}", flush=True)
    print(f"stages as they arrive: {events.path} (the TUI's Learning screen shows them)", flush=True)
    reuse = json.loads(args.reuse.read_text()) if args.reuse else None
    try:
        result = learning_curve(plan, args.out / plan.harness, lambda line: print(line, flush=True), reuse, events)
    except BaseException as exc:  # KeyboardInterrupt too: the screen says the run stopped, then the exit code does
        events({"event": "failed", "error": f"{type(exc).__name__}: {exc}"})
        raise
    result["recipe"] = str(args.recipe) if args.recipe else None
    result["events"] = str(events.path)
    (args.out / plan.harness / "learning_curve.json").write_text(json.dumps(result, indent=2, default=str))
    print_table({plan.harness: result}, list(plan.eval_splits))
    split = FLOOR_SPLIT if FLOOR_SPLIT in plan.eval_splits else plan.eval_splits[0]
    sft_gain, grpo_gain, ok = floors(result, split)
    print(f"\non {split}: SFT − base = {sft_gain:+.3f} (floor +{SFT_FLOOR}); GRPO − SFT = {grpo_gain:+.3f} (floor +{GRPO_FLOOR}, lower bound above 0); "
          f"{result['total_s'] / 60:.1f} min in all; seed {plan.seed}; plot: {result['plot']}")
    from forgetui.learning_report import paired_line

    for label, p in result["gains"].get(split, {}).items():
        print(paired_line(label.replace(" - ", " − "), p))
    print("wall time per stage (s): " + ", ".join(f"{k} {v:.0f}" for k, v in result["timings_s"].items()))
    split_s = {k: sum(float(m.get(k, 0.0)) for m in result["grpo_steps"]) for k in ("rollout_s", "prefill_s", "decode_s", "update_s")}
    print(f"GRPO steps: rollouts {split_s['rollout_s']:.0f} s (sampler: prefill {split_s['prefill_s']:.0f} s, decode {split_s['decode_s']:.0f} s; "
          f"the rest is harness, sandboxes and scoring), update {split_s['update_s']:.0f} s")
    return 0 if ok or args.demo else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:  # SIGINT/SIGTERM: the stage running has removed its sandboxes (core.run.signals)
        print(f"learning curve {exc or 'interrupted'}; the stages finished so far are in their runs' stores", file=sys.stderr)
        sys.exit(130)
