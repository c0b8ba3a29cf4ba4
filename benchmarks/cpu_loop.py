"""The CPU learning loop against plain transformers: generation with prefix reuse, bfloat16, the trainer's update.

    .venv/bin/python benchmarks/cpu_loop.py [--only rollout,shared,train,prefix,rows,dtype,memory] [--long] [--starts 3000,16000]
        [--rounds 2] [--threads 1]

Every part measures forgetui's code and plain transformers on the same work in the same process,
rounds alternating (the machine may be shared), and prints the ratio of the medians:
- rollout: a 3-call rollout, 3,000-token start, each later prompt = the previous prompt + its
  64-token answer + 200 new tokens (greedy, eos ignored). `BuiltinBackend` (prefix reuse) against
  `model.generate` called afresh for each call. Floor: >= 2.0x. `--long`: a 16,000-token start too
  (SmolLM2's 8,192-position limit lifted for the measurement; one round); `--starts` picks the starts.
- shared: 8 rollouts whose first prompts share a 2,000-token start (a harness's system prompt and
  tools) and differ in 200 tokens each, 64 tokens answered, all at once: `BuiltinBackend` against
  one `generate` call over the 8 (left-padded). Reported.
- train: `LocalTrainer.step` (packed, chunked logprobs) against a plain loop (right-padded
  micro-batches of 4, full logits, AdamW) on 8 samples of 500-1,300 tokens, both float32.
  Floor: tokens/s >= 1.0x.
- prefix: `LocalTrainer.step` with `share_prefix` (each micro-batch's common beginning run once) against
  the same trainer without it, on samples shaped like a harness's: 8 rollouts (2 tasks x a GRPO group
  of 4) under one 900-token system prompt, each task's own 100 tokens, then 300 tokens of its own
  trajectory (a quarter sampled). Floor: >= 1.5x.
- rows: `LocalTrainer.step` at its default samples per forward (`pack_samples`, 32) against 4 a forward
  (the default before), on a GRPO step shaped like react's in the learning benchmark: 6 tasks x 4
  rollouts under one 650-token system prompt, ~740 tokens each. Same gradient. Reported.
- dtype: bfloat16 against float32: generation (4 prompts of ~700 tokens, 64 answered each, at once)
  and `LocalTrainer.step`. Floors (on a CPU with native bfloat16): generation >= 1.5x, training >= 1.8x.
  Also the logprob agreement in each dtype: 2 answers sampled at temperature 1 after 400-token
  prompts, the sampler's recorded logprobs against the trainer's recomputed ones (reported).
- memory: the tiny model's `LocalTrainer.step` on one 4k/16k/32k-token sample, plain, with gradient
  checkpointing, and the plain transformers loop: seconds and peak memory per step (each in a fresh
  process, so its peak is its own), each against the same mode at 4k and against the plain loop at
  the same size. `--memory-shape all` trains every token (the worst case for logits); `harness`
  trains the last 256 (a long harness prompt, short answers: the Codex and Claude Code samples of
  tests/test_long_context.py). Reported.
Exit code 0 when every floor that was measured holds.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from core.backends.base import GenerationContext, SamplingParams  # noqa: E402
from core.train.types import Sample  # noqa: E402

FLOORS = {"rollout": 2.0, "train": 1.0, "prefix": 1.5, "bf16 generation": 1.5, "bf16 training": 1.8}
ANSWER = 64


def ctx() -> GenerationContext:
    return GenerationContext(session="bench", call_seq=0, request=None)


def random_ids(n: int, seed: int, vocab: int) -> list[int]:
    """`n` token ids drawn with a seed (timings do not depend on what the text says)."""
    import torch

    return torch.randint(100, vocab - 100, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def median_ratio(ours: list[float], theirs: list[float]) -> float:
    """theirs / ours of the median seconds: how many times faster ours is."""
    return statistics.median(theirs) / statistics.median(ours)


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


Side = Callable[[int], tuple[float, float, str]]  # round → (wall seconds, CPU seconds, what to print about it)
USE_CPU = False  # --threads 1: ratios of CPU seconds (the work done), not of wall time (the machine's other load too)


def alternate(rounds: int, ours: Side, theirs: Side, names: tuple[str, str]) -> float:
    """Both sides `rounds` times, alternating, each round printed; theirs / ours of the median seconds."""
    mine: list[float] = []
    base: list[float] = []
    for r in range(rounds):
        w_ours, c_ours, note_ours = ours(r)
        w_base, c_base, note_base = theirs(r)
        mine.append(c_ours if USE_CPU else w_ours)
        base.append(c_base if USE_CPU else w_base)
        print(f"  round {r + 1}: {names[0]} {note_ours} {w_ours:.1f} s ({c_ours:.1f} CPU s); {names[1]} {note_base} "
              f"{w_base:.1f} s ({c_base:.1f} CPU s): {w_base / w_ours:.2f}x wall, {c_base / c_ours:.2f}x CPU", flush=True)
    return median_ratio(mine, base)


# ------------------------------------------------------------------ generation


class Gen:
    """The two generators side by side: forgetui's BuiltinBackend and a plain transformers model."""

    def __init__(self, model: str, dtype: str, prefix_cache_mb: float = 2048, speculate: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from core.backends.builtin import SPECULATE, BuiltinBackend
        from core.models.resolve import resolve_model

        self.backend = BuiltinBackend(model, device="cpu", dtype=dtype, prefix_cache_mb=prefix_cache_mb,
                                      speculate=SPECULATE if speculate is None else speculate)
        self.backend.eos_token_ids = set()  # benchmark only: every call answers exactly its budget
        self.hf = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
        self.vocab = int(self.hf.config.vocab_size)
        self.loop = asyncio.new_event_loop()

    def ours(self, prompts: list[list[int]], new: int = ANSWER) -> list[list[int]]:
        """All prompts at once through the backend (greedy); their answers."""
        return [ids for ids, _ in self.sampled(prompts, new, temperature=0.0)]

    def sampled(self, prompts: list[list[int]], new: int, temperature: float) -> list[tuple[list[int], list[float]]]:
        """All prompts at once through the backend (seeded when sampling); each answer with its recorded logprobs."""

        async def one(i: int, ids: list[int]) -> tuple[list[int], list[float]]:
            out: list[int] = []
            lps: list[float] = []
            params = SamplingParams(max_tokens=new, temperature=temperature, seed=i if temperature else None)
            async for chunk in self.backend.generate(ids, params, ctx()):
                out += chunk.token_ids
                lps += chunk.logprobs
            return out, lps

        async def every() -> list[tuple[list[int], list[float]]]:
            return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

        return self.loop.run_until_complete(every())

    def theirs(self, prompts: list[list[int]], new: int = ANSWER) -> list[list[int]]:
        """One `generate` call over the prompts (left-padded), greedy; their answers."""
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.inference_mode():
            out = self.hf.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
            )
        return out[:, width:].tolist()

    def close(self) -> None:
        self.loop.run_until_complete(self.backend.aclose())
        self.loop.close()


