"""claw-bench's own correctness check: all 222 tasks with the `oracle` harness (reference solutions) and with `noop`.

    .venv/bin/python benchmarks/claw_bench_oracle.py [--concurrency 2] [--harness oracle,noop] [--domains a,b] [--tasks id,glob]

Runs through the real engine in Docker (needs dockerd and forgetui/base:bookworm). Prints per-domain
pass counts, the totals, and every oracle failure with the verifier's reason. Exit code 0 only when
the floors hold: oracle passes at least 215 of 222, noop passes none.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ORACLE_FLOOR = 215


def run(harness: str, concurrency: int, domains: list[str] | None, tasks: list[str] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """One run of every selected task with `harness`; returns the summary and one row per rollout."""
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    sets = ["env.name=claw-bench", f'harness.name="{harness}"', "runtime.kind=docker", f"run.concurrency={concurrency}", "run.max_retries=1"]
    if tasks:
        sets.append(f"env.tasks={json.dumps(tasks)}")
    config = load_config(None, sets)
    if domains:
        config.env.options = {"domains": domains}
    summary = asyncio.run(execute_run(config))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        cur = con.execute("SELECT task_id, status, reward, passed, error, meta FROM rollouts ORDER BY task_id")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    return summary, rows


_DOMAINS: dict[str, str] = {}


def domain_of(row: dict[str, Any]) -> str:
    if not _DOMAINS:
        from envs.claw_bench import ClawBenchEnv

        _DOMAINS.update({t.id: t.domain for t in ClawBenchEnv().selected()})
    return _DOMAINS.get(row["task_id"], "?")


def verifier_reason(row: dict[str, Any]) -> str:
    meta = json.loads(row["meta"]) if isinstance(row["meta"], str) else (row["meta"] or {})
    parts = [f"status={row['status']} reward={row['reward']}"]
    if row.get("error"):
        parts.append(f"error: {row['error'][:400]}")
    if meta.get("verifier"):
        parts.append(str(meta["verifier"])[:800])
    if row["status"] != "done" and meta.get("stderr_tail"):
        parts.append("harness stderr: " + meta["stderr_tail"][-400:])
    return "\n    ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--harness", default="oracle,noop", help="comma-separated: oracle, noop")
    ap.add_argument("--domains", default=None, help="comma-separated domains (default: all)")
    ap.add_argument("--tasks", default=None, help="comma-separated task ids or globs (default: all)")
    args = ap.parse_args(argv)
    os.environ.setdefault("FORGETUI_HOME", tempfile.mkdtemp(prefix="forgetui-claw-"))
    domains = args.domains.split(",") if args.domains else None
    results: dict[str, list[dict[str, Any]]] = {}
    for harness in args.harness.split(","):
        start = time.monotonic()
        summary, rows = run(harness, args.concurrency, domains, args.tasks.split(",") if args.tasks else None)
        results[harness] = rows
        print(f"\n== {harness}: run {summary.run_id}, {len(rows)} rollouts in {time.monotonic() - start:.0f} s, infra errors {summary.infra_errors}, timeouts {summary.timeouts}")
        per: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for row in rows:
            per[domain_of(row)][1] += 1
            per[domain_of(row)][0] += bool(row["passed"])
        for domain in sorted(per):
            print(f"  {domain:22s} {per[domain][0]:3d}/{per[domain][1]}")
        print(f"  {'TOTAL':22s} {sum(bool(r['passed']) for r in rows):3d}/{len(rows)}")
    ok = True
    if "oracle" in results:
        rows = results["oracle"]
        fails = [r for r in rows if not r["passed"]]
        print(f"\n== oracle failures ({len(fails)}):")
        for row in fails:
            print(f"  {row['task_id']} [{domain_of(row)}]\n    {verifier_reason(row)}")
        if not domains and not args.tasks:
            ok &= len(rows) - len(fails) >= ORACLE_FLOOR
    if "noop" in results:
        passed = [r["task_id"] for r in results["noop"] if r["passed"]]
        print(f"\n== noop passes ({len(passed)}): {', '.join(passed) or 'none'}")
        ok &= not passed
    print("\nfloors " + ("hold" if ok else f"FAIL (oracle >= {ORACLE_FLOOR}/222, noop 0)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
