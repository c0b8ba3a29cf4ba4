"""The local trainer's math on the tiny model: logprob agreement, learning sign, advantages, checkpoints."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from core.backends.base import GenerationContext, SamplingParams
from core.chat import ChatRequest
from core.errors import ConfigError, ForgetuiError
from core.train.advantages import compute_advantages
from core.train.types import Sample

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Say hello"


def _ctx() -> GenerationContext:
    return GenerationContext(
        session="s", call_seq=0, request=ChatRequest(api="chat", model="m", messages=[], tools=[])
    )


def _prompt(backend) -> list[int]:
    rendered = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    return backend.tokenizer(rendered, add_special_tokens=False)["input_ids"]


def generate(
    backend, prompt: list[int], seed: int, temperature: float = 1.0, max_tokens: int = 16
) -> tuple[list[int], list[float]]:
    """One sampled completion (ids, recorded logprobs) from a BuiltinBackend."""

    async def run() -> tuple[list[int], list[float]]:
        ids: list[int] = []
        lps: list[float] = []
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
        async for chunk in backend.generate(prompt, params, _ctx()):
            ids += chunk.token_ids
            lps += chunk.logprobs
        return ids, lps

    return asyncio.run(run())


def sample(
    prompt: list[int],
    completion: tuple[list[int], list[float]],
    *,
    rollout: str,
    reward: float = 0.0,
    task: str = "t",
    step: int = 0,
    branch: int = 0,
) -> Sample:
    """A Sample built by hand from a prompt and a recorded completion."""
    ids, lps = completion
    return Sample(
        sample_id=f"{rollout}-{branch}",
        run_id="run",
        rollout_id=rollout,
        task_id=task,
        branch=branch,
        step=step,
        token_ids=list(prompt) + list(ids),
        loss_mask=[0] * len(prompt) + [1] * len(ids),
        logprobs=[0.0] * len(prompt) + list(lps),
        prompt_tokens=len(prompt),
        reward=reward,
    )


def bare(reward: float, rollout: str, *, task: str = "t", step: int = 0, branch: int = 0) -> Sample:
    """A sample whose tokens do not matter (advantage tests)."""
    return Sample(
        sample_id=f"{rollout}-{branch}",
        run_id="run",
        rollout_id=rollout,
        task_id=task,
        branch=branch,
        step=step,
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -1.0],
        prompt_tokens=1,
        reward=reward,
    )


@pytest.fixture(scope="module")
def backend():
    from core.backends.builtin import BuiltinBackend

    b = BuiltinBackend("tiny", device="cpu")
    yield b
    asyncio.run(b.aclose())


@pytest.fixture(scope="module")
def prompt(backend) -> list[int]:
    return _prompt(backend)


@pytest.fixture(scope="module")
def completions(backend, prompt) -> list[tuple[list[int], list[float]]]:
    """Two different completions of the prompt at temperature 1 (seeds 1 and 2)."""
    out = [generate(backend, prompt, seed) for seed in (1, 2)]
    assert out[0][0] != out[1][0] and all(len(ids) >= 4 for ids, _ in out)
    return out


def trainer(**kw):
    from core.train.local import LocalTrainer

    return LocalTrainer("tiny", device="cpu", **kw)


def pair(prompt, completions, rewards=(1.0, 0.0)) -> list[Sample]:
    """Both completions as two rollouts of one group, with advantages set (grpo)."""
    samples = [
        sample(prompt, c, rollout=f"r{i}", reward=r)
        for i, (c, r) in enumerate(zip(completions, rewards, strict=True))
    ]
    compute_advantages(samples)
    return samples


def weights(t) -> dict:
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


# ------------------------------------------------------------------ (a) logprob agreement


def test_recorded_logprobs_agree_with_the_trainer(prompt, completions) -> None:
    samples = pair(prompt, completions)
    for micro in (1, 2):  # alone, and right-padded next to the other sample
        t = trainer(pack_samples=micro, lr=1e-3)
        agreement = t.logprob_agreement(samples)
        assert agreement["tokens"] == sum(len(ids) for ids, _ in completions)
        assert agreement["logprob_diff_max"] <= 1e-3
        metrics = t.step(samples)  # measured under the weights before the update
        assert metrics["logprob_diff_max"] <= 1e-3 and metrics["logprob_diff_mean"] <= 1e-4
        assert metrics["tokens"] == agreement["tokens"] and metrics["optimizer_step"] == 1.0
        after = t.logprob_agreement(samples)
        assert after["logprob_diff_max"] > 1e-2  # the update moved the policy: the check can see a difference


def test_a_merged_two_call_sample_agrees_on_its_sampled_tokens_only(backend, prompt) -> None:
    """prompt + call 1 + tool output (mask 0) + call 2, as the proxy merges a rollout's calls."""
    first = generate(backend, prompt, seed=3, max_tokens=8)
    tool = backend.tokenizer("<tool_response>\nhello.txt\n</tool_response>", add_special_tokens=False)[
        "input_ids"
    ]
    second_prompt = prompt + first[0] + tool
    second = generate(backend, second_prompt, seed=4, max_tokens=8)
    merged = Sample(
        sample_id="m",
        run_id="run",
        rollout_id="m",
        task_id="t",
        branch=0,
        step=0,
        token_ids=second_prompt + second[0],
        loss_mask=[0] * len(prompt) + [1] * len(first[0]) + [0] * len(tool) + [1] * len(second[0]),
        logprobs=[0.0] * len(prompt) + first[1] + [0.0] * len(tool) + second[1],
        prompt_tokens=len(prompt),
        reward=1.0,
        advantage=1.0,
    )
    agreement = trainer().logprob_agreement([merged])
    assert agreement["tokens"] == len(first[0]) + len(second[0])
    assert agreement["logprob_diff_max"] <= 1e-3