def rollout(gen: Gen, start: int, seed: int, ours: bool) -> tuple[float, float, list[list[int]]]:
    """A 3-call rollout (each prompt = the last prompt + its answer + 200 new tokens); (wall s, CPU s, answers)."""
    prompt = random_ids(start, seed, gen.vocab)
    answers, wall, cpu = [], 0.0, 0.0
    for call in range(3):
        (answer,), w, c = timed(lambda p=prompt: (gen.ours if ours else gen.theirs)([p]))
        answers.append(answer)
        wall, cpu = wall + w, cpu + c
        prompt = prompt + answer + random_ids(200, seed * 10 + call, gen.vocab)
    return wall, cpu, answers


def bench_rollout(args: argparse.Namespace, results: dict[str, float]) -> None:
    gen = Gen(args.model, "float32", speculate=args.speculate)
    gen.backend.context_length = 32768  # lifted for --long (SmolLM2 says 8,192; rotary positions go further)
    gen.ours([random_ids(32, 0, gen.vocab)], 2)  # warm-up
    starts = [int(n) for n in args.starts.split(",")] + ([16000] if args.long and "16000" not in args.starts.split(",") else [])
    sizes = [(start, args.rounds if start <= 3000 else 1) for start in starts]  # a long start: one round
    answers: dict[bool, list[list[int]]] = {}  # the last round's answers of each side
    for start, rounds in sizes:

        def side(ours: bool, start: int = start) -> Side:
            def go(r: int) -> tuple[float, float, str]:
                wall, cpu, answers[ours] = rollout(gen, start, 100 + r, ours=ours)
                return wall, cpu, ""

            return go

        label = "rollout" if start == 3000 else f"rollout {start / 1000:g}k"
        results[label] = alternate(rounds, side(True), side(False), ("built-in", f"generate afresh ({start}-token start)"))
        same = sum(x == y for u, v in zip(answers[True], answers[False], strict=True) for x, y in zip(u, v, strict=True)) / (3 * ANSWER)
        print(f"{label}: 3 calls, {start}-token start: {results[label]:.2f}x plain transformers generate "
              f"({floor_text(label, results[label])}); greedy answers equal for {same:.0%} of the last round's tokens", flush=True)
    stats = gen.backend.stats()
    print(f"  sampler: prefill {stats['prefill_s']:.0f} s over {stats['prefill_tokens']:.0f} tokens, "
          f"{stats['reused_tokens']:.0f} tokens reused; decode {stats['decode_s']:.0f} s over {stats['decode_tokens']:.0f} tokens "
          f"({stats['accepted_tokens']:.0f} of {stats['drafted_tokens']:.0f} drafted tokens accepted)", flush=True)
    gen.close()


