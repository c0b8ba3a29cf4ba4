"""`forgetui run|eval --no-ui`: progress on stderr (rich), one JSON summary on stdout."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from core.config import RunConfig
from core.eval.summary import RunSummary
from core.rollout.engine import RolloutEvent
from core.run import execute_run
from core.run.signals import cancel_on_signals
from core.status import Tally

_STYLE = {"done": "green", "failed": "red", "timeout": "yellow", "infra_error": "magenta"}


def policy_shown(config: RunConfig) -> str:
    """The policy as the progress line names it: `none` for a harness that calls no model, keys redacted."""
    from core.registry import model_shown_for

    return model_shown_for(config.policy.backend, config.harness.name)


async def run_headless_summary(config: RunConfig, *, console: Console, resume: str | None = None, ks: list[int] | None = None) -> RunSummary:
    """Run with a rich progress display on `console`; returns the summary."""
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[tally]}"), TimeElapsedColumn(), console=console, transient=False)
    tally = Tally()
    bar: dict[str, Any] = {}

    model = policy_shown(config)

    def on_start(run_id: str, total: int) -> None:
        console.print(f"run [cyan]{run_id}[/]: {total} rollouts of env [bold]{config.env.name}[/] × harness [bold]{config.harness.name}[/] with {model}")
        bar["id"] = progress.add_task("rollouts", total=total, tally="")

    def on_event(event: RolloutEvent) -> None:
        r = event.result
        tally.add(r.status, r.passed)
        style = _STYLE.get(str(r.status), "white")
        progress.console.print(f"  [{style}]{r.status:<11}[/] {event.rollout_id}  reward={r.reward if r.reward is not None else '-'}" + (f"  [dim]{r.error[:120]}[/]" if r.error else ""))
        if "id" in bar:
            progress.update(bar["id"], advance=1, tally=" ".join(f"{k}={v}" for k, v in tally.nonzero().items()))

    def on_step(m: dict[str, Any]) -> None:
        progress.console.print(step_line(m))

    with progress:
        return await cancel_on_signals(execute_run(config, resume=resume, on_event=on_event, on_start=on_start, on_step=on_step, ks=ks))


def step_line(m: dict[str, Any]) -> str:
    """One training step as a line: reward, pass rate, loss, KL, clip fraction, logprob agreement, time split."""
    return (
        f"[bold]step {m['step']}[/]  reward {m['reward_mean']:.3f}±{m['reward_std']:.3f}  pass {m['pass_rate']:.2f}  "
        f"loss {m['loss']:+.4f}  kl {m.get('kl', 0.0):.4f}  clip {m.get('pg_clipfrac', 0.0):.3f}  "
        f"trained {m['samples_trained']}/{m['samples']} samples ({m['zero_variance_groups']} flat groups)  "
        f"logprob Δmax {m.get('logprob_diff_max', 0.0):.1e}  rollouts {m['rollout_s']:.0f}s · update {m['update_s']:.0f}s"
    )


def run_headless(config: RunConfig, *, resume: str | None, json_out: bool, ks: list[int] | None = None) -> int:
    console = Console(stderr=True)
    try:
        summary = asyncio.run(run_headless_summary(config, console=console, resume=resume, ks=ks))
    except (asyncio.CancelledError, KeyboardInterrupt):
        console.print("[yellow]interrupted: every sandbox of the run was removed; `forgetui run --resume RUN_ID` finishes it[/]")
        return 130
    data = summary.to_json()
    if json_out:
        sys.stdout.write(json.dumps(data) + "\n")
    else:
        Console().print(eval_table(summary))
    return 0


def eval_table(summary: RunSummary) -> Table:
    """pass@k / pass^k / mean score per env × harness (and per level/domain), from the run's eval report."""
    report = summary.report or {"groups": []}
    ks = report.get("ks", [])
    table = Table(title=f"run {summary.run_id} — {summary.rollouts} rollouts, store {summary.store}")
    for col in ("env × harness", "slice", "tasks", "mean score", *[f"pass@{k}" for k in ks], *[f"pass^{k}" for k in ks], "timeouts", "infra errors"):
        table.add_column(col)

    def cells(m: dict) -> list[str]:
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        return [str(m["tasks"]), fmt(m["mean_score"]), *[fmt(m["pass_at_k"].get(str(k))) for k in ks], *[fmt(m["pass_hat_k"].get(str(k))) for k in ks]]

    for g in report["groups"]:
        table.add_row(f"{g['env']} × {g['harness']}", "all", *cells(g), str(g["timeouts"]), str(g["infra_errors"]))
        for key, values in g.get("breakdown", {}).items():
            for value, m in values.items():
                table.add_row("", f"{key}={value}", *cells(m), "", "")
    if summary.extra.get("eval_plot"):
        table.caption = f"plot: {summary.extra['eval_plot']}"
    return table