def test_logprobs_are_recomputed_at_the_sampler_temperature(backend, prompt) -> None:
    hot = sample(prompt, generate(backend, prompt, seed=5, temperature=0.7), rollout="hot", reward=1.0)
    assert trainer(temperature=0.7).logprob_agreement([hot])["logprob_diff_max"] <= 1e-3
    assert trainer(temperature=1.0).logprob_agreement([hot])["logprob_diff_max"] > 1e-2


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_gradient_accumulation_matches_one_batch(prompt, completions, mode) -> None:
    samples = pair(prompt, completions)
    one, two = (
        trainer(pack_samples=1, loss_agg_mode=mode),
        trainer(pack_samples=2, loss_agg_mode=mode),
    )
    m1, m2 = one.step(samples), two.step(samples)
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "tokens"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-7), key


def test_packed_samples_get_the_logprobs_they_get_alone_and_no_padding(prompt, completions, backend) -> None:
    third = generate(backend, prompt, seed=9, max_tokens=5)  # shorter: samples of different lengths in one row
    samples = [*pair(prompt, completions), sample(prompt, third, rollout="r3", reward=0.5)]
    samples[2].advantage = 0.25
    alone, packed = trainer(pack_samples=1), trainer(pack_samples=3, share_prefix=False)
    assert packed.packed
    for a, b in zip(alone.logprobs(samples), packed.logprobs(samples), strict=True):
        assert b == pytest.approx(a, abs=1e-5)
    metrics = packed.step(samples)
    assert metrics["train_tokens"] == sum(len(s.token_ids) for s in samples)  # one packed row: no padding ran
    assert metrics["train_tokens_per_s"] > 0 and metrics["logprob_diff_max"] <= 1e-3


def _grads(t, samples, sft: bool = False) -> tuple[dict, dict]:
    """(metrics, gradients) of one step, the optimizer not applied."""
    got: dict = {}

    def keep(metrics, caller):
        got.update({n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None})
        return metrics

    t._apply_gradients = keep
    return (t.sft_step(samples) if sft else t.step(samples)), got


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for name, grad in a.items():
        assert float((grad - b[name]).abs().max()) <= 1e-4 * float(grad.abs().max()) + 1e-9, name


