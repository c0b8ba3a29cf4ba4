"""mini-swe-agent's two model clients in the learning benchmark's eval stage: forgetui's `requests` model against LiteLLM.

    .venv/bin/python benchmarks/mini_client.py [--samples 2] [--rounds 1] [--concurrency 16] [--sampler builtin]

The base model (SmolLM2-135M) in mini-swe-agent on the toy env's `eval-phrasing` split (25 tasks × --samples), the
learning benchmark's limits (96 tokens a call, 2 steps a rollout), each rollout in its own Docker sandbox: once with
the harness option `client = "requests"` (the default: mini's OpenRouter model sent to the proxy, no LiteLLM) and once
with `client = "litellm"` (mini's own default model), alternating --rounds times. Both sides sample the same model with
the same sampler, so the difference is the client's cost in each sandbox. Prints each side's wall seconds, the
machine's busy CPU seconds (from /proc/stat) and pass rate, and the ratios LiteLLM / requests. Needs Docker and the
base image.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLIENTS = ("requests", "litellm")


def busy_cpu_s() -> float:
    """Seconds every core of this machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = sum(fields) - fields[3] - fields[4]
    return ticks / os.sysconf("SC_CLK_TCK")


def eval_once(client: str, samples: int, concurrency: int, sampler: str) -> tuple[float, float, float]:
    """One base-model eval with mini-swe-agent's `client`: (wall seconds, busy CPU seconds, pass rate)."""
    from forgetui import learning

    learning.HARNESS_OPTIONS["mini-swe-agent"] = {**learning.HARNESS_OPTIONS["mini-swe-agent"], "client": client}
    plan = learning.Plan(harness="mini-swe-agent", eval_splits=("eval-phrasing",), eval_n=5, eval_samples=samples,  # 25 tasks, as measured
                         concurrency=concurrency, sampler=sampler)
    cpu, started = busy_cpu_s(), time.monotonic()
    result = learning.evaluate(plan, learning.policy(plan, plan.model), f"base, {client} client")
    wall, cpu = time.monotonic() - started, busy_cpu_s() - cpu
    return wall, cpu, float(result["splits"]["eval-phrasing"]["pass_rate"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2, help="rollouts per task (25 tasks)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sampler", default="builtin", choices=("builtin", "vllm"))
    args = parser.parse_args()
    seen: dict[str, list[tuple[float, float, float]]] = {c: [] for c in CLIENTS}
    for _ in range(args.rounds):
        for client in CLIENTS:
            seen[client].append(eval_once(client, args.samples, args.concurrency, args.sampler))
            wall, cpu, rate = seen[client][-1]
            print(f"{client}: {wall:.0f} s wall, {cpu:.0f} CPU-s busy, pass rate {rate:.2f}", flush=True)
    wall = {c: statistics.median(r[0] for r in seen[c]) for c in CLIENTS}
    cpu = {c: statistics.median(r[1] for r in seen[c]) for c in CLIENTS}
    print(f"mini-swe-agent base eval ({25 * args.samples} rollouts, concurrency {args.concurrency}, {args.sampler} sampler): "
          f"requests {wall['requests']:.0f} s / {cpu['requests']:.0f} CPU-s, litellm {wall['litellm']:.0f} s / {cpu['litellm']:.0f} CPU-s: "
          f"litellm / requests {wall['litellm'] / wall['requests']:.2f}x wall, {cpu['litellm'] / cpu['requests']:.2f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
