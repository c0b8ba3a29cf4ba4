"""The learning benchmark's eval stage with each sampler, interleaved in one sitting: built-in backend vs a vLLM server.

    .venv/bin/python benchmarks/vllm_sampler.py [--harness react] [--split eval-phrasing] [--concurrency 32] [--rounds 1]
        [--model smollm2-135m | --checkpoint DIR] [--sft] [--order builtin,vllm | vllm,vllm-compiled | vllm,vllm-all-cores | vllm,vllm-bf16,builtin,builtin-bf16]

Each round runs `forgetui.learning.evaluate` (the plan's eval split, 5 tasks a family × 4 samples = 100 rollouts by
default) once per sampler, in `--order`, so load drifts on a shared machine hit both alike. The vLLM stage's wall time
includes starting its server (the run starts one for its model); the server's own ready time is printed beside it.
`--order vllm,vllm-compiled` compares the managed server's CPU default (eager) with vLLM's compilation
(`--no-enforce-eager`); `vllm-all-cores` is the server with VLLM_CPU_NUM_OF_RESERVED_CPU=0 (vLLM's CPU build keeps
one core for its scheduler process and runs the model on the rest); `vllm-bf16` and `builtin-bf16` sample in
bfloat16 instead of float32 (about 2x the matrix throughput where the CPU has native bfloat16); each row's per-family passes show whether the draws changed. `--sft` first records the teacher
and fine-tunes (in-process, as the learning benchmark does) and then evaluates the SFT checkpoint. Prints a table and
writes vllm_sampler.json into --out; the load (`uptime`) is read before and after each stage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# --order's sides, each (the plan's sampler, more vLLM spec options, more environment for the server it starts, the plan's
# dtype): the built-in backend and the managed vLLM server as a learning run has them; that server with vLLM's own
# compilation, not the CPU default (eager); with no core kept back for vLLM's scheduler process (its CPU build reserves
# one, leaving one of 2 cores to the model); either sampler in bfloat16, not float32 (on a CPU with native bfloat16)
SIDES: dict[str, tuple[str, str, dict[str, str], str]] = {
    "builtin": ("builtin", "", {}, "auto"),
    "vllm": ("vllm", "", {}, "auto"),
    "vllm-compiled": ("vllm", "&args=--no-enforce-eager", {}, "auto"),
    "vllm-all-cores": ("vllm", "", {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}, "auto"),
    "vllm-bf16": ("vllm", "", {}, "bfloat16"),
    "builtin-bf16": ("builtin", "", {}, "bfloat16"),
}


def use_side(plan: Any, side: str, options: str) -> dict[str, str]:
    """Set `plan`'s sampler, vLLM options (`options` plus the side's) and dtype for `side`; the server environment it adds."""
    plan.sampler, more_options, more_env, plan.dtype = SIDES[side]
    plan.vllm_options = options + more_options
    return more_env


class ReadyTimes(logging.Handler):
    """Catches the managed vLLM server's "ready in N s" log line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"ready in ([0-9.]+) s", record.getMessage())
        if found:
            self.seconds.append(float(found.group(1)))


def load() -> str:
    """The 1-minute load average (`uptime`'s first figure)."""
    out = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"load average: ([0-9.]+)", out)
    return found.group(1) if found else "?"


@contextlib.contextmanager
def patched_env(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set (the vLLM server a stage starts inherits them), restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--harness", default="react")
    parser.add_argument("--split", default="eval-phrasing")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--checkpoint", default=None, help="evaluate this checkpoint folder instead of --model")
    parser.add_argument("--sft", action="store_true", help="teach and fine-tune first (built-in, in-process), then evaluate the SFT checkpoint")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--eval-n", type=int, default=5)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--order", default="builtin,vllm")
    parser.add_argument("--vllm-options", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/vllm_sampler"))
    args = parser.parse_args()
    order = [s.strip() for s in args.order.split(",")]
    if unknown := [s for s in order if s not in SIDES]:
        parser.error(f"--order: unknown side(s) {', '.join(unknown)}; the sides are {', '.join(SIDES)}")

    from core.models.quiet import silence_third_party
    from forgetui.learning import Plan, evaluate, policy, sft, teach

    silence_third_party()
    ready = ReadyTimes()
    logging.getLogger("core.backends.vllm_server").addHandler(ready)
    logging.getLogger("core.backends.vllm_server").setLevel(logging.INFO)
    plan = Plan(harness=args.harness, model=args.model, eval_splits=(args.split,), eval_n=args.eval_n, eval_samples=args.eval_samples,
                concurrency=args.concurrency)
    if args.vllm_options is not None:
        plan.vllm_options = args.vllm_options
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.checkpoint or args.model
    if args.sft:
        model = sft(plan, teach(plan, args.out, print), print)
        print(f"SFT checkpoint {model}; teacher {plan.timings.get('teacher', 0):.0f} s, SFT {plan.timings.get('sft-train', 0):.0f} s", flush=True)
    rows = []
    options = plan.vllm_options
    for round_ in range(args.rounds):
        for sampler in order:
            more_env = use_side(plan, sampler, options)
            before, started, starts = load(), time.monotonic(), len(ready.seconds)
            with patched_env(more_env):
                result = evaluate(plan, policy(plan, model), f"{sampler} r{round_}", print)["splits"][args.split]
            row = {"round": round_, "sampler": sampler, "seconds": time.monotonic() - started, "pass_rate": result["pass_rate"],
                   "passed": result["passed"], "scored": result["scored"], "load_before": before, "load_after": load(),
                   "server_ready_s": ready.seconds[starts] if len(ready.seconds) > starts else None, "run_id": result["run_id"],
                   "by_family": result["by_family"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "vllm_sampler.json").write_text(json.dumps({"model": model, "plan": plan.describe(), "rows": rows}, indent=2))
    print("\n| round | sampler | wall s | of which server start s | passed | by family | load before → after |\n|---|---|---|---|---|---|---|")
    for r in rows:
        start = f"{r['server_ready_s']:.0f}" if r["server_ready_s"] is not None else "-"
        families = " ".join(f"{f} {p}" for f, (p, _) in sorted(r["by_family"].items()))
        print(f"| {r['round']} | {r['sampler']} | {r['seconds']:.0f} | {start} | {r['passed']}/{r['scored']} | {families} | {r['load_before']} → {r['load_after']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