def _tool_turn(backend, prompt, first, seed):
    """prompt + first call + a tool output + a second call, merged (a two-call rollout's sample)."""
    tool = backend.tokenizer("<tool_response>\nok\n</tool_response>", add_special_tokens=False)["input_ids"]
    second = generate(backend, prompt + first[0] + tool, seed=seed, max_tokens=6)
    return Sample(
        sample_id=f"m{seed}", run_id="run", rollout_id=f"m{seed}", task_id="t", branch=0, step=0,
        token_ids=prompt + first[0] + tool + second[0],
        loss_mask=[0] * len(prompt) + [1] * len(first[0]) + [0] * len(tool) + [1] * len(second[0]),
        logprobs=[0.0] * len(prompt) + first[1] + [0.0] * len(tool) + second[1],
        prompt_tokens=len(prompt), reward=1.0, advantage=-0.5,
    )


def test_a_shared_prefix_runs_once_and_changes_no_logprob_and_no_gradient(prompt, completions, backend) -> None:
    """A GRPO group's prompt laid once per row: the same logprobs, the same gradients, the prompt counted once.

    The row also holds two merged two-call samples whose first call is the same sampled completion
    (trained tokens inside the shared prefix, counted once per sample) and a sample that is all prefix.
    """
    samples = pair(prompt, completions)
    samples += [_tool_turn(backend, prompt, completions[0], seed) for seed in (11, 12)]
    samples[3].advantage = 0.75
    short = sample(prompt, (completions[0][0][:2], completions[0][1][:2]), rollout="short", reward=0.0)
    short.advantage = 0.3
    samples.append(short)
    merged_only = samples[2:]  # they share the prompt and 2 sampled tokens: trained tokens in the shared prefix; `short` is all prefix
    from core.train.logprobs import collate

    assert collate(merged_only).shared == len(prompt) + 2 and collate(samples).shared >= len(prompt)
    for group in (samples, merged_only):
        plain, shared = trainer(pack_samples=8, share_prefix=False), trainer(pack_samples=8)
        for a, b in zip(plain.logprobs(group), shared.logprobs(group), strict=True):
            assert b == pytest.approx(a, abs=1e-5)
        m1, g1 = _grads(plain, group)
        m2, g2 = _grads(shared, group)
        _close(g1, g2)
        for key in ("loss", "pg_loss", "entropy", "tokens"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
        assert m1["train_tokens"] == sum(len(s.token_ids) for s in group)
        assert m2["train_tokens"] <= m1["train_tokens"] - (len(group) - 1) * len(prompt)  # the prompt ran once
        assert m2["logprob_diff_max"] <= 1e-3


def test_sft_steps_share_the_prefix_of_different_tasks_exactly(prompt, completions, backend) -> None:
    """Different tasks under one system prompt: only their common beginning is shared; SFT's gradient is unchanged."""
    from core.train.logprobs import collate, pack

    other = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say goodbye to the world"}], tokenize=False, add_generation_prompt=True
    )
    other_prompt = backend.tokenizer(other, add_special_tokens=False)["input_ids"]
    samples = [sample(prompt, c, rollout=f"a{i}") for i, c in enumerate(completions)]
    samples += [sample(other_prompt, generate(backend, other_prompt, seed), rollout=f"b{seed}") for seed in (3, 4)]
    for s in samples:
        s.advantage = 1.0
    batch = collate(samples)
    common = min(len(prompt), len(other_prompt)) - 8
    assert common <= batch.shared < len(prompt)  # the system prompt, not the task's own words
    assert batch.width == batch.shared + sum(len(s.token_ids) - batch.shared for s in samples)
    assert collate(samples, share_prefix=False).width == sum(len(s.token_ids) for s in samples)
    m1, g1 = _grads(trainer(share_prefix=False), samples, sft=True)
    m2, g2 = _grads(trainer(), samples, sft=True)
    _close(g1, g2)
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5)
    # packing in token order puts each prompt's samples in one row (two rows of two, not mixed)
    interleaved = [samples[0], samples[2], samples[1], samples[3]]
    rows = pack(interleaved, 2, 10_000, share_prefix=True)
    assert sorted(sorted(s.rollout_id for s in row) for row in rows) == [["a0", "a1"], ["b3", "b4"]]


