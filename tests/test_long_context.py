"""Long-context harnesses on CPU: a GRPO step through Codex and Claude Code in Docker on ≥ 20k-token samples.

Their first requests outgrow SmolLM2's 8,192 positions, so the policy is the built-in tiny model
(65,536 positions). Its random weights never solve a task, so the verifier is `AnswerHashEnv`: the
`hello` task scored on the sampled answer itself (a hash of the recorded assistant text), a reward that
differs within a group. What is checked is the path, not skill: the calls of a rollout merge into one
sample, the trainer's recomputed logprobs agree with the recorded ones, and one update moves the
rewarded sample's logprob up and the other's down.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import duckdb
import pytest

from core.config import load_config
from core.rollout.trajectory import CALLS_SQL, main_conversation
from core.rollout.trajectory_formats import chat_jsonl
from core.run import execute_run
from core.store.bodies import select_calls
from tests.env_fixtures import answer_reward, answer_text
from tests.test_train_loop import rows, sequence_logprobs

MIN_TOKENS = 20_000


def long_config(harness: str, harness_options: dict[str, Any], env_options: dict[str, Any] | None = None):
    """One GRPO step of the tiny model: the `hello` task, 2 rollouts (one group), scored on the answer."""
    sets = {
        "env.name": "tests.env_fixtures:AnswerHashEnv", "harness.name": harness, "policy.backend": "builtin:tiny",
        "runtime.kind": "docker", "run.n_samples": 2, "run.concurrency": 2, "run.timeout_s": 900, "run.max_retries": 0,
        "train.steps": 1, "train.lr": 1e-3, "train.save_every": 1, "train.seed": 0,
    }  # fmt: skip
    config = load_config(None, [f"{k}={v}" if not isinstance(v, str) else f'{k}="{v}"' for k, v in sets.items()])
    config.harness.options = harness_options
    config.env.options = env_options or {}
    return config


def assert_long_grpo_step(config, calls_per_rollout: int) -> None:
    """Run the step; check merging, ≥ 20k-token samples, logprob agreement and the update's sign on the store."""
    from core.train.samples import samples_for_run

    summary = asyncio.run(execute_run(config))
    store = summary.store
    assert summary.rollouts == 2 and summary.infra_errors == 0

    # every call of a rollout extends the one before it token for token: one sample per rollout, all calls merged
    calls = rows(store, "SELECT rollout_id, count(*), count(*) FILTER (WHERE extends_parent) FROM calls GROUP BY 1 ORDER BY 1")
    assert [(n, merged) for _, n, merged in calls] == [(calls_per_rollout, calls_per_rollout - 1)] * 2, calls
    stored = rows(store, "SELECT rollout_id, n_calls, len(token_ids), advantage FROM samples WHERE step = 0 ORDER BY rollout_id")
    assert [(r, n) for r, n, _, _ in stored] == [(r, n) for r, n, _ in calls], stored
    assert all(size >= MIN_TOKENS for _, _, size, _ in stored), stored

    # the trainer's recomputation of every sampled token agrees with what the proxy recorded
    ((diff_max, diff_tokens, trained),) = rows(store, "SELECT CAST(metrics->>'logprob_diff_max' AS DOUBLE), CAST(metrics->>'logprob_diff_tokens' AS INT), "
                                                      "CAST(metrics->>'samples_trained' AS INT) FROM train_steps WHERE step = 0")
    con = duckdb.connect(store, read_only=True)
    samples = samples_for_run(con, summary.run_id, step=0)
    con.close()
    assert trained == 2 and diff_tokens == sum(int(sum(s.loss_mask)) for s in samples)
    assert diff_max <= 1e-3, f"recorded and recomputed logprobs disagree by {diff_max} on {MIN_TOKENS}+-token samples"

    # the reward is the verifier's score of the answer (two answers, two rewards) and the advantages have both signs
    advantage = {rollout: adv for rollout, _, _, adv in stored}
    assert len({s.reward for s in samples}) == 2 and sorted(adv > 0 for adv in advantage.values()) == [False, True]
    assert all(s.reward == pytest.approx(answer_reward(answer_text_of(store, s.rollout_id))) for s in samples)

    # the learning signal's sign: after the update the rewarded answer is likelier and the other one less likely
    before = sequence_logprobs("tiny", samples)
    after = sequence_logprobs(Path(store).parent / "checkpoints" / "step-00000", samples)
    moved = {advantage[s.rollout_id] > 0: a - b for s, a, b in zip(samples, after, before, strict=True)}
    assert moved[True] > 0 > moved[False], moved
    sizes = ", ".join(str(size) for _, _, size, _ in stored)
    print(f"{config.harness.name}: samples of {sizes} tokens, {calls_per_rollout} calls each, logprob diff max {diff_max:.2g}, "
          f"sequence logprob change {moved[True]:+.3f} (rewarded) / {moved[False]:+.3f}")