def bench_shared(args: argparse.Namespace, results: dict[str, float]) -> None:
    gen = Gen(args.model, "float32")
    gen.ours([random_ids(32, 0, gen.vocab)], 2)

    def prompts(r: int) -> list[list[int]]:
        shared = random_ids(2000, 500 + r, gen.vocab)
        return [shared + random_ids(200, 600 + 10 * r + i, gen.vocab) for i in range(8)]

    def side(fn: Callable[[list[list[int]]], Any]) -> Side:
        def go(r: int) -> tuple[float, float, str]:
            _, wall, cpu = timed(lambda: fn(prompts(r)))
            return wall, cpu, ""

        return go

    results["shared"] = alternate(args.rounds, side(gen.ours), side(gen.theirs), ("built-in", "one generate over the 8"))
    print(f"shared: 8 rollouts, 2,000-token shared start + 200 each, {ANSWER} answered: {results['shared']:.2f}x "
          f"plain transformers generate (reported)", flush=True)
    gen.close()


def recorded_samples(gen: Gen, n: int = 2, prompt: int = 400) -> list[Sample]:
    """`n` answers sampled at temperature 1 (seeded) as training samples carrying the sampler's logprobs."""
    prompts = [random_ids(prompt, 700 + i, gen.vocab) for i in range(n)]
    out = []
    for i, (p, (ids, lps)) in enumerate(zip(prompts, gen.sampled(prompts, ANSWER, temperature=1.0), strict=True)):
        out.append(Sample(sample_id=f"a{i}", run_id="bench", rollout_id=f"a{i}", task_id="t", branch=0, step=0, token_ids=p + ids,
                          loss_mask=[0] * len(p) + [1] * len(ids), logprobs=[0.0] * len(p) + lps, prompt_tokens=len(p)))
    return out


# ------------------------------------------------------------------ training


