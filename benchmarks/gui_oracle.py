"""Oracle and do-nothing scores of the GUI environments (miniwob, desktop) in Docker: the README's table.

    .venv/bin/python benchmarks/gui_oracle.py [--env miniwob|desktop|all] [--instances 5] [--markdown]

Runs every task that ships a scripted oracle, `instances` seeded instances each, once with the
`oracle` harness and once with `noop`, and prints mean reward and pass counts per task.
Needs a Docker engine and the base image; builds the env's image on first use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(env: str, names: list[str], harness: str, instances: int) -> dict[str, list[float]]:
    """reward per rollout, by task name."""
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    sets = [
        f"env.name={env}", f"env.options.names={json.dumps(names)}", f"env.options.instances={instances}",
        f'harness.name="{harness}"', "runtime.kind=docker", "run.concurrency=2", "run.max_retries=1",
    ]  # fmt: skip
    summary = asyncio.run(execute_run(load_config(None, sets)))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        rows = con.execute("SELECT task_id, status, reward FROM rollouts").fetchall()
    finally:
        con.close()
    out: dict[str, list[float]] = defaultdict(list)
    for task_id, status, reward in rows:
        out[task_id.rsplit(".", 1)[0]].append(float(reward or 0.0) if status != "infra_error" else float("nan"))
    return out


def oracle_names(env: str) -> list[str]:
    if env == "miniwob":
        from envs.miniwob import ORACLE_TASKS

        return list(ORACLE_TASKS)
    from envs.desktop import DesktopEnv

    return [t.meta["task"] for t in DesktopEnv().tasks() if t.solution]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="all", choices=("miniwob", "desktop", "all"))
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    envs = ["miniwob", "desktop"] if args.env == "all" else [args.env]
    lines = ["| env | task | oracle mean | oracle passed | noop mean | noop passed |", "|---|---|---|---|---|---|"]
    for env in envs:
        names = oracle_names(env)
        oracle = run(env, names, "oracle", args.instances)
        noop = run(env, names, "noop", args.instances)
        for name in names:
            o, n = oracle.get(name, []), noop.get(name, [])
            lines.append(
                f"| {env} | {name} | {sum(o) / max(1, len(o)):.2f} | {sum(r >= 1.0 for r in o)}/{len(o)} "
                f"| {sum(n) / max(1, len(n)):.2f} | {sum(r >= 1.0 for r in n)}/{len(n)} |"
            )
    print("\n".join(lines) if args.markdown else "\n".join(line.replace("|", " ") for line in lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
