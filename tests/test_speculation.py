"""Prompt-lookup speculative decoding in the built-in backend: the drafts, their verification, and answers it must not change."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from core.backends.base import SamplingParams
from core.backends.builtin import BuiltinBackend, from_spec
from core.backends.sampling import PositionNoise, pick
from core.backends.spec import PolicySpec
from core.backends.speculation import accepted, propose, width
from core.errors import ConfigError
from core.models.tiny import ensure_tiny_model
from tests.test_builtin_batching import SETTINGS, TEXTS, full_forward_gap, prompt, run


def test_propose_continues_the_latest_occurrence_of_the_longest_matching_tail() -> None:
    #            0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    assert propose(context, 3) == [8, 2, 5]  # "5 6" last occurred at 4: what followed it
    assert propose([9, 1, 2, 3, 9, 4, 1, 2], 2) == [3, 9]  # no earlier "4 1 2": the 2-gram "1 2"
    assert propose([1, 2, 3, 4, 7, 2, 3], 5) == [4, 7, 2, 3, 4]  # a 2-gram tail; at the end the stretch repeats
    assert propose([8, 1, 1, 1], 4) == [1, 1, 1, 1]  # a run goes on
    assert propose([8, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]  # so does a period of two
    assert propose([4, 1, 9, 3, 1, 2, 7, 1], 2) == [2, 7]  # a 1-gram: its latest earlier occurrence wins
    assert propose([1, 2, 3], 4) == []  # nothing repeats
    assert propose([3, 3], 0) == [] and propose([3], 2) == []


def test_a_banned_token_is_never_taken_but_the_logprobs_stay_the_models() -> None:
    import torch

    logits = torch.log(torch.tensor([0.9, 0.06, 0.04]))  # the banned id is the model's favourite
    banned = torch.tensor([0], dtype=torch.long)
    noise = PositionNoise(torch.Generator().manual_seed(0))
    taken: Counter[int] = Counter()
    for i in range(2_000):
        token, logprob = pick(logits, 1.0, 1.0, noise.at(i, 3), banned)
        assert logprob == pytest.approx(float(logits[token]), abs=1e-6)  # what the trainer recomputes
        taken[token] += 1
    assert taken[0] == 0 and taken[1] > taken[2] > 0
    assert pick(logits, 0.0, 1.0, None, banned) == (1, pytest.approx(float(logits[1]), abs=1e-6))  # greedy too


def test_the_perturbed_argmax_samples_exactly_the_model_distribution_and_top_p_its_nucleus() -> None:
    import torch

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    noise = PositionNoise(torch.Generator().manual_seed(0))
    n = 20_000
    plain: Counter[int] = Counter()
    nucleus: Counter[int] = Counter()
    for _ in range(n):
        token, logprob = pick(logits, 1.0, 1.0, noise.at(0, 4))
        assert logprob == pytest.approx(float(logits[token]), abs=1e-6)
        plain[token] += 1
        nucleus[pick(logits, 1.0, 0.7, noise.at(0, 4))[0]] += 1  # same noise: the nucleus {0, 1}
        noise.advance()
    for token, p in enumerate([0.5, 0.3, 0.15, 0.05]):
        assert plain[token] / n == pytest.approx(p, abs=0.015)
    assert set(nucleus) == {0, 1} and nucleus[0] / n == pytest.approx(0.5 / 0.8, abs=0.015)
    # halved temperature: p ∝ p_i²
    sharp = Counter(pick(logits, 0.5, 1.0, noise.at(i, 4))[0] for i in range(n))
    squares = torch.tensor([0.5, 0.3, 0.15, 0.05]) ** 2
    assert sharp[0] / n == pytest.approx(float(squares[0] / squares.sum()), abs=0.015)


def test_a_positions_noise_is_drawn_once_in_order_whoever_asks_first() -> None:
    import torch

    ahead, step = PositionNoise(torch.Generator().manual_seed(7)), PositionNoise(torch.Generator().manual_seed(7))
    looked = [ahead.at(j, 8).clone() for j in (2, 0, 1)]  # a verifier looks three positions ahead
    for j in range(3):
        assert torch.equal(step.at(0, 8), looked[[2, 0, 1].index(j)])  # one position at a time, the same draws
        step.advance()
    ahead.advance()
    assert torch.equal(ahead.at(0, 8), looked[2])


def test_verification_accepts_the_drafts_the_sampler_itself_chooses() -> None:
    import torch

    logits = torch.tensor([[0.0, 3.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])

    def greedy(j: int, row: torch.Tensor) -> tuple[int, float]:
        return pick(row, 0.0, 1.0, None)

    kept = accepted(logits, [1, 0, 1], greedy)
    assert len(kept) == 2 and kept[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[1]))
    assert len(accepted(logits, [1, 0, 2], greedy)) == 3
    assert accepted(logits, [2, 0, 2], greedy) == []


def test_the_width_pays_for_its_columns() -> None:
    # one row that drafts well and weights that cost 16 positions: every draft pays
    assert width([[1, 2, 3, 4]], [0.9], 16.0) == 5
    # eight rows, one of them with drafts: a column costs all eight rows a position each
    assert width([[1, 2, 3, 4]] + [[]] * 7, [0.9] + [0.5] * 7, 16.0) == 1
    # eight rows drafting at 0.6: one or two columns, not four
    assert width([[1, 2, 3, 4]] * 8, [0.6] * 8, 16.0) in (2, 3)
    assert width([[1, 2]] * 8, [0.95] * 8, 16.0) == 3
    assert width([[], []], [0.5, 0.5], 16.0) == 1


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(root=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def backends(tiny_dir: Path) -> tuple[BuiltinBackend, BuiltinBackend]:
    spec = BuiltinBackend(str(tiny_dir), device="cpu", speculate=4)
    spec._loop.fixed_positions = 1e9  # columns cost nothing: every draft found is verified (the path under test)
    return BuiltinBackend(str(tiny_dir), device="cpu", speculate=0), spec


async def test_greedy_answers_are_the_same_token_for_token_and_drafts_are_used(backends: tuple[BuiltinBackend, BuiltinBackend]) -> None:
    plain, spec = backends
    prompts = [prompt(plain, t) for t in TEXTS]
    greedy = SamplingParams(max_tokens=40, temperature=0.0)
    before = spec.stats()["accepted_tokens"]
    expected = await asyncio.gather(*(run(plain, p, greedy) for p in prompts))
    got = await asyncio.gather(*(run(spec, p, greedy) for p in prompts))
    assert [g[0] for g in got] == [e[0] for e in expected]
    assert [g[2] for g in got] == [e[2] for e in expected]
    for (_, a, _), (_, b, _) in zip(expected, got, strict=True):
        assert b == pytest.approx(a, abs=1e-4)
    assert spec.stats()["accepted_tokens"] > before  # the tiny model repeats itself: drafts were accepted
    assert spec.stats()["decode_tokens"] >= spec.stats()["accepted_tokens"]


async def test_sampled_logprobs_match_a_full_forward_and_seeds_do_not_depend_on_the_batch(backends: tuple[BuiltinBackend, BuiltinBackend]) -> None:
    _, spec = backends
    prompts = [prompt(spec, t) for t in TEXTS]
    together = await asyncio.gather(*(run(spec, p, s) for p, s in zip(prompts, SETTINGS, strict=True)))
    for p, s, (tokens, lps, finish) in zip(prompts, SETTINGS, together, strict=True):
        assert finish in ("stop", "length") and (len(tokens) == s.max_tokens or finish == "stop")
        assert full_forward_gap(spec, p, tokens, lps, s.temperature) <= 1e-4
    alone = [await run(spec, p, s) for p, s in zip(prompts[:3], SETTINGS[:3], strict=True)]
    assert [a[0] for a in alone] == [t[0] for t in together[:3]]


async def test_sampled_answers_are_the_same_tokens_with_and_without_drafts(backends: tuple[BuiltinBackend, BuiltinBackend]) -> None:
    plain, spec = backends
    prompts = [prompt(plain, t) for t in TEXTS]
    settings = [SamplingParams(max_tokens=40, temperature=t, top_p=p, seed=11 + i) for i, (t, p) in enumerate([(1.0, 1.0), (0.05, 1.0), (1.0, 0.9), (1.3, 0.95), (0.1, 0.8), (0.5, 1.0)])][: len(prompts)]
    before = spec.stats()
    expected = await asyncio.gather(*(run(plain, p, s) for p, s in zip(prompts, settings, strict=True)))
    got = await asyncio.gather(*(run(spec, p, s) for p, s in zip(prompts, settings, strict=True)))
    assert [g[0] for g in got] == [e[0] for e in expected]
    for (_, a, _), (_, b, _) in zip(expected, got, strict=True):
        assert b == pytest.approx(a, abs=1e-4)
    after = spec.stats()
    assert after["drafted_tokens"] - before["drafted_tokens"] >= 10
    assert after["accepted_tokens"] > before["accepted_tokens"]  # drafts were accepted while sampling


async def test_a_stop_token_among_accepted_drafts_ends_the_answer_there(backends: tuple[BuiltinBackend, BuiltinBackend]) -> None:
    plain, spec = backends
    ids = prompt(plain, TEXTS[2])
    free = await run(plain, ids, SamplingParams(max_tokens=30, temperature=0.0))
    stop_at = next(i for i in range(3, len(free[0])) if free[0][i] in free[0][:i])  # a token drafts can reach
    stop = SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=[free[0][stop_at]])
    expected = await run(plain, ids, stop)
    got = await run(spec, ids, stop)
    assert got[0] == expected[0] and got[2] == expected[2] == "stop" and got[0][-1] == free[0][stop_at]
    # the budget holds when drafts run past it
    short = await run(spec, ids, SamplingParams(max_tokens=5, temperature=0.0))
    assert short[0] == free[0][:5] and short[2] == "length"
    # what a draft-finished answer left in the prefix cache serves a later call as a cold prefill would
    follow = ids + got[0] + ids[-4:]
    assert (await run(spec, follow, SamplingParams(max_tokens=8, temperature=0.0)))[0] == (await run(plain, follow, SamplingParams(max_tokens=8, temperature=0.0)))[0]


def test_the_spec_option_parses_and_bad_values_are_config_errors(tiny_dir: Path) -> None:
    for bad in ("x", "-1", "2.5"):
        with pytest.raises(ConfigError, match="speculate"):
            from_spec(PolicySpec.parse(f"builtin:{tiny_dir}?device=cpu&speculate={bad}"))
    assert from_spec(PolicySpec.parse(f"builtin:{tiny_dir}?device=cpu&speculate=3"))._loop.speculate == 3


async def test_drafts_left_out_of_the_forward_still_teach_the_rows_acceptance(tiny_dir: Path) -> None:
    frugal = BuiltinBackend(str(tiny_dir), device="cpu", speculate=4)
    frugal._loop.fixed_positions = 0.0  # a column costs as much as a forward: no draft is ever verified
    ids = prompt(frugal, TEXTS[3])
    before = frugal.stats()
    await run(frugal, ids, SamplingParams(max_tokens=30, temperature=0.0))
    loop = frugal._loop
    assert frugal.stats()["drafted_tokens"] == before["drafted_tokens"]
    assert loop.trials >= 20 and loop.hits >= 15  # the greedy tiny model repeats itself: its unverified drafts would have passed
    await frugal.aclose()


async def test_the_batch_prior_follows_a_changing_policy(tiny_dir: Path) -> None:
    """The prior of rows without history forgets old trials: after a policy stops agreeing, it drops within a window."""
    from core.backends.batching import PRIOR_WINDOW

    backend = BuiltinBackend(str(tiny_dir), device="cpu", speculate=4)
    loop = backend._loop
    row = type("Row", (), {"trials": 0, "hits": 0})()
    for _ in range(10):
        loop._tried(row, PRIOR_WINDOW // 4, PRIOR_WINDOW // 4)  # a policy whose drafts all pass
    assert loop.trials <= PRIOR_WINDOW and loop.hits / loop.trials == 1.0
    for _ in range(8):
        loop._tried(row, PRIOR_WINDOW // 4, 0)  # after a weight reload none does
    assert (loop.hits + 1) / (loop.trials + 2) < 0.3  # a lifetime count would still say 10 / 18
    assert (row.trials, row.hits) == (18 * (PRIOR_WINDOW // 4), 10 * (PRIOR_WINDOW // 4))  # a row's own count is its whole life
    await backend.aclose()