def test_packing_keeps_a_long_shared_prompt_in_one_row_and_splits_groups_that_share_little() -> None:
    """Rows are filled while sharing pays: groups under one system prompt together, groups sharing a short start apart."""
    from core.train.logprobs import collate, pack

    def group(head: list[int], task: int) -> list[Sample]:
        return [
            Sample(sample_id=f"{task}-{r}", run_id="r", rollout_id=f"{task}-{r}", task_id=str(task), branch=0, step=0,
                   token_ids=[*head, *range(1000 + 50 * r, 1040 + 50 * r)], loss_mask=[0] * len(head) + [1] * 40,
                   logprobs=[0.0] * (len(head) + 40), prompt_tokens=len(head), advantage=1.0)
            for r in range(4)
        ]  # fmt: skip

    system = list(range(10, 310))  # 300 tokens every rollout sees
    react_like = group([*system, 1, 2, 3], 0) + group([*system, 4, 5, 6], 1)  # the task after the system prompt
    rows = pack(react_like, 32, 100_000, share_prefix=True)
    assert [len(r) for r in rows] == [8] and collate(rows[0]).shared == 300
    start = list(range(10, 30))  # 20 tokens, then each task's own 300 (mini-swe-agent's order)
    mini_like = group([*start, *range(400, 700)], 0) + group([*start, *range(800, 1100)], 1)
    rows = pack(mini_like, 32, 100_000, share_prefix=True)
    assert sorted(sorted(s.task_id for s in row) for row in rows) == [["0"] * 4, ["1"] * 4]
    assert sum(collate(r).width for r in rows) == 2 * (320 + 4 * 40)  # one row: 20 + 8 × (300 + 40) = 2,740 tokens


