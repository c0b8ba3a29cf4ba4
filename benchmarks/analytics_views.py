"""What the behaviour views cost on a store of long chat histories, against one JSON pass over the same requests.

    .venv/bin/python benchmarks/analytics_views.py [--rollouts 200] [--calls 20] [--result-chars 2000]

Synthetic rollouts recorded through the store's writer: each call's request carries the whole history
so far (every earlier tool call and its result, `--result-chars` characters each), its response one new
tool call, as a harness sends them. Timed: the baseline (`json_extract` of every request's messages,
one pass over the bytes every view must read at least once), `rollout_behaviour` (every per-rollout
metric) and `behaviour_summary`. Prints the ratios; no floor is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from core.store.behaviour import with_views  # noqa: E402
from core.store.writer import Store  # noqa: E402

COMMANDS = ("cat a.txt", "echo x > b.txt", "ls", "python3 run.py", "grep -c x log.txt", "false")


def record(store: Store, rollouts: int, calls: int, result_chars: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    store.insert_run("bench", {"policy": {"backend": "scripted:bench"}})
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("bash", "read_file", "write_file")]
    for r in range(rollouts):
        rid = f"bench/t{r % 20}/{r}"
        store.upsert_rollout({"rollout_id": rid, "run_id": "bench", "env": "toy", "task_id": f"t{r % 20}", "harness": "react", "status": "done",
                              "passed": rng.random() < 0.5, "reward": rng.random(), "attempt": 0})  # fmt: skip
        history = [{"role": "system", "content": "x" * 4000}, {"role": "user", "content": "do the task"}]
        for seq in range(calls):
            cmd = rng.choice(COMMANDS)
            tc = {"id": f"c{seq}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}
            store.record_call({"call_id": f"{rid}#{seq}", "rollout_id": rid, "seq": seq, "attempt": 0, "api": "chat", "status": "ok", "branch": 0,
                               "request": {"messages": list(history), "tools": tools}, "response": {"choices": [{"message": {"role": "assistant", "tool_calls": [tc]}}]},
                               "completion_token_ids": [1] * 20, "prompt_token_ids": [1] * (100 * (seq + 1))})  # fmt: skip
            code = 1 if cmd == "false" else 0
            history += [{"role": "assistant", "tool_calls": [tc]}, {"role": "tool", "tool_call_id": f"c{seq}", "content": f"exit code: {code}\n" + "y" * result_chars}]
    store.flush()


def timed(store: Store, sql: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        store.cursor().execute(sql).fetchall()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=200)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--result-chars", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "store.duckdb")
        t0 = time.perf_counter()
        record(store, args.rollouts, args.calls, args.result_chars)
        size = store.cursor().execute("SELECT sum(len(request::VARCHAR)) FROM call_requests").fetchone()[0]
        print(f"recorded {args.rollouts} rollouts x {args.calls} calls ({size / 1e6:.0f} MB of requests) in {time.perf_counter() - t0:.1f} s")
        base = timed(store, "SELECT sum(len(json_extract(request, '$.messages[*]'))) FROM call_requests")
        per_rollout = timed(store, with_views("SELECT * FROM rollout_behaviour"))
        summary = timed(store, with_views("SELECT * FROM behaviour_summary"))
        store.close()
    print(f"baseline (one JSON pass over the requests): {base:.3f} s")
    print(f"rollout_behaviour: {per_rollout:.3f} s ({per_rollout / base:.1f}x the baseline, {args.rollouts / per_rollout:.0f} rollouts/s)")
    print(f"behaviour_summary: {summary:.3f} s ({summary / base:.1f}x the baseline)")


if __name__ == "__main__":
    main()
