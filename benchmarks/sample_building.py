"""How fast recorded calls become training samples (floor: 10,000 calls/s on long histories).

    .venv/bin/python benchmarks/sample_building.py [--rollouts 40] [--calls 50] [--system 4096]

Synthetic rollouts: a shared system prompt of `--system` tokens, then `--calls` calls per rollout,
each prompt = the previous call's prompt + completion + a tool result (every call merges, so every
prefix check runs over the whole history). Timed four ways: `build_samples` on list rows, on numpy
rows, and `samples_for_run` end to end from a DuckDB store holding full prompts (schema 2's form) and
one holding compact prompts (a parent reference + the new ids, what the proxy records). The floor
applies to the compact store, end to end.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from core.store.writer import Store  # noqa: E402
from core.train.samples import build_samples, samples_for_run  # noqa: E402

log = logging.getLogger("sample_building")
FLOOR_CALLS_PER_S = 10_000


def synthetic_rollout(
    rng: random.Random, rollout_id: str, n_calls: int, system: list[int]
) -> tuple[dict, list[dict]]:
    """One rollout row and its calls: a growing conversation, every call extending the last."""
    prompt = [*system, *(rng.randrange(5, 50_000) for _ in range(60))]
    calls = []
    for seq in range(n_calls):
        completion = [rng.randrange(5, 50_000) for _ in range(rng.randrange(20, 80))]
        logprobs = [-rng.random() for _ in completion]
        calls.append(
            {
                "call_id": f"{rollout_id}-{seq}",
                "rollout_id": rollout_id,
                "seq": seq,
                "status": "ok",
                "prompt_token_ids": prompt,
                "completion_token_ids": completion,
                "completion_logprobs": logprobs,
                "weights_version": 0,
                "extends_parent": seq > 0,
                "branch": 0,
            }
        )
        prompt = [*prompt, *completion, *(rng.randrange(5, 50_000) for _ in range(rng.randrange(20, 120)))]
    rollout = {
        "rollout_id": rollout_id,
        "run_id": "bench",
        "task_id": "t",
        "step": 0,
        "reward": 1.0,
        "status": "done",
    }
    return rollout, calls


def compact(calls: list[dict]) -> list[dict]:
    """The same rows as the recorder stores them: after the first call, the parent reference + only the new ids."""
    out = []
    for seq, c in enumerate(calls):
        if seq == 0:
            out.append(c)
            continue
        parent = calls[seq - 1]
        n = len(parent["prompt_token_ids"]) + len(parent["completion_token_ids"])
        assert c["prompt_token_ids"][:n] == parent["prompt_token_ids"] + parent["completion_token_ids"]
        out.append(
            {**c, "prompt_token_ids": None, "prompt_new_token_ids": c["prompt_token_ids"][n:], "parent_call_id": parent["call_id"], "prefix_tokens": n}
        )
    return out


def store_rate(tmp: Path, name: str, data: list[tuple[dict, list[dict]]], n: int) -> tuple[float, int]:
    """calls/s of `samples_for_run` from a store holding `data`, and the store file's size."""
    path = tmp / f"{name}.duckdb"
    with Store.open(path) as store:
        store.insert_run("bench", {})
        for rollout, calls in data:
            store.upsert_rollout(rollout)
            for c in calls:
                store.record_call(c)
        store.flush()
        calls_per_s = rate(lambda: samples_for_run(store, "bench"), n)
    return calls_per_s, path.stat().st_size


def as_arrays(calls: list[dict]) -> list[dict]:
    """The same rows with numpy token columns, as DuckDB's fetchnumpy hands them over."""
    cols = {"prompt_token_ids": np.int32, "completion_token_ids": np.int32, "completion_logprobs": np.float64}
    return [{**c, **{k: np.asarray(c[k], dtype=t) for k, t in cols.items()}} for c in calls]


def rate(fn, n_calls: int, repeat: int = 3) -> float:
    """Best calls/s over `repeat` runs of `fn`."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return n_calls / best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--system", type=int, default=4096)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    rng = random.Random(0)
    system = [rng.randrange(5, 50_000) for _ in range(args.system)]
    data = [synthetic_rollout(rng, f"r{i}", args.calls, system) for i in range(args.rollouts)]
    arrays = [(r, as_arrays(c)) for r, c in data]
    n = args.rollouts * args.calls
    mean_prompt = sum(len(c["prompt_token_ids"]) for _, cs in data for c in cs) / n
    results = {
        "build (list rows)": rate(lambda: [build_samples(r, c) for r, c in data], n),
        "build (numpy rows)": rate(lambda: [build_samples(r, c) for r, c in arrays], n),
    }
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows in (("full prompts", data), ("compact", [(r, compact(c)) for r, c in data])):
            results[f"samples_for_run ({name})"], sizes[name] = store_rate(Path(tmp), name.split()[0], rows, n)
    print(
        f"{args.rollouts} rollouts x {args.calls} calls, system prompt {args.system} tokens, mean prompt {mean_prompt:.0f} tokens"
    )
    for name, calls_per_s in results.items():
        print(f"{name:32s} {calls_per_s:10,.0f} calls/s")
    for name, size in sizes.items():
        print(f"store file ({name}){'':{max(0, 18 - len(name))}s} {size / 1e6:10,.1f} MB")
    ok = results["samples_for_run (compact)"] >= FLOOR_CALLS_PER_S
    print(f"{'PASS' if ok else 'FAIL'}: floor {FLOOR_CALLS_PER_S:,} calls/s (samples_for_run end to end, compact store)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
