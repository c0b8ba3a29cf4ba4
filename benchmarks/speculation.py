"""Prompt-lookup speculation on a run's own prompts: the built-in backend with `speculate=N` against `speculate=0`.

    .venv/bin/python benchmarks/speculation.py --run RUN_ID --model CHECKPOINT_OR_BUILTIN [--calls 48] [--speculate 4]
        [--rounds 2] [--concurrency 8] [--max-tokens 96] [--temperature 1.0] [--fixed-positions F]

Replays the prompts of `--calls` recorded calls of a run (e.g. an eval run of the learning benchmark,
with the checkpoint it evaluated) through two built-in backends, in waves of `--concurrency` at once
as the proxy would batch them, sampling with fixed seeds, rounds alternating (the machine may be
shared). Prints the ratio of tokens per CPU second (one torch thread: the work each side did), the drafted and
accepted tokens, the share of answers that came out the same token for token on both sides (speculation
keeps a seed's answer: expected 100%, but for a near-tie flipped by rounding), and — without a model —
how many tokens per forward the recorded answers themselves would have allowed (a draft counted as
accepted where it equals the recorded next token). `--fixed-positions` overrides what the backend
assumes a forward costs beyond its positions (the trade `speculation.width` makes). Reported, no floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def recorded_calls(run: str, n: int) -> list[tuple[list[int], list[int]]]:
    """The first `n` calls of a run with a completion: (prompt ids, completion ids)."""
    from core.paths import runs_dir
    from core.store.query import run_query

    sql = f"SELECT prompt_token_ids, completion_token_ids FROM calls_full WHERE completion_token_ids IS NOT NULL ORDER BY call_id LIMIT {int(n)}"
    rows = run_query(str(runs_dir() / run / "store.duckdb"), sql, max_rows=n).rows
    return [tuple(json.loads(v) if isinstance(v, str) else list(v) for v in row) for row in rows]  # type: ignore[misc]


def tokens_per_forward(calls: list[tuple[list[int], list[int]]], k: int) -> float:
    """Tokens one decode forward would yield on the recorded answers (a draft kept while it equals the recorded token)."""
    from core.backends.speculation import propose

    tokens = forwards = 0
    for prompt, answer in calls:
        i = 0
        while i < len(answer):
            drafts = propose(prompt + answer[: i + 1], min(k, len(answer) - i - 1))
            kept = next((j for j, d in enumerate(drafts) if answer[i + 1 + j] != d), len(drafts))
            forwards += 1
            tokens += 1 + kept
            i += 1 + kept
    return tokens / max(forwards, 1)


def replay(backend: Any, prompts: list[list[int]], concurrency: int, max_tokens: int, temperature: float) -> tuple[float, list[list[int]]]:
    """Every prompt through `backend` in waves; (CPU seconds, the answers)."""
    from core.backends.base import GenerationContext, SamplingParams

    async def one(i: int, ids: list[int]) -> list[int]:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=i)
        context = GenerationContext(session=f"s{i}", call_seq=0, request=None)
        return [t async for c in backend.generate(ids, params, context) for t in c.token_ids]

    async def waves() -> list[list[int]]:
        answers: list[list[int]] = []
        for start in range(0, len(prompts), concurrency):
            answers += await asyncio.gather(*(one(start + i, p) for i, p in enumerate(prompts[start : start + concurrency])))
        return answers

    started = time.process_time()
    answers = asyncio.run(waves())
    return time.process_time() - started, answers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="a run id under FORGETUI_HOME/runs whose calls to replay")
    parser.add_argument("--model", required=True, help="the checkpoint folder or built-in model that answers them")
    parser.add_argument("--calls", type=int, default=48)
    parser.add_argument("--speculate", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--fixed-positions", type=float, default=None, help="override the backend's cost model (see speculation.width)")
    args = parser.parse_args()
    import torch

    from core.backends.builtin import BuiltinBackend
    from core.models.quiet import silence_third_party

    silence_third_party()
    torch.set_num_threads(1)
    calls = recorded_calls(args.run, args.calls)
    if not calls:
        print(f"run {args.run} has no recorded calls with token ids", file=sys.stderr)
        return 2
    prompts = [p for p, _ in calls]
    print(f"{len(calls)} recorded calls of {args.run}; their answers allow {tokens_per_forward(calls, args.speculate):.2f} tokens per forward "
          f"with {args.speculate} drafts", flush=True)
    sides = {n: BuiltinBackend(args.model, device="cpu", prefix_cache_mb=0, speculate=n) for n in (0, args.speculate)}
    if args.fixed_positions is not None:
        sides[args.speculate]._loop.fixed_positions = args.fixed_positions
    seconds: dict[int, list[float]] = {n: [] for n in sides}
    answers: dict[int, list[list[int]]] = {}
    decode: dict[int, list[float]] = {n: [] for n in sides}  # the worker's decode-step seconds (wall) per token
    for r in range(args.rounds):
        for n, backend in sides.items():
            before = backend.stats()["decode_s"]
            cpu, answers[n] = replay(backend, prompts, args.concurrency, args.max_tokens, args.temperature)
            tokens = sum(map(len, answers[n]))
            seconds[n].append(cpu / max(tokens, 1))
            decode[n].append((backend.stats()["decode_s"] - before) / max(tokens, 1))
            print(f"  round {r + 1}: speculate={n}: {cpu:.1f} CPU s, {tokens} tokens ({1000 * cpu / max(tokens, 1):.0f} CPU ms a token; "
                  f"decode steps {1000 * decode[n][-1]:.0f} ms a token)", flush=True)
    stats = sides[args.speculate].stats()
    ratio = statistics.median(seconds[0]) / statistics.median(seconds[args.speculate])
    steps = statistics.median(decode[0]) / statistics.median(decode[args.speculate])
    print(f"speculate={args.speculate}: {ratio:.2f}x the tokens per CPU second of speculate=0 (medians; prefill included), "
          f"{steps:.2f}x in decode steps alone; "
          f"{stats['accepted_tokens']:.0f} of {stats['drafted_tokens']:.0f} drafted tokens accepted "
          f"(fixed_positions {sides[args.speculate]._loop.fixed_positions:g}); answers the same token for token: "
          f"{sum(a == b for a, b in zip(answers[0], answers[args.speculate], strict=True))}/{len(prompts)}", flush=True)
    for backend in sides.values():
        asyncio.run(backend.aclose())
    return 0


if __name__ == "__main__":
    sys.exit(main())
