"""Rollout throughput: 64 trivial rollouts through forgetui's engine vs a plain loop of `docker run`.

    .venv/bin/python benchmarks/rollout_throughput.py [--rollouts 64] [--concurrency 4,16] [--repeat 3] [--network isolated|host]

Both sides do the same work per rollout in a fresh container from the same base image: make a
workspace, write hello.txt, check it. forgetui also runs its proxy, records every rollout in
DuckDB, verifies through the env's verifier and removes the container. Prints sandbox start
p50/p99, rollouts per minute, the ratio forgetui / plain loop (floor: >= 0.8x) and the peak memory
(RSS) of the forgetui process. Needs a Docker engine and `forgetui images bootstrap`.

Both sides isolate the same way: with forgetui's default `runtime.network = "isolated"` (a sandbox
with loopback only) the plain loop runs `docker run --network none`; with `--network host` both use
the host's network. A network namespace of its own costs the engine ~0.3 s per container here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.env import Task  # noqa: E402
from core.harness import Endpoint, Harness, LaunchSpec  # noqa: E402

BASE = "forgetui/base:bookworm"
WORK = "mkdir -p /workspace && cd /workspace && echo hi > hello.txt && test \"$(cat hello.txt)\" = hi"


class TrivialHarness(Harness):
    """Writes hello.txt and exits: no model call, so the numbers are the engine's own."""

    name = "trivial"
    version = "1"

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        return LaunchSpec(command=["bash", "-c", "echo hi > hello.txt"])


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


PLAIN_NETWORK = {"isolated": "none", "host": "host"}  # the plain loop's equivalent of forgetui's runtime.network
NETWORK = "isolated"


async def plain_loop(n: int, concurrency: int) -> tuple[float, list[float]]:
    """`docker run --rm` n times, `concurrency` at once; returns (wall seconds, per-container seconds)."""
    slots = asyncio.Semaphore(concurrency)
    durations: list[float] = []

    async def one() -> None:
        async with slots:
            t = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                "docker", "run", "--rm", "--network", PLAIN_NETWORK[NETWORK], BASE, "bash", "-c", WORK, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"docker run failed: {err.decode()[-500:]}")
            durations.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - t0, durations


def forgetui_run(n: int, concurrency: int, script: Path) -> tuple[float, list[float], dict]:
    from core.config import load_config
    from core.run import execute_run

    config = load_config(
        None,
        [
            "env.name=toy",
            'env.tasks=["hello"]',
            'harness.name="__main__:TrivialHarness"',
            f'policy.backend="scripted:{script}"',
            "runtime.kind=docker",
            f"runtime.network={NETWORK}",
            f"run.n_samples={n}",
            f"run.concurrency={concurrency}",
            "run.max_retries=0",
        ],
    )
    t0 = time.perf_counter()
    summary = asyncio.run(execute_run(config, ks=[1]))
    wall = time.perf_counter() - t0
    import duckdb

    con = duckdb.connect(summary.store, read_only=True)
    metas = [json.loads(m) for (m,) in con.execute("SELECT meta FROM rollouts WHERE status = 'done'").fetchall()]
    (span, mean_total) = con.execute(
        "SELECT epoch(max(ended_at)) - epoch(min(started_at)), avg(epoch(ended_at) - epoch(started_at)) FROM rollouts"
    ).fetchone()
    con.close()
    starts = [m["timings"]["sandbox_start_s"] for m in metas]
    phases = {k: statistics.mean(m["timings"][k] for m in metas) for k in metas[0]["timings"]} if metas else {}
    out = summary.to_json()
    out.update(span_s=span, mean_rollout_s=mean_total, phases=phases)
    return wall, starts, out


def warm_up(script: Path) -> float:
    """One-time caches both sides would have on a used machine: the built-in tokenizer (built on first
    use in a fresh FORGETUI_HOME), the image's layers in the page cache. Returns its seconds."""
    from core.models.resolve import resolve_model

    t = time.perf_counter()
    resolve_model("tiny")
    asyncio.run(plain_loop(4, 4))
    forgetui_run(4, 4, script)
    return time.perf_counter() - t