def answer_text_of(store: str, rollout_id: str) -> str:
    """The answer text the verifier scored: the rollout's recorded conversation, as graders get it."""
    with duckdb.connect(store, read_only=True) as con:
        messages = main_conversation(select_calls(con.cursor(), CALLS_SQL, [rollout_id, 0]))
    return answer_text(chat_jsonl(messages))


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_grpo_step_through_codex_on_long_samples(docker_client, base_image) -> None:
    # a 30 KB AGENTS.md (Codex puts it in its prompt) takes the first request past 24k tiny-model tokens;
    # a second turn (`codex exec resume --last`) resends the first one's conversation: two calls that merge
    config = long_config("tests.harness_fixtures:CodexFollowUp", {"context_window": 65536}, {"agents_md_kb": 30})
    assert_long_grpo_step(config, calls_per_rollout=2)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_grpo_step_through_claude_code_on_long_samples(docker_client, base_image) -> None:
    # a 64-token output cap: the random model runs into it, and Claude Code asks it to go on (3 times), each call
    # extending the one before; six tools keep its first request past 20k tokens (all of them: ~57k)
    options = {"tools": ["Bash", "Read", "Write", "Edit", "Glob", "Grep"], "max_turns": 2, "max_output_tokens": 64}
    assert_long_grpo_step(long_config("claude-code", options), calls_per_rollout=4)


def test_the_fixtures_give_a_reward_of_the_answer_and_a_second_codex_turn() -> None:
    from core.harness import Endpoint
    from core.registry import load_env, load_harness
    from tests.harness_fixtures import FOLLOW_UP_PATH

    # the reward is a function of the answer: the same answer scores the same, two answers differ
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x y z", "tool_calls": None}]
    other = [*said[:1], {"role": "assistant", "content": "x y w"}]
    assert answer_text(chat_jsonl(said)) == answer_text(chat_jsonl(said)) != answer_text(chat_jsonl(other))
    assert answer_reward(answer_text(chat_jsonl(said))) != answer_reward(answer_text(chat_jsonl(other)))
    assert "hi" not in answer_text(chat_jsonl(said))  # the user's words are not the answer
    (task,) = load_env("tests.env_fixtures:AnswerHashEnv", agents_md_kb=30).tasks()
    assert len(task.files["AGENTS.md"]) == 30 * 1024

    # Codex keeps its session (no --ephemeral) and resumes it for the follow-up, with the same flags
    harness = load_harness("tests.harness_fixtures:CodexFollowUp", follow_up="Go on.")
    spec = harness.launch(task, Endpoint(base_url="http://127.0.0.1:1/r/t", token="t", model="policy"), "/workspace")
    script, args = spec.command[2], spec.command[4:]
    assert "--ephemeral" not in args and "-m" in args and args[0] != "exec"
    first, second = script.split(" && ")
    assert first.startswith('codex exec "$@" - <') and 'resume --last "$(cat ' in second
    assert spec.files[FOLLOW_UP_PATH] == "Go on."
