"""Run stores for the TUI's tests and benchmark, written through the real writer (`core.store.writer.Store`).

Each rollout's calls extend each other token for token (call k+1's prompt = call k's prompt + completion +
new ids) and are stored compactly as the recorder stores them (parent + new ids), so the samples built from
them are real merged samples.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.store.writer import Store

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)
STATUSES = ("done", "done", "failed", "timeout", "done", "infra_error")


def words(tokenizer: Any | None, text: str, rng: random.Random) -> list[int]:
    """Token ids of `text` under `tokenizer`, or pseudo-random ids (one per word) without one."""
    if tokenizer is not None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    return [rng.randrange(5, 500) for _ in text.split()]


def call_rows(rollout_id: str, n_calls: int, tokenizer: Any | None, rng: random.Random, start: dt.datetime,
              system_tokens: int = 0) -> list[dict[str, Any]]:
    """`n_calls` chat calls of one rollout, each extending the previous one's prompt + completion."""
    rows: list[dict[str, Any]] = []
    prompt = [rng.randrange(5, 500) for _ in range(system_tokens)] + words(tokenizer, "You are terse. Say hello.", rng)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                      {"role": "user", "content": "Say hello."}]
    for seq in range(n_calls):
        said = f"step {seq}: I will write hello"
        completion = words(tokenizer, said, rng)
        tool = {"id": f"t{seq}", "type": "function",
                "function": {"name": "shell", "arguments": f'{{"command": "echo hi > hello{seq}.txt"}}'}}
        rows.append({
            "call_id": f"{rollout_id}#c{seq}", "rollout_id": rollout_id, "seq": seq, "attempt": 1, "api": "chat",
            "model": "policy",
            "request": {"model": "policy", "messages": list(messages), "tools": [
                {"type": "function", "function": {"name": "shell", "description": "run a shell command",
                                                  "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": said, "tool_calls": [tool]}}]},
            # stored as the recorder stores them: a call extending its parent keeps only the new ids
            "prompt_token_ids": None if rows else list(prompt),
            "prompt_new_token_ids": prompt[rows[-1]["_end"]:] if rows else None,
            "prefix_tokens": rows[-1]["_end"] if rows else 0, "completion_token_ids": completion,
            "completion_logprobs": [-rng.random() * 3 for _ in completion], "finish_reason": "tool_calls",
            "status": "ok", "started_at": start + dt.timedelta(seconds=seq), "latency_ms": 20.0 + seq, "branch": 0,
            "parent_call_id": rows[-1]["call_id"] if rows else None, "extends_parent": bool(rows),
            "backend": "builtin:tiny", "weights_version": 0,
        })
        rows[-1]["_end"] = len(prompt) + len(completion)
        result = f" ok {seq}"
        messages += [{"role": "assistant", "content": said, "tool_calls": [tool]},
                     {"role": "tool", "tool_call_id": f"t{seq}", "content": result.strip()}]
        prompt = prompt + completion + words(tokenizer, result, rng)
    for row in rows:
        del row["_end"]
    return rows


def build_run(home: Path, run_id: str, *, tasks: int = 3, samples: int = 2, calls: int = 3, steps: int = 0,
              tokenizer: Any | None = None, seed: int = 0, status: str = "done", system_tokens: int = 0,
              store_path: Path | None = None, progress: Callable[[int], None] | None = None,
              task_prefix: str = "task") -> Path:
    """runs/<run_id>/store.duckdb with tasks × samples rollouts (× max(steps, 1)), their calls and train_steps rows."""
    rng = random.Random(seed)
    path = store_path or home / "runs" / run_id / "store.duckdb"
    config = {"env": {"name": "toy"}, "harness": {"name": "react"}, "policy": {"backend": "builtin:tiny"},
              "run": {"n_samples": samples}, "train": {"steps": steps}}
    with Store.open(path) as store:
        store.insert_run(run_id, config, status=status)
        n = 0
        for step in range(max(steps, 1)):
            for t in range(tasks):
                for i in range(samples):
                    rid = f"{run_id}/{task_prefix}-{t}/{i}" + (f"/s{step}" if steps else "")
                    state = STATUSES[(t * samples + i + step) % len(STATUSES)]
                    passed = state in ("done", "failed") and (t + i + step) % 2 == 0
                    start = T0 + dt.timedelta(minutes=n)
                    store.upsert_rollout({
                        "rollout_id": rid, "run_id": run_id, "env": "toy", "task_id": f"{task_prefix}-{t}", "harness": "react",
                        "sample_index": i, "step": step, "status": state, "reward": 1.0 if passed else 0.0,
                        "passed": passed, "attempt": 1, "started_at": start, "ended_at": start + dt.timedelta(seconds=30),
                        "error": {"timeout": "rollout exceeded its 600 s wall clock",
                                  "infra_error": "sandbox vanished"}.get(state),
                        "meta": {"verifier": f"hello.txt {'found' if passed else 'missing'}", "task_meta": {"family": "hello"}},
                    })
                    if state != "infra_error":
                        for row in call_rows(rid, calls, tokenizer, rng, start, system_tokens):
                            store.record_call(row)
                    n += 1
                    if progress is not None:
                        progress(n)
            if steps:
                store.insert_train_step({"run_id": run_id, "step": step, "loss": 0.5 / (step + 1),
                                         "reward_mean": 0.25 + 0.2 * step,
                                         "metrics": {"pass_rate": 0.25 + 0.2 * step, "kl": 0.01 * step,
                                                     "logprob_diff_max": 1e-7, "logprob_diff_mean": 1e-8}})
        store.flush()
    return path
