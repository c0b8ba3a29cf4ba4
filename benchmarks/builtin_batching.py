"""Built-in backend throughput: concurrent generations batched together vs one at a time.

    .venv/bin/python benchmarks/builtin_batching.py [--model smollm2-135m] [--concurrency 8] [--max-tokens 64]

The same N prompts (a few hundred tokens each, all of different lengths, so the batch carries left
padding) are generated twice by one `BuiltinBackend`: one request at a time (concurrency 1), then
all N at once (concurrency N). Sampling is temperature 1 with a seed per request and eos ignored,
so every request samples exactly --max-tokens tokens in both phases. The two phases alternate
--repeat times (the machine may be shared); prints tokens/s of each phase per round (prefill
included: wall time from the first request to the last token), the ratio of the medians (floor:
>= 2.5x; on a shared machine also read the tokens per CPU second, which other load moves less) and the largest gap between a logprob reported while batched and the same token's logprob
from one plain forward over prompt + completion. Exit code 0 only when the floor holds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.backends.base import GenerationContext, SamplingParams  # noqa: E402
from core.backends.builtin import BuiltinBackend  # noqa: E402
from core.chat import ChatRequest  # noqa: E402

log = logging.getLogger("builtin_batching")
FLOOR = 2.5
TOPICS = [
    "a KV cache",
    "left padding",
    "rotary position embeddings",
    "top-p sampling",
    "GRPO groups",
    "continuous batching",
    "a recording proxy",
    "token-exact training data",
    "grouped-query attention",
    "temperature scaling",
    "weight reloading",
    "streaming responses",
]


def prompts(backend: BuiltinBackend, n: int, base_tokens: int) -> list[list[int]]:
    """N chat prompts of about `base_tokens` + 12*i tokens each (all different)."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        sentence = f"Note {i}: we discuss {topic} and how it affects sampling throughput on a CPU. "
        body = ""
        while len(backend.tokenizer(body, add_special_tokens=False)["input_ids"]) < base_tokens + 12 * i:
            body += sentence
        rendered = backend.tokenizer.apply_chat_template(
            [{"role": "user", "content": body + f"Summarise {topic} in one paragraph."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(list(backend.tokenizer(rendered, add_special_tokens=False)["input_ids"]))
    return out


def ctx(i: int) -> GenerationContext:
    return GenerationContext(
        session=f"b{i}", call_seq=0, request=ChatRequest(api="chat", model="m", messages=[], tools=[])
    )


async def one(
    backend: BuiltinBackend, ids: list[int], seed: int, max_tokens: int
) -> tuple[list[int], list[float]]:
    """One generation at temperature 1 with its own seed; returns (tokens, logprobs)."""
    tokens: list[int] = []
    lps: list[float] = []
    async for chunk in backend.generate(
        ids, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed), ctx(seed)
    ):
        tokens += chunk.token_ids
        lps += chunk.logprobs
    return tokens, lps


async def phase(backend: BuiltinBackend, all_ids: list[list[int]], concurrency: int, max_tokens: int):
    """Generate every prompt, `concurrency` at a time; returns (tokens/s, results)."""
    slots = asyncio.Semaphore(concurrency)

    async def limited(i: int, ids: list[int]):
        async with slots:
            return await one(backend, ids, 1000 + i, max_tokens)

    start, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(limited(i, ids) for i, ids in enumerate(all_ids)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    total = sum(len(t) for t, _ in results)
    log.info("concurrency %d: %.1f CPU s for %d tokens", concurrency, cpu, total)
    print(f"  concurrency {concurrency}: {total / cpu:.2f} tokens per CPU second of this process")
    return total / wall, results, wall


def logprob_gap(backend: BuiltinBackend, all_ids: list[list[int]], results) -> float:
    """Largest |reported - plain full-forward| logprob over every sampled token (temperature 1)."""
    import torch

    gap = 0.0
    with torch.inference_mode():
        for ids, (tokens, lps) in zip(all_ids, results, strict=True):
            logits = backend.model(input_ids=torch.tensor([ids + tokens])).logits[0].float()
            expected = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)
            reported = torch.tensor(lps)
            gap = max(
                gap, float((expected[torch.arange(len(tokens)), torch.tensor(tokens)] - reported).abs().max())
            )
    return gap


async def main(args: argparse.Namespace) -> int:
    backend = BuiltinBackend(  # prefix reuse off: both phases generate the same prompts (cpu_loop.py measures reuse)
        args.model, device=args.device, dtype=args.dtype, max_batch=max(16, args.concurrency), prefix_cache_mb=0
    )
    backend.eos_token_ids = set()  # benchmark only: ignore eos so every request samples exactly max_tokens
    all_ids = prompts(backend, args.concurrency, args.prompt_tokens)
    lengths = [len(p) for p in all_ids]
    print(
        f"model {args.model} on {backend.device}; {len(all_ids)} prompts of {min(lengths)}-{max(lengths)} tokens; "
        f"max_tokens {args.max_tokens}"
    )
    await one(backend, all_ids[0][:32], 1, 4)  # warm-up
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    serial: list[float] = []
    batched: list[float] = []
    for round_ in range(args.repeat):
        rate, _, wall = await phase(backend, all_ids, 1, args.max_tokens)
        serial.append(rate)
        print(f"round {round_ + 1}: concurrency 1: {rate:7.2f} tokens/s ({wall:.1f} s)")
        rate, results, wall = await phase(backend, all_ids, args.concurrency, args.max_tokens)
        batched.append(rate)
        print(
            f"round {round_ + 1}: concurrency {args.concurrency}: {rate:7.2f} tokens/s ({wall:.1f} s), "
            f"ratio {batched[-1] / serial[-1]:.2f}x"
        )
        assert all(len(t) == args.max_tokens for t, _ in results)
    ratio = statistics.median(batched) / statistics.median(serial)
    gap = logprob_gap(backend, all_ids, results)
    print(f"load average at end: {os.getloadavg()[0]:.2f}; peak batch {backend.peak_batch}")
    print(
        f"median tokens/s: concurrency 1 {statistics.median(serial):.2f}, "
        f"concurrency {args.concurrency} {statistics.median(batched):.2f}"
    )
    print(f"ratio {ratio:.2f}x (floor {FLOOR}x): {'PASS' if ratio >= FLOOR else 'FAIL'}")
    print(f"max |batched logprob - full forward| over {len(results) * args.max_tokens} tokens = {gap:.2e}")
    await backend.aclose()
    return 0 if ratio >= FLOOR else 1


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16, float16")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2, help="rounds of (concurrency 1, concurrency N)")
    parser.add_argument("--prompt-tokens", type=int, default=250, help="length of the shortest prompt")
    return parser.parse_args()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    sys.exit(asyncio.run(main(parse())))