def test_samples_as_numpy_arrays_collate_like_lists(prompt, completions) -> None:
    """samples_for_run builds token ids, masks and logprobs as numpy arrays: packing takes them as it takes lists."""
    import dataclasses

    import numpy as np
    import torch

    from core.train.logprobs import collate

    lists = pair(prompt, completions)
    arrays = [
        dataclasses.replace(s, token_ids=np.asarray(s.token_ids, dtype=np.int32), loss_mask=np.asarray(s.loss_mask, dtype=np.int32), logprobs=np.asarray(s.logprobs))
        for s in lists
    ]
    a, b = collate(lists), collate(arrays)
    for name in ("input_ids", "position_ids", "positions", "rows", "cols", "targets", "mask", "recorded", "advantages"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.segments == b.segments and int(a.mask.sum()) == sum(int(np.sum(s.loss_mask[1:])) for s in lists) > 0
    assert a.targets.tolist() == [t for s in lists for t, m in zip(s.token_ids[1:], s.loss_mask[1:], strict=True) if m]


def test_chunked_logits_and_gradient_checkpointing_change_nothing_but_memory(prompt, completions, monkeypatch) -> None:

    import core.train.logprobs as logprobs

    samples = pair(prompt, completions)

    def gradients(t) -> dict:
        return _grads(t, samples)[1]

    plain = gradients(trainer())
    monkeypatch.setattr(logprobs, "LOGIT_CHUNK_ELEMENTS", 3 * 4096)  # three positions' logits at a time
    lean = trainer(gradient_checkpointing=True)
    layer = lean._checkpointed[0]
    calls = []
    layer.register_forward_pre_hook(lambda *_: calls.append(1))
    chunked = gradients(lean)
    assert len(calls) == 2  # the layer ran again in the backward pass: its activations were not kept
    assert plain.keys() == chunked.keys()
    for name, grad in plain.items():
        assert float((grad - chunked[name]).abs().max()) <= 1e-5 * float(grad.abs().max()) + 1e-10, name  # float rounding only
    assert not layer.training  # eval mode outside the pass


def test_a_sampler_that_disagrees_is_corrected_by_verls_truncated_importance_weights(prompt, completions) -> None:
    import math

    samples = pair(prompt, completions)
    samples[0].advantage, samples[1].advantage = 1.0, -0.5
    gap = 0.5  # a sampler this much less sure of every token than the trainer (stale or lower-precision weights)
    for s in samples:
        s.logprobs = [lp - gap if m else lp for lp, m in zip(s.logprobs, s.loss_mask, strict=True)]
    corrected = trainer(lr=1e-3).step(samples)
    tokens = corrected["tokens"]
    assert corrected["rollout_is_tokens"] == tokens and corrected["logprob_diff_max"] == pytest.approx(gap, abs=1e-4)
    assert corrected["rollout_is_mean"] == pytest.approx(math.exp(gap), abs=1e-4)  # π_trainer / π_sampler, under the cap of 2
    # ratio 1 against the trainer's own logprobs (nothing clips), each token's loss weighted by its importance weight
    expected = -sum(s.advantage * math.exp(gap) * sum(s.loss_mask[1:]) for s in samples) / tokens
    assert corrected["pg_loss"] == pytest.approx(expected, rel=1e-4) and corrected["pg_clipfrac"] == 0.0
    ignored = trainer(lr=1e-3, rollout_correction="off").step(samples)  # the PPO ratio e^0.5 against the sampler clips
    assert ignored["rollout_is_tokens"] == 0.0 and ignored["pg_clipfrac"] > 0.0
    capped = trainer(lr=1e-3, rollout_correction="token", rollout_is_threshold=1.2).step(samples)
    assert capped["rollout_is_max"] == pytest.approx(1.2) and capped["rollout_is_mean"] == pytest.approx(1.2)  # truncated


def test_a_bfloat16_trainer_keeps_float32_weights_and_corrects_its_mismatch(prompt, completions) -> None:
    import torch

    samples = pair(prompt, completions)
    t = trainer(dtype="bfloat16", lr=1e-3)
    assert t.compute_dtype == torch.bfloat16 and all(p.dtype == torch.float32 for p in t.model.parameters())
    metrics = t.step(samples)  # the samples came from a float32 sampler
    assert metrics["optimizer_step"] == 1.0 and metrics["logprob_diff_max"] > 1e-3
    assert metrics["rollout_is_tokens"] == metrics["tokens"]


# ------------------------------------------------------------------ (b) learning signal


@pytest.mark.parametrize("kw", [{}, {"lora_rank": 4, "seed": 0}], ids=["full", "lora"])
def test_one_step_raises_the_rewarded_completion_and_lowers_the_other(prompt, completions, kw) -> None:
    samples = pair(prompt, completions)
    assert samples[0].advantage > 0 > samples[1].advantage
    t = trainer(lr=1e-3, **kw)
    before = [sum(lps) for lps in t.logprobs(samples)]
    metrics = t.step(samples)
    after = [sum(lps) for lps in t.logprobs(samples)]
    assert after[0] > before[0] + 0.1, (before, after)
    assert after[1] < before[1] - 0.1, (before, after)
    assert metrics["grad_norm"] > 0 and metrics["samples_trained"] == 2 and 7.0 < metrics["entropy"] < 9.0


def test_kl_to_the_reference_is_zero_at_the_start_and_grows(prompt, completions) -> None:
    samples = pair(prompt, completions)
    for kw in ({}, {"lora_rank": 4, "seed": 0}):
        t = trainer(lr=1e-3, kl_coef=0.1, **kw)
        first = t.step(samples)
        assert abs(first["kl"]) < 1e-6
        second = t.step(samples)
        assert second["kl"] > 1e-4


# ------------------------------------------------------------------ (c) zero-variance groups


def test_a_zero_variance_group_gets_no_gradient(prompt, completions) -> None:
    flat = pair(prompt, completions, rewards=(1.0, 1.0))
    assert [s.advantage for s in flat] == [0.0, 0.0]
    t = trainer(lr=1e-2, weight_decay=0.1)
    start = weights(t)
    metrics = t.step(flat)
    assert metrics["samples"] == 2 and metrics["samples_skipped"] == 2 and metrics["optimizer_step"] == 0.0
    assert metrics["grad_norm"] == 0.0 and t.updates == 0
    assert all(bool((start[k] == v).all()) for k, v in weights(t).items())
    # the sampler-vs-trainer check still ran, over every sampled token, not a 0.0 nobody measured
    assert metrics["logprob_diff_tokens"] == sum(sum(s.loss_mask) for s in flat) > 0
    assert metrics["logprob_diff_max"] == t.logprob_agreement(flat)["logprob_diff_max"] <= 1e-3


def test_flat_groups_are_skipped_beside_a_group_with_signal(prompt, completions) -> None:
    signal = pair(prompt, completions)
    flat = [sample(prompt, c, rollout=f"f{i}", task="other", reward=0.5) for i, c in enumerate(completions)]
    stats = compute_advantages(signal + flat)
    assert stats.groups == 2 and stats.zero_variance_groups == 1 and stats.rollouts == 4
    metrics = trainer(lr=1e-3).step(signal + flat)
    assert metrics["samples"] == 4 and metrics["samples_trained"] == 2 and metrics["samples_skipped"] == 2
    assert metrics["tokens"] == sum(len(ids) for ids, _ in completions)


# ------------------------------------------------------------------ (d) advantages


def test_a_rollout_with_two_branches_counts_once_in_its_group() -> None:
    samples = [bare(1.0, "a", branch=0), bare(1.0, "a", branch=1), bare(0.0, "b")]
    stats = compute_advantages(samples)
    # per rollout: rewards [1, 0] → mean 0.5, std 0.7071 → ±0.7071 (per sample it would be mean 2/3)
    assert [s.advantage for s in samples] == pytest.approx([0.70710, 0.70710, -0.70710], abs=1e-4)
    assert (stats.rollouts, stats.samples, stats.groups, stats.mean_reward) == (2, 3, 1, 0.5)
    compute_advantages(samples, "dr_grpo")
    assert [s.advantage for s in samples] == pytest.approx([0.5, 0.5, -0.5])


def test_hand_computed_rloo_dr_grpo_and_grpo() -> None:
    def group() -> list[Sample]:
        return [bare(1.0, "a"), bare(0.0, "b"), bare(0.0, "c")]

    expected = {
        ("rloo", True): [1.0, -0.5, -0.5],  # r_i − mean of the others
        ("grpo", False): [2 / 3, -1 / 3, -1 / 3],  # Dr.GRPO: r_i − group mean, no std
        ("dr_grpo", True): [2 / 3, -1 / 3, -1 / 3],
        ("grpo", True): [1.154700, -0.577350, -0.577350],  # (r_i − 1/3) / sqrt(1/3) (unbiased std)
    }
    for (name, norm), values in expected.items():
        samples = group()
        compute_advantages(samples, name, norm_by_std=norm)
        assert [s.advantage for s in samples] == pytest.approx(values, abs=1e-5), name


def test_groups_are_step_and_task() -> None:
    samples = [
        bare(1.0, "a", step=0),
        bare(0.0, "b", step=0),
        bare(0.0, "c", step=1),
        bare(1.0, "d", step=1, task="u"),
    ]
    stats = compute_advantages(samples, "rloo")
    assert stats.groups == 3 and stats.singleton_groups == 2 and stats.zero_variance_groups == 0
    assert [s.advantage for s in samples[:2]] == pytest.approx([1.0, -1.0])


def test_reinforce_plus_plus_and_equal_groups_are_exactly_zero() -> None:
    samples = [
        bare(0.1, "a"),
        bare(0.1, "b"),
        bare(0.1, "c"),
        bare(1.0, "d", task="u"),
        bare(0.0, "e", task="u"),
    ]
    stats = compute_advantages(samples, "reinforce_plus_plus")
    assert [s.advantage for s in samples[:3]] == [0.0, 0.0, 0.0] and stats.zero_variance_groups == 1
    assert samples[3].advantage > 0 > samples[4].advantage
    compute_advantages(samples, "grpo")
    assert [s.advantage for s in samples[:3]] == [0.0, 0.0, 0.0]


def test_advantage_errors() -> None:
    with pytest.raises(ConfigError):
        compute_advantages([bare(1.0, "a")], "gae")
    with pytest.raises(ConfigError):
        compute_advantages([bare(1.0, "a")], "rloo", norm_by_std=False)
    with pytest.raises(ForgetuiError, match="reward"):
        compute_advantages([bare(1.0, "a", branch=0), bare(0.0, "a", branch=1)])


# ------------------------------------------------------------------ (e) weights out


def _agree(t, backend, prompt, seed: int = 11) -> float:
    """Sample from `backend`, recompute under trainer `t`: the max logprob difference."""
    s = sample(prompt, generate(backend, prompt, seed=seed), rollout="check", reward=1.0)
    return t.logprob_agreement([s])["logprob_diff_max"]


@pytest.mark.parametrize("kw", [{}, {"lora_rank": 4, "seed": 0}], ids=["full", "lora"])
def test_checkpoint_and_reload_weights_give_the_trainers_logprobs(
    tmp_path, backend, prompt, completions, kw
) -> None:
    from core.backends.builtin import BuiltinBackend
    from core.backends.spec import PolicySpec, build_token_backend

    t = trainer(lr=3e-3, **kw)
    t.step(pair(prompt, completions))
    assert _agree(t, backend, prompt) > 1e-2  # the trainer moved away from the tiny model's weights
    path = t.save_checkpoint(tmp_path / "ckpt")
    loaded = build_token_backend(PolicySpec.parse(f"builtin:{path}?device=cpu"))
    try:
        assert _agree(t, loaded, prompt) <= 1e-4
        assert len(loaded.tokenizer) == len(backend.tokenizer) and loaded.tokenizer.chat_template
    finally:
        asyncio.run(loaded.aclose())
    fresh = BuiltinBackend("tiny", device="cpu")
    try:
        fresh.reload_weights(t.state_dict_for_backend())
        assert fresh.weights_version == 1
        assert _agree(t, fresh, prompt) <= 1e-4
    finally:
        asyncio.run(fresh.aclose())


@pytest.mark.parametrize("kw", [{}, {"lora_rank": 4, "seed": 0}], ids=["full", "lora"])
def test_resume_continues_exactly(tmp_path, prompt, completions, kw) -> None:
    first, second = pair(prompt, completions), pair(prompt, completions, rewards=(0.0, 1.0))
    a = trainer(lr=1e-3, warmup_steps=3, **kw)
    a.step(first)
    a.save_checkpoint(tmp_path / "ckpt")
    a.step(second)
    b = trainer(lr=1e-3, warmup_steps=3, **kw)
    b.load_checkpoint(tmp_path / "ckpt")
    assert b.updates == 1 and b.lr == pytest.approx(a.optimizer.param_groups[0]["initial_lr"] * 2 / 3)
    b.step(second)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] - wb[k]).abs().max() <= 1e-6, k