def median_by(runs: list, key) -> object:
    return sorted(runs, key=key)[len(runs) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--concurrency", default="4,16")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side per setting, alternating; the median counts")
    parser.add_argument("--network", choices=sorted(PLAIN_NETWORK), default="isolated", help="forgetui's runtime.network; the plain loop isolates the same way")
    args = parser.parse_args()
    global NETWORK
    NETWORK = args.network
    os.environ.setdefault("FORGETUI_HOME", tempfile.mkdtemp(prefix="forgetui-bench-home-"))
    script = Path(os.environ["FORGETUI_HOME"]) / "script.json"
    script.write_text(json.dumps({"turns": [{"text": "done"}]}))
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode != 0:
        print(f"{BASE} is missing: run `forgetui images bootstrap` first", file=sys.stderr)
        return 2
    n = args.rollouts
    print(f"rollout throughput: {n} trivial rollouts per run, {args.repeat} runs of each side per setting (median shown), network {NETWORK} (plain: --network {PLAIN_NETWORK[NETWORK]}); load average at start {os.getloadavg()}")
    print(f"warm-up (tokenizer cache, 4 rollouts each side): {warm_up(script):.1f} s")
    print(f"{'c':>3} {'path':<10} {'wall s':>8} {'rollouts/min':>13} {'start p50 s':>12} {'start p99 s':>12}")
    verdict = True
    for c in [int(x) for x in args.concurrency.split(",")]:
        plains, ours = [], []
        for _ in range(args.repeat):  # alternate, so a noisy spell on the machine hits both sides
            plains.append(asyncio.run(plain_loop(n, c)))
            ours.append(forgetui_run(n, c, script))
        plain_wall, plain_d = median_by(plains, key=lambda r: r[0])
        fw, starts, summary = median_by(ours, key=lambda r: r[0])
        assert all(r[2]["passed"] == n for r in ours), [r[2] for r in ours]
        plain_rpm, f_rpm = n / plain_wall * 60, n / fw * 60
        print(f"{c:>3} {'docker run':<10} {plain_wall:>8.2f} {plain_rpm:>13.1f} {pct(plain_d, .5):>12.3f} {pct(plain_d, .99):>12.3f}   (whole `docker run --rm` per rollout; runs {' '.join(f'{r[0]:.2f}' for r in plains)} s)")
        print(f"{c:>3} {'forgetui':<10} {fw:>8.2f} {f_rpm:>13.1f} {pct(starts, .5):>12.3f} {pct(starts, .99):>12.3f}   (sandbox start only; max concurrent {summary['max_concurrent_sandboxes']}; runs {' '.join(f'{r[0]:.2f}' for r in ours)} s)")
        phases = " ".join(f"{k}={v:.3f}" for k, v in summary["phases"].items())
        fixed = fw - summary["span_s"]
        print(f"    forgetui: rollouts span {summary['span_s']:.2f} s of the {fw:.2f} s run; {fixed:.2f} s is start-up and finish (store, proxy, eval report); mean rollout {summary['mean_rollout_s']:.2f} s: {phases}")
        ratio = f_rpm / plain_rpm
        ok = ratio >= 0.8
        verdict &= ok
        print(f"    ratio forgetui / plain loop at c={c}: {ratio:.2f}x whole run [{'PASS' if ok else 'FAIL'}] (floor 0.8x); {plain_wall / summary['span_s']:.2f}x over the rollouts' span alone")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the forgetui process: {peak_mb:.0f} MB (includes the proxy, the tokenizer and the store)")
    print(f"overall: {'PASS' if verdict else 'FAIL'}; load average at end {os.getloadavg()}")
    return 0 if verdict else 1


if __name__ == "__main__":
    raise SystemExit(main())
