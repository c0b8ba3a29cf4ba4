"""`forgetui analyze`, `forgetui compare` and `forgetui replay`: behaviour metrics, two runs side by side, deterministic replay."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

EXIT_DIVERGED = 3  # `forgetui replay` when the replay differs from the recording (scripts and CI can test for it)


def _print(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _render(*renderables: Any) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False)
    for item in renderables:
        console.print(item)
    return console.file.getvalue()  # type: ignore[attr-defined]


def cmd_analyze(args: argparse.Namespace) -> int:
    from rich.table import Table

    from core.analytics.metrics import GROUPINGS, behaviour_table, display_rows, tool_usage
    from core.analytics.plot import group_label, write_behaviour_plot

    table = behaviour_table(args.runs, by=args.by)
    keys = GROUPINGS[args.by]
    out: dict[str, Any] = {"by": args.by, "groups": table, "tool_usage": tool_usage(args.runs)}
    if args.plot:
        out["plot"] = str(write_behaviour_plot(table, keys, Path(args.plot)))
    if args.format == "json":
        _print(json.dumps(out, indent=2, default=str))
        return 0
    header, rows = display_rows(table, args.by)
    grid = Table(header[0], *(f"{group_label(row, keys)}\nn={row['rollouts']}" for row in table), title="behaviour")
    for cells in rows:
        grid.add_row(*cells)
    tools = Table("run", "harness", "tool", "class", "calls", "rollouts", "failed", title="calls per tool")
    for row in out["tool_usage"]:
        tools.add_row(str(row["run_id"])[-24:], row["harness"], row["tool"], row["class"], str(row["calls"]), str(row["rollouts"]), str(row["failed"]))
    _print(_render(grid, tools) + (f"plot: {out['plot']}\n" if args.plot else ""))
    return 0


def _side(d: dict[str, Any]) -> str:
    return f"{d['passed']}/{d['n']} ({d['reward']:.2f})"


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.table import Table

    from core.analytics.compare import compare_runs
    from core.analytics.metrics import format_estimate

    ks = [int(k) for k in args.k.split(",")] if args.k else None
    result = compare_runs(args.run_a, args.run_b, ks)
    if args.format == "json":
        _print(json.dumps(result, indent=2, default=str))
        return 0
    tasks = Table("task", "A passed (reward)", "B passed (reward)", "Δ pass rate", "Δ reward", "flip", title=f"A = {args.run_a}   B = {args.run_b}")
    for t in result["tasks"]:
        tasks.add_row(t["task"], _side(t["a"]), _side(t["b"]), f"{t['delta_pass_rate']:+.2f}", f"{t['delta_reward']:+.2f}", t["flip"] or "")
    pk = Table("metric", "A", "B", "B − A (paired bootstrap 95% CI)", title="pass@k / pass^k over the tasks both ran")
    for row in result["pass_k"]:
        pk.add_row(row["metric"], format_estimate(row["a"]), format_estimate(row["b"]), format_estimate(row["delta"]))
    deltas = Table("behaviour", "A", "B", "B − A (paired bootstrap 95% CI)", title="behaviour metrics")
    for row in result["metrics"]:
        deltas.add_row(row["label"], format_estimate(row["a"]), format_estimate(row["b"]), format_estimate(row["delta"]))
    notes = [f"flipped: {len(result['flipped'])} ({', '.join(t['task'] + ' ' + t['flip'] for t in result['flipped']) or 'none'})"]
    if result["only_a"] or result["only_b"]:
        notes.append(f"tasks in one run only (left out): A {len(result['only_a'])}, B {len(result['only_b'])}")
    _print(_render(tasks, pk, deltas, *notes))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from core.run.replay import replay_rollout

    report = asyncio.run(replay_rollout(args.rollout_id, store=Path(args.store) if args.store else None, image=args.image, harness_version=args.harness_version))
    if args.format == "json":
        _print(json.dumps(report.to_json(), indent=2, default=str))
        return EXIT_DIVERGED if report.diverged else 0
    lines = [
        f"replayed {report.rollout_id} as {report.replay_rollout_id}: {report.replayed_calls} calls (recorded {report.recorded_calls}), "
        f"score {report.replayed_score} (recorded {report.recorded_score})"
    ]
    for key, (was, now) in report.changed.items():
        lines.append(f"  {key} changed: {was} → {now}")
    if report.volatile_calls:
        lines.append(f"  calls {report.volatile_calls}: prompts differ only in text the harness varies on every run (ids, times, dates)")
    if report.first is None:
        lines.append("no divergence: the harness reproduced the recording")
    else:
        first = report.first
        lines.append(f"FIRST DIVERGENCE ({first.kind}): {first.detail}")
        if first.recorded is not None:
            lines += ["  recorded: " + repr(first.recorded), "  replayed: " + repr(first.replayed)]
        for later in report.divergences[1:]:
            lines.append(f"  then ({later.kind}): {later.detail}")
    _print("\n".join(lines))
    return EXIT_DIVERGED if report.diverged else 0


def register(sub: Any) -> None:
    """Add the analyze, compare and replay subcommands to the CLI's subparsers."""
    p = sub.add_parser("analyze", help="behaviour metrics of runs (tool coverage, self-verification, error recovery, plan completion, effort) with CIs")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run ids (or store.duckdb paths)")
    p.add_argument("--by", choices=["harness", "model", "step"], help="pool runs per env × this (default: per run × env × harness × model × step)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--plot", metavar="PATH", help="also write a PNG comparing the groups")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("compare", help="run B against run A: per task, flipped tasks, pass@k/pass^k and behaviour deltas with paired bootstrap CIs")
    p.add_argument("run_a", metavar="RUN_A", help="the baseline run (id or store path)")
    p.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
    p.add_argument("-k", help="the ks of pass@k / pass^k, comma-separated (default: 1..the fewest samples a task has)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("replay", help="re-run a recorded rollout in a fresh sandbox against its recorded answers; report the first divergence")
    p.add_argument("rollout_id", metavar="ROLLOUT_ID", help="e.g. 20261201-061519-a8e9/hello/0")
    p.add_argument("--store", help="the store that recorded it (default: its run's store)")
    p.add_argument("--image", metavar="TAG", help="the sandbox base image to build on instead of the recorded run's (e.g. a rebuilt one)")
    p.add_argument("--harness-version", metavar="V", help="replay under this published release of the harness (npm/PyPI harnesses; default: the recorded run's)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_replay)