def test_resume_refuses_a_checkpoint_of_another_kind(tmp_path) -> None:
    trainer().save_checkpoint(tmp_path / "full")
    with pytest.raises(ConfigError, match="LoRA|full"):
        trainer(lora_rank=4).load_checkpoint(tmp_path / "full")
    with pytest.raises(ConfigError, match="not a trainer checkpoint"):
        trainer().load_checkpoint(tmp_path)


def test_the_run_configs_pack_samples_bounds_each_forward(prompt, completions, backend) -> None:
    """`train.pack_samples` reaches the trainer: a step's forwards hold at most that many samples (the SFT batch is micro_batch_size)."""
    from core.config import load_config
    from core.train.local import LocalTrainer, trainer_settings

    config = load_config(None, ["train.pack_samples=2", "train.micro_batch_size=7"])
    settings = trainer_settings(config.train)
    assert settings["pack_samples"] == 2 and "micro_batch_size" not in settings
    samples = [*pair(prompt, completions), sample(prompt, generate(backend, prompt, seed=9, max_tokens=5), rollout="r3", reward=0.5)]
    rows = [chunk for chunk, _ in LocalTrainer("tiny", device="cpu", **settings)._micro_batches(samples)]
    assert [len(r) for r in rows] == [2, 1]
    assert [len(r) for r, _ in trainer()._micro_batches(samples)] == [3]  # the default: all three in one forward
    with pytest.raises(ConfigError):
        load_config(None, ["train.pack_samples=0"])