def samples(n: int, lengths: tuple[int, int], vocab: int, seed: int = 0) -> list[Sample]:
    """`n` samples of lengths spread over `lengths`: a prompt (mask 0) and a sampled answer of a quarter (mask 1)."""
    out = []
    for i in range(n):
        size = lengths[0] + (lengths[1] - lengths[0]) * i // max(1, n - 1)
        answer = max(1, size // 4)
        ids = random_ids(size, seed + i, vocab)
        out.append(Sample(sample_id=f"s{i}", run_id="bench", rollout_id=f"r{i}", task_id="t", branch=0, step=0, token_ids=ids,
                          loss_mask=[0] * (size - answer) + [1] * answer, logprobs=[0.0] * (size - answer) + [-2.0] * answer,
                          prompt_tokens=size - answer, reward=float(i % 2), advantage=1.0 if i % 2 else -1.0))
    return out


class PlainLoop:
    """The baseline update: right-padded micro-batches of 4, full logits, log_softmax, AdamW; what a hand-written loop does."""

    def __init__(self, model: str, dtype: str = "float32", micro: int = 4) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from core.models.resolve import resolve_model

        self.model = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6)
        self.autocast = None if dtype == "float32" else getattr(torch, dtype)
        self.micro = micro

    def step(self, batch: list[Sample]) -> int:
        """One optimizer step over `batch`; the tokens its forwards ran (padding included)."""
        import contextlib

        import torch

        tokens = sum(sum(s.loss_mask[1:]) for s in batch)
        ran = 0
        ordered = sorted(batch, key=lambda s: len(s.token_ids))
        for i in range(0, len(ordered), self.micro):
            chunk = ordered[i : i + self.micro]
            width = max(len(s.token_ids) for s in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            attn = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width)
            adv = torch.tensor([s.advantage for s in chunk]).unsqueeze(1)
            for j, s in enumerate(chunk):
                ids[j, : len(s.token_ids)] = torch.tensor(s.token_ids)
                attn[j, : len(s.token_ids)] = 1
                mask[j, : len(s.token_ids)] = torch.tensor(s.loss_mask, dtype=torch.float32)
            ran += ids.numel()
            amp = torch.autocast("cpu", dtype=self.autocast) if self.autocast else contextlib.nullcontext()
            with amp:
                logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
            logp = torch.gather(torch.log_softmax(logits, dim=-1), -1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            loss = -(logp * adv * mask[:, 1:]).sum() / tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return ran


def trainer(model: str, dtype: str, **kw: Any) -> Any:
    from core.train.local import LocalTrainer

    return LocalTrainer(model, device="cpu", dtype=dtype, lr=1e-6, rollout_correction="off", **{"pack_samples": 4, **kw})


def bench_train(args: argparse.Namespace, results: dict[str, float]) -> None:
    ours, plain = trainer(args.model, "float32"), PlainLoop(args.model)
    batch = samples(8, (500, 1300), int(plain.model.config.vocab_size))
    real = sum(len(s.token_ids) for s in batch)
    ours.step(batch[:2])  # warm-up

    def mine(r: int) -> tuple[float, float, str]:
        m, wall, cpu = timed(lambda: ours.step(batch))
        return wall, cpu, f"{real / wall:.1f} tokens/s (ran {m['train_tokens']:.0f} tokens),"

    def theirs(r: int) -> tuple[float, float, str]:
        ran, wall, cpu = timed(lambda: plain.step(batch))
        return wall, cpu, f"{real / wall:.1f} tokens/s (ran {ran} tokens, padding included),"

    results["train"] = alternate(args.rounds, mine, theirs, ("LocalTrainer", "plain loop"))
    print(f"train: 8 samples, {real} tokens, float32: {results['train']:.2f}x the plain transformers loop "
          f"({floor_text('train', results['train'])})", flush=True)


def harness_samples(vocab: int, system: int = 900, task: int = 100, own: int = 300, tasks: int = 2, answer: int = 0) -> list[Sample]:
    """`tasks` tasks x 4 rollouts under one system prompt: what a harness's GRPO step trains on (`answer`: sampled tokens, own // 4 by default)."""
    head = random_ids(system, 1, vocab)
    sampled = answer or own // 4
    out = []
    for t in range(tasks):
        words = random_ids(task, 10 + t, vocab)
        for r in range(4):
            rest = random_ids(own, 100 + 4 * t + r, vocab)
            ids = head + words + rest
            out.append(Sample(sample_id=f"h{t}{r}", run_id="bench", rollout_id=f"h{t}{r}", task_id=f"t{t}", branch=0, step=0, token_ids=ids,
                              loss_mask=[0] * (len(ids) - sampled) + [1] * sampled, logprobs=[0.0] * (len(ids) - sampled) + [-2.0] * sampled,
                              prompt_tokens=system + task, reward=float(r % 2), advantage=1.0 if r % 2 else -1.0))
    return out


def steps_side_by_side(rounds: int, ours: Any, theirs: Any, batch: list[Sample], names: tuple[str, str]) -> float:
    """`LocalTrainer.step` of two trainers on the same samples, alternating rounds: theirs / ours of the median seconds."""
    real = sum(len(s.token_ids) for s in batch)
    for t in (ours, theirs):
        t.step(batch[:2])  # warm-up, both: the same weights after it, so the same gradients in the rounds

    def side(t: Any) -> Side:
        def go(r: int) -> tuple[float, float, str]:
            m, wall, cpu = timed(lambda: t.step(batch))
            return wall, cpu, f"{real / wall:.1f} sample tokens/s (ran {m['train_tokens']:.0f} tokens, grad norm {m['grad_norm']:.6f}),"

        return go

    return alternate(rounds, side(ours), side(theirs), names)


def bench_prefix(args: argparse.Namespace, results: dict[str, float]) -> None:
    shared, alone = trainer(args.model, "float32"), trainer(args.model, "float32", share_prefix=False)
    batch = harness_samples(int(shared.model.config.vocab_size))
    real = sum(len(s.token_ids) for s in batch)
    results["prefix"] = steps_side_by_side(args.rounds, shared, alone, batch, ("shared prefix", "each sample whole"))
    print(f"prefix: 8 samples, {real} tokens, float32: {results['prefix']:.2f}x the same trainer without sharing "
          f"({floor_text('prefix', results['prefix'])})", flush=True)


def bench_rows(args: argparse.Namespace, results: dict[str, float]) -> None:
    from core.train.local import LocalTrainerConfig

    default = LocalTrainerConfig().pack_samples
    wide, narrow = trainer(args.model, "float32", pack_samples=default), trainer(args.model, "float32")
    # shaped like react's GRPO steps in the learning benchmark: 6 tasks x 4 under a ~650-token system prompt, ~740 tokens each
    batch = harness_samples(int(wide.model.config.vocab_size), system=650, task=30, own=60, tasks=6, answer=60)
    real = sum(len(s.token_ids) for s in batch)
    results["rows"] = steps_side_by_side(args.rounds, wide, narrow, batch, (f"{default} samples a forward", "4 a forward"))
    print(f"rows: a GRPO step of 24 samples, {real} tokens, float32: {results['rows']:.2f}x the same trainer at 4 samples a forward (reported)", flush=True)


def bench_dtype(args: argparse.Namespace, results: dict[str, float]) -> None:
    from core.models.precision import native_bf16

    print(f"  this CPU {'has' if native_bf16() else 'has NO'} native bfloat16 (oneDNN); the floors apply where it has", flush=True)
    rates: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    gens = {d: Gen(args.model, d, prefix_cache_mb=0) for d in rates}
    for gen in gens.values():
        gen.ours([random_ids(32, 0, gen.vocab)], 2)
    for r in range(args.rounds):
        prompts = [random_ids(700, 900 + 10 * r + i, gens["float32"].vocab) for i in range(4)]
        for dtype, gen in gens.items():
            _, wall, cpu = timed(lambda g=gen, p=prompts: g.ours(p))
            rates[dtype].append(4 * ANSWER / (cpu if USE_CPU else wall))
            print(f"  generation round {r + 1}, {dtype}: {4 * ANSWER / wall:.1f} tokens/s, {4 * ANSWER / cpu:.1f} per CPU s (prefill included)", flush=True)
    recorded = {d: recorded_samples(gen) for d, gen in gens.items()}
    for gen in gens.values():
        gen.close()
    results["bf16 generation"] = statistics.median(rates["bfloat16"]) / statistics.median(rates["float32"])
    trainers = {d: trainer(args.model, d) for d in rates}
    for dtype, t in trainers.items():  # the sampler's recorded logprobs against the trainer's in the same dtype
        diffs = [abs(a - b) for s, lps in zip(recorded[dtype], t.logprobs(recorded[dtype]), strict=True)
                 for a, b, m in zip(s.logprobs, lps, s.loss_mask, strict=True) if m]
        print(f"logprob agreement, {dtype} sampler and trainer: max {max(diffs):.2e}, mean {statistics.fmean(diffs):.2e} "
              f"over {len(diffs)} sampled tokens (reported; above 1e-3 the rollout correction applies)", flush=True)
    batch = samples(4, (700, 1100), int(trainers["float32"].model.config.vocab_size))
    real = sum(len(s.token_ids) for s in batch)
    speed: dict[str, list[float]] = {d: [] for d in rates}
    for t in trainers.values():
        t.step(batch[:1])
    for r in range(args.rounds):
        for dtype, t in trainers.items():
            _, wall, cpu = timed(lambda t=t: t.step(batch))
            speed[dtype].append(real / (cpu if USE_CPU else wall))
            print(f"  training round {r + 1}, {dtype}: {real / wall:.1f} tokens/s, {real / cpu:.1f} per CPU s", flush=True)
    results["bf16 training"] = statistics.median(speed["bfloat16"]) / statistics.median(speed["float32"])
    for label in ("bf16 generation", "bf16 training"):
        print(f"{label}: {results[label]:.2f}x float32 ({floor_text(label, results[label], applies=native_bf16())})", flush=True)
    if not native_bf16():
        for label in ("bf16 generation", "bf16 training"):
            results[f"{label} (no native bf16)"] = results.pop(label)


# ------------------------------------------------------------------ memory


SHAPES = {"all": "every token after a 32-token prompt trained (the worst case for logits)",
          "harness": "the last 256 tokens trained (a harness's long prompt, short answers: what Codex and Claude Code samples are)"}


def memory_child(size: int, mode: str, shape: str) -> None:
    """One step on one `size`-token sample of the tiny model in this fresh process; prints seconds and peak MB as JSON."""
    import torch

    def peak_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    if mode == "plain":
        loop = PlainLoop("tiny", micro=1)
        vocab, step = int(loop.model.config.vocab_size), loop.step
    else:
        t = trainer("tiny", "float32", gradient_checkpointing=mode == "checkpointed", pack_tokens=size)
        vocab, step = int(t.model.config.vocab_size), t.step
    (sample,) = samples(1, (size, size), vocab, seed=size)
    prompt = 32 if shape == "all" else size - 256
    sample.loss_mask = [0] * prompt + [1] * (size - prompt)
    sample.logprobs = [0.0] * prompt + [-2.0] * (size - prompt)
    step([samples(1, (64, 64), vocab)[0]])  # warm-up (allocator, first-call costs)
    before = peak_mb()
    torch.manual_seed(0)
    _, wall, _ = timed(lambda: step([sample]))
    print(json.dumps({"size": size, "mode": mode, "seconds": wall, "peak_mb": peak_mb(), "before_mb": before}))


MEMORY_SIZES = (4096, 16384, 32768)
MEMORY_MODES = ("packed", "checkpointed", "plain")


def bench_memory(args: argparse.Namespace, results: dict[str, float]) -> None:
    """Each size and mode in a fresh process; growth against the same mode's smallest size, and against the plain loop."""
    print(f"  tiny model, one sample, {SHAPES[args.memory_shape]}; peak = the process's peak RSS, "
          "step MB = peak over the process after a warm-up step", flush=True)
    print(f"  {'tokens':>7} {'mode':<13} {'s/step':>7} {'peak MB':>8} {'step MB':>8} {'s vs 4k':>8} {'MB vs 4k':>9} "
          f"{'s vs plain':>10} {'MB vs plain':>11}", flush=True)
    first: dict[str, dict[str, float]] = {}
    for size in MEMORY_SIZES:
        measured: dict[str, dict[str, float]] = {}
        for mode in ("plain", *[m for m in MEMORY_MODES if m != "plain"]):  # plain first: the others' baseline at this size
            child = [sys.executable, __file__, "--memory-child", str(size), mode, "--memory-shape", args.memory_shape]
            out = subprocess.run(child, capture_output=True, text=True, cwd=REPO, timeout=3600)
            if out.returncode != 0:
                print(f"  {size:>7} {mode:<13} failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}", flush=True)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["step_mb"] = row["peak_mb"] - row["before_mb"]
            measured[mode] = row
            base, plain = first.setdefault(mode, row), measured.get("plain", row)
            print(f"  {size:>7} {mode:<13} {row['seconds']:7.2f} {row['peak_mb']:8.0f} {row['step_mb']:8.0f} "
                  f"{row['seconds'] / base['seconds']:7.1f}x {row['step_mb'] / max(base['step_mb'], 1):8.1f}x "
                  f"{row['seconds'] / plain['seconds']:9.2f}x {row['step_mb'] / max(plain['step_mb'], 1):10.2f}x", flush=True)


# ------------------------------------------------------------------ main


def floor_text(label: str, ratio: float, applies: bool = True) -> str:
    floor = FLOORS.get(label)
    if floor is None:
        return "reported"
    if not applies:
        return f"floor {floor}x not applicable here"
    return f"floor {floor}x: {'PASS' if ratio >= floor else 'FAIL'}"


PARTS = {"rollout": bench_rollout, "shared": bench_shared, "train": bench_train, "prefix": bench_prefix, "rows": bench_rows, "dtype": bench_dtype, "memory": bench_memory}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--long", action="store_true", help="also a 16,000-token start in the rollout part (minutes)")
    parser.add_argument("--starts", default="3000", help="the rollout part's start lengths, comma-separated (over 3,000: one round each)")
    parser.add_argument("--speculate", type=int, default=None, help="the built-in backend's prompt-lookup draft tokens per step (default: its own)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); 1 keeps CPU seconds honest on a crowded machine")
    parser.add_argument("--memory-shape", choices=sorted(SHAPES), default="all", help="which tokens the memory part trains: " + "; ".join(f"{k}: {v}" for k, v in SHAPES.items()))
    parser.add_argument("--memory-child", nargs=2, metavar=("TOKENS", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    from core.models.quiet import silence_third_party

    silence_third_party()
    if args.threads:
        import torch

        global USE_CPU
        torch.set_num_threads(args.threads)
        USE_CPU = args.threads == 1
    if args.memory_child:
        memory_child(int(args.memory_child[0]), args.memory_child[1], args.memory_shape)
        return 0
    import torch

    print(f"cpu_loop: {args.model}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[str, float] = {}
    for part in args.only.split(","):
        print(f"\n[{part}]", flush=True)
        PARTS[part.strip()](args, results)
    print(f"\nratios of {'CPU seconds (one thread)' if USE_CPU else 'wall time'}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}; ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in results.items()))
    failed = [k for k, v in results.items() if k in FLOORS and v < FLOORS[k]]
    print("floors: " + ("all measured ones hold" if not failed else "FAILED: " + ", ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
