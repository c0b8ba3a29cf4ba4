"""The built-in backend batches concurrent generations: logprobs, joining, leaving, cancelling, reloading."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from core.backends.base import GenerationContext, SamplingParams
from core.backends.builtin import BuiltinBackend
from core.chat import ChatRequest
from core.errors import BackendError
from core.models.tiny import ensure_tiny_model

log = logging.getLogger(__name__)

TEXTS = [
    "hi",
    "Say hello",
    "Write a shell command that counts the lines of every file in this folder.",
    "Explain, step by step and with an example, how a KV cache speeds up decoding in a transformer "
    "language model, and what left padding does to the attention mask when sequences differ in length.",
    "List three prime numbers.",
    "Rename a.txt to b.txt, then print the new name and the size of the file in bytes.",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(root=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def backend(tiny_dir: Path) -> BuiltinBackend:
    return BuiltinBackend(str(tiny_dir), device="cpu")


def ctx() -> GenerationContext:
    return GenerationContext(
        session="s", call_seq=0, request=ChatRequest(api="chat", model="m", messages=[], tools=[])
    )


def prompt(backend: BuiltinBackend, text: str) -> list[int]:
    rendered = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(backend.tokenizer(rendered, add_special_tokens=False)["input_ids"])


async def run(backend: BuiltinBackend, ids: list[int], sampling: SamplingParams, delay: float = 0.0):
    """Generate after `delay` seconds; return (tokens, logprobs, finish_reason)."""
    await asyncio.sleep(delay)
    chunks = [c async for c in backend.generate(ids, sampling, ctx())]
    return (
        [t for c in chunks for t in c.token_ids],
        [x for c in chunks for x in c.logprobs],
        chunks[-1].finish_reason,
    )


def full_forward_gap(
    backend: BuiltinBackend, ids: list[int], tokens: list[int], lps: list[float], temperature: float
) -> float:
    """Max |logprob reported - logprob of one plain forward over prompt + completion| (no cache, no padding)."""
    import torch

    t = temperature if temperature >= 1e-5 else 1.0
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([ids + tokens])).logits[0].float()
    expected = torch.log_softmax(logits[len(ids) - 1 : len(ids) - 1 + len(tokens)] / t, dim=-1)
    return max(abs(float(expected[i, tok]) - lp) for i, (tok, lp) in enumerate(zip(tokens, lps, strict=True)))


SETTINGS = [
    SamplingParams(max_tokens=16, temperature=1.0, seed=1),
    SamplingParams(max_tokens=12, temperature=0.0),
    SamplingParams(max_tokens=20, temperature=0.7, top_p=0.9, seed=2),
    SamplingParams(max_tokens=9, temperature=1.3, seed=3),
    SamplingParams(max_tokens=14, temperature=0.5, top_p=0.5, seed=4),
    SamplingParams(max_tokens=18, temperature=1.0, top_p=0.95, seed=5),
]


async def test_concurrent_logprobs_match_a_plain_full_forward(backend: BuiltinBackend) -> None:
    prompts = [prompt(backend, t) for t in TEXTS]
    assert len({len(p) for p in prompts}) == len(prompts)  # different lengths: left padding is exercised
    results = await asyncio.gather(*(run(backend, p, s) for p, s in zip(prompts, SETTINGS, strict=True)))
    assert backend.peak_batch >= 2
    gaps = []
    for p, s, (tokens, lps, finish) in zip(prompts, SETTINGS, results, strict=True):
        assert finish in ("stop", "length") and len(tokens) == len(lps) >= 1
        assert len(tokens) == s.max_tokens or finish == "stop"
        gaps.append(full_forward_gap(backend, p, tokens, lps, s.temperature))
    log.info("batched vs full-forward logprob gaps: %s (peak batch %d)", gaps, backend.peak_batch)
    assert max(gaps) <= 1e-4  # measured ~1e-6 in fp32; the brief's bound is 1e-3


async def test_seeded_samples_do_not_depend_on_the_batch(backend: BuiltinBackend) -> None:
    prompts = [prompt(backend, t) for t in TEXTS]
    alone = [await run(backend, p, s) for p, s in zip(prompts[:3], SETTINGS[:3], strict=True)]
    together = await asyncio.gather(
        *(run(backend, p, s) for p, s in zip(prompts[:3], SETTINGS[:3], strict=True))
    )
    assert [r[0] for r in together] == [r[0] for r in alone]
    for (_, a, _), (_, b, _) in zip(alone, together, strict=True):
        assert b == pytest.approx(a, abs=1e-4)


async def test_requests_join_while_others_decode(backend: BuiltinBackend) -> None:
    short, mid, long_ = (prompt(backend, TEXTS[i]) for i in (1, 2, 3))
    first_token = asyncio.Event()
    sampling = SamplingParams(max_tokens=30, temperature=1.0, seed=11)

    async def first() -> tuple[list[int], list[float], str | None]:
        tokens, lps, finish = [], [], None
        async for chunk in backend.generate(mid, sampling, ctx()):
            tokens += chunk.token_ids
            lps += chunk.logprobs
            finish = chunk.finish_reason
            if len(tokens) >= 3:
                first_token.set()
        return tokens, lps, finish

    async def later(ids: list[int], seed: int):
        await first_token.wait()
        return await run(backend, ids, SamplingParams(max_tokens=10, temperature=1.0, seed=seed))

    results = await asyncio.gather(first(), later(long_, 12), later(short, 13))
    for ids, (tokens, lps, _) in zip((mid, long_, short), results, strict=True):
        assert full_forward_gap(backend, ids, tokens, lps, 1.0) <= 1e-3
    assert backend.peak_batch >= 2


async def test_cancelling_one_request_leaves_the_others(backend: BuiltinBackend) -> None:
    a, b, c = (prompt(backend, TEXTS[i]) for i in (0, 3, 4))
    started = asyncio.Event()
    before = backend.tokens_generated

    async def endless() -> None:
        async for _ in backend.generate(b, SamplingParams(max_tokens=100_000, temperature=1.0), ctx()):
            started.set()

    victim = asyncio.create_task(endless())
    others = asyncio.gather(
        run(backend, a, SamplingParams(max_tokens=25, temperature=1.0, seed=21)),
        run(backend, c, SamplingParams(max_tokens=25, temperature=1.0, seed=22)),
    )
    await asyncio.wait_for(started.wait(), 60)
    victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await victim
    results = await asyncio.wait_for(others, 120)
    await asyncio.wait_for(backend.wait_idle(), 60)
    for ids, (tokens, lps, _) in zip((a, c), results, strict=True):
        assert full_forward_gap(backend, ids, tokens, lps, 1.0) <= 1e-3
    assert backend.tokens_generated - before < 1000


async def test_per_request_stop_tokens_in_one_batch(backend: BuiltinBackend) -> None:
    p = prompt(backend, TEXTS[2])
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    ids, _, _ = await run(backend, p, greedy)
    stop_at = ids[2]
    cut = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=[stop_at])
    (full, _, f1), (short, _, f2) = await asyncio.gather(run(backend, p, greedy), run(backend, p, cut))
    assert full == ids and f1 == "length"
    assert short == ids[: ids.index(stop_at) + 1] and f2 == "stop"


async def test_a_failed_step_fails_its_rows_and_the_backend_recovers(
    backend: BuiltinBackend, monkeypatch
) -> None:
    batch = backend._loop._batch
    real = batch.decode
    calls = {"n": 0}

    def flaky(tokens: list[int]) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        real(tokens)

    monkeypatch.setattr(batch, "decode", flaky)
    p = prompt(backend, TEXTS[1])
    results = await asyncio.gather(
        *(run(backend, p, SamplingParams(max_tokens=10, temperature=1.0, seed=s)) for s in (1, 2)),
        return_exceptions=True,
    )
    assert all(isinstance(r, BackendError) and "boom" in str(r) for r in results)
    monkeypatch.setattr(batch, "decode", real)
    tokens, _, _ = await run(backend, p, SamplingParams(max_tokens=3, temperature=0.0))
    assert len(tokens) >= 1


async def test_reload_lands_between_steps_while_decoding(tiny_dir: Path) -> None:
    import torch

    backend = BuiltinBackend(str(tiny_dir), device="cpu")
    backend.eos_token_ids = set()  # both run their full 40 tokens
    p = prompt(backend, TEXTS[2])
    started = asyncio.Event()
    sampling = SamplingParams(max_tokens=40, temperature=1.0, seed=5)

    async def consume() -> int:
        n = 0
        async for chunk in backend.generate(p, sampling, ctx()):
            n += len(chunk.token_ids)
            started.set()
        return n

    tasks = [asyncio.create_task(consume()) for _ in range(2)]
    await asyncio.wait_for(started.wait(), 60)
    changed = {k: v + torch.randn_like(v) * 0.5 for k, v in backend.model.state_dict().items()}
    await asyncio.to_thread(backend.reload_weights, changed)
    assert backend.weights_version == 1
    assert await asyncio.gather(*tasks) == [40, 40]
    tokens, lps, _ = await run(backend, p, SamplingParams(max_tokens=6, temperature=1.0, seed=9))
    assert full_forward_gap(backend, p, tokens, lps, 1.0) <= 1e-4  # the new weights, for a new request
    await backend.aclose()


async def test_close_fails_queued_and_live_requests(tiny_dir: Path) -> None:
    backend = BuiltinBackend(str(tiny_dir), device="cpu")
    backend.eos_token_ids = set()  # still decoding when closed
    p = prompt(backend, TEXTS[0])
    task = asyncio.create_task(run(backend, p, SamplingParams(max_tokens=100_000, temperature=1.0)))
    while backend.tokens_generated == 0:
        await asyncio.sleep(0.01)
    await backend.aclose()
    with pytest.raises(Exception, match="closed"):
        await asyncio.wait_for(task, 60)


async def test_max_batch_queues_the_rest_and_a_cancelled_queued_request_leaves(tiny_dir: Path) -> None:
    backend = BuiltinBackend(str(tiny_dir), device="cpu", max_batch=1)
    backend.eos_token_ids = set()  # the running request must outlast the queued one
    p = prompt(backend, TEXTS[1])
    started = asyncio.Event()

    async def endless() -> None:
        async for _ in backend.generate(
            p, SamplingParams(max_tokens=100_000, temperature=1.0, seed=1), ctx()
        ):
            started.set()

    async def until(condition) -> None:
        while not condition():
            await asyncio.sleep(0.01)

    running = asyncio.create_task(endless())
    await asyncio.wait_for(started.wait(), 60)
    queued = asyncio.create_task(run(backend, p, SamplingParams(max_tokens=30, temperature=1.0, seed=2)))
    await asyncio.wait_for(until(lambda: len(backend._loop._waiting) == 1), 60)  # behind the full batch
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    await asyncio.wait_for(until(lambda: not backend._loop._waiting), 60)  # left without a prefill
    assert not running.done() and backend.peak_batch == 1
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await asyncio.wait_for(backend.wait_idle(), 60)
    tokens, _, _ = await run(backend, p, SamplingParams(max_tokens=3, temperature=0.0))
    assert len(tokens) == 3
    await backend.aclose()