def test_bad_trainer_settings_are_config_errors() -> None:
    for kw in ({"loss_agg_mode": "mean"}, {"pack_samples": 0}, {"old_logprobs": "old"}, {"policy_loss": "nope"}, {"no_such": 1}, {"dtype": "bf16"}, {"rollout_correction": "yes"}):
        with pytest.raises(ConfigError):
            trainer(**kw)


def test_importing_the_trainer_is_cheap() -> None:
    code = (
        "import sys, core.train.local, core.train.advantages, core.train.logprobs, core.train.weights\n"
        "print(sorted(m for m in ('torch', 'verl', 'peft', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ per-call credit (train.call_discount)


def _two_calls(backend, prompt) -> Sample:
    """prompt + call 1 + tool output + call 2, with each call's completion span, as `samples_for_run` builds it."""
    first = generate(backend, prompt, seed=3, max_tokens=8)
    tool = backend.tokenizer("<tool_response>\nok\n</tool_response>", add_special_tokens=False)["input_ids"]
    second = generate(backend, prompt + first[0] + tool, seed=4, max_tokens=8)
    a = len(prompt)
    b = a + len(first[0]) + len(tool)
    return Sample(
        sample_id="m", run_id="run", rollout_id="m", task_id="t", branch=0, step=0,
        token_ids=prompt + first[0] + tool + second[0],
        loss_mask=[0] * a + [1] * len(first[0]) + [0] * len(tool) + [1] * len(second[0]),
        logprobs=[0.0] * a + first[1] + [0.0] * len(tool) + second[1],
        prompt_tokens=a, call_ids=["c1", "c2"], completion_starts=[a, b], completion_ends=[a + len(first[0]), b + len(second[0])],
        reward=1.0, advantage=2.0,
    )


def test_call_discount_gives_each_calls_tokens_its_share_of_the_advantage(backend, prompt) -> None:
    from core.train.advantages import discount_calls
    from core.train.logprobs import collate

    merged = _two_calls(backend, prompt)
    n1 = merged.completion_ends[0] - merged.completion_starts[0]
    n2 = merged.completion_ends[1] - merged.completion_starts[1]
    discount_calls([merged], 0.5)
    assert merged.call_weights == [0.5, 1.0]
    row = collate([merged]).advantages[0].tolist()
    assert row == [1.0] * n1 + [2.0] * n2  # advantage 2: the first call × 0.5, the last whole
    discount_calls([merged], 1.0)
    assert merged.call_weights == [] and collate([merged]).advantages[0].tolist() == [2.0] * (n1 + n2)
    assert "call_weights" not in merged.row()
    with pytest.raises(ValueError, match="call discount"):
        discount_calls([merged], 0.0)


@pytest.mark.parametrize("gamma", [1.0, 0.25])
def test_call_discount_reaches_the_policy_loss(backend, prompt, gamma) -> None:
    """On-policy (ratio 1), token-mean: pg_loss = −Σ advantage·weight / tokens, so the discount shows in the loss."""
    from core.train.advantages import discount_calls

    merged = _two_calls(backend, prompt)
    n1 = merged.completion_ends[0] - merged.completion_starts[0]
    n2 = merged.completion_ends[1] - merged.completion_starts[1]
    discount_calls([merged], gamma)
    metrics = trainer(lr=1e-3).step([merged])
    assert metrics["pg_loss"] == pytest.approx(-2.0 * (gamma * n1 + n2) / (n1 + n2), rel=1e-3)


def test_call_discount_is_checked_when_the_config_loads() -> None:
    from core.config import load_config
    from core.train.trainers import trainer_for

    for bad in ("0", "1.5", '"half"'):
        with pytest.raises(ConfigError, match="call_discount"):
            load_config(overrides=[f"train.call_discount={bad}"])
    config = load_config(overrides=["train.call_discount=0.9", 'train.trainer="verl"'])
    assert config.train.call_discount == 0.9
    with pytest.raises(ConfigError, match="local trainer"):
        trainer_for(config).check(config)
