"""Recorded calls → training samples: merging on token ids, branches, bad input, and real recorded rollouts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from typing import Any

import duckdb
import numpy as np
import openai
import pytest

from core.errors import ForgetuiError, TrainingDataError
from core.store.writer import Store
from core.train.samples import build_samples, diagnostics, samples_for_run, write_samples
from core.train.types import Sample

SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
SYSTEM = list(range(1000, 1040))  # a shared system prompt
ROLLOUT = {"rollout_id": "ro-1", "run_id": "run-1", "task_id": "task-a", "step": 3, "reward": 0.75, "status": "done"}
CALL_SQL = (  # calls_full: whole prompts, token columns as INTEGER[]
    "SELECT call_id, status, prompt_token_ids, completion_token_ids, completion_logprobs, extends_parent "
    "FROM calls_full ORDER BY seq"
)


# ----------------------------------------------------------------------------- helpers
def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(5, 30_000) for _ in range(n)]


def call(call_id: str, prompt: list[int], completion: list[int], *, status: str = "ok", **extra: Any) -> dict[str, Any]:
    """A `calls` row with distinct, non-zero logprobs so misplaced ones show."""
    logprobs = [-(i + 1) / 100 - len(prompt) / 1e6 for i in range(len(completion))]
    row = {"call_id": call_id, "prompt_token_ids": prompt, "completion_token_ids": completion, "completion_logprobs": logprobs}
    return {**row, "status": status, "weights_version": 0, **extra}


def conversation(rng: random.Random, prefix: list[int], prefix_id: str, turns: int) -> list[dict[str, Any]]:
    """Calls each extending the last: prompt = previous prompt + completion + a tool result."""
    prompt, calls = [*prefix, *toks(rng, 7)], []
    for i in range(turns):
        completion = toks(rng, rng.randrange(3, 9))
        calls.append(call(f"{prefix_id}{i}", prompt, completion))
        prompt = [*prompt, *completion, *toks(rng, rng.randrange(2, 6))]
    return calls


def listed(sample: Sample) -> Sample:
    """The sample with list token columns (`samples_for_run` builds numpy arrays)."""
    return dataclasses.replace(
        sample, token_ids=np.asarray(sample.token_ids).tolist(), loss_mask=np.asarray(sample.loss_mask).tolist(),
        logprobs=np.asarray(sample.logprobs, dtype=np.float64).tolist(),
    )


def check_sample(sample: Sample, calls_by_id: dict[str, dict[str, Any]]) -> None:
    """(a): the sample reproduces every merged call's prompt and completion, with mask and logprobs in place."""
    sample = listed(sample)
    n = len(sample.token_ids)
    assert len(sample.loss_mask) == n == len(sample.logprobs)
    assert sample.n_calls == len(sample.call_ids) == len(sample.completion_starts) == len(sample.completion_ends) >= 1
    assert sample.prompt_tokens == sample.completion_starts[0]
    assert sample.sample_id == f"{sample.rollout_id}#{sample.branch}"
    expected_mask, expected_lp = [0] * n, [0.0] * n
    total = 0
    for cid, start, end in zip(sample.call_ids, sample.completion_starts, sample.completion_ends, strict=True):
        c = calls_by_id[cid]
        prompt, completion = list(c["prompt_token_ids"]), list(c["completion_token_ids"])
        assert sample.token_ids[:start] == prompt, f"{cid}: prompt is not reproduced"
        assert sample.token_ids[start:end] == completion, f"{cid}: completion is not reproduced"
        expected_mask[start:end] = [1] * len(completion)
        expected_lp[start:end] = list(c["completion_logprobs"] or [])
        total += len(completion)
    assert sum(sample.loss_mask) == total == sample.trainable_tokens
    assert sample.loss_mask == expected_mask
    assert sample.logprobs == pytest.approx(expected_lp, abs=0)
    assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m == 0)


def check_all(samples: list[Sample], calls: list[dict[str, Any]]) -> None:
    by_id = {c["call_id"]: c for c in calls}
    for s in samples:
        check_sample(s, by_id)
    merged = [cid for s in samples for cid in s.call_ids]
    assert sorted(merged) == sorted(c["call_id"] for c in calls if c.get("status", "ok") == "ok")


# ----------------------------------------------------------------------------- (a) merging
def test_linear_conversation_is_one_sample() -> None:
    calls = conversation(random.Random(1), SYSTEM, "c", 5)
    (sample,) = build_samples(ROLLOUT, calls)
    check_all([sample], calls)
    assert sample.call_ids == ["c0", "c1", "c2", "c3", "c4"]
    last = calls[-1]
    assert sample.token_ids == last["prompt_token_ids"] + last["completion_token_ids"]
    assert (sample.run_id, sample.rollout_id, sample.task_id, sample.step, sample.branch) == ("run-1", "ro-1", "task-a", 3, 0)
    assert sample.reward == 0.75 and sample.advantage == 0.0 and sample.weights_version == 0
    assert sample.prompt_tokens == len(calls[0]["prompt_token_ids"])
    assert sample.completion_ends[-1] == len(sample.token_ids)


def test_numpy_rows_build_the_same_samples() -> None:
    calls = conversation(random.Random(2), SYSTEM, "c", 4)
    as_np = [
        {**c, **{k: np.asarray(c[k], dtype=t) for k, t in (("prompt_token_ids", np.int32), ("completion_token_ids", np.int32), ("completion_logprobs", np.float64))}}
        for c in calls
    ]
    (from_lists,), (from_arrays,) = build_samples(ROLLOUT, calls), build_samples(ROLLOUT, as_np)
    assert from_arrays == from_lists
    assert all(type(t) is int for t in from_arrays.token_ids) and all(type(x) is float for x in from_arrays.logprobs)


def test_first_call_weights_version_and_prompt_equal_to_sequence() -> None:
    c0 = call("a", [*SYSTEM, 7, 8], [9, 10])
    c1 = call("b", c0["prompt_token_ids"] + c0["completion_token_ids"], [11], weights_version=1)  # no new prompt tokens
    (s,) = build_samples(ROLLOUT, [c0, c1])
    check_all([s], [c0, c1])
    assert s.weights_version == 0 and s.completion_starts == [len(SYSTEM) + 2, len(SYSTEM) + 4]
    assert s.loss_mask[-3:] == [1, 1, 1]  # both completions are adjacent


# ----------------------------------------------------------------------------- (c) branches
def test_rewritten_history_starts_a_new_sample_sharing_the_reward() -> None:
    rng = random.Random(4)
    first = conversation(rng, SYSTEM, "a", 3)
    summary = [*SYSTEM, *toks(rng, 5)]  # the harness compacted the earlier turns into a summary
    second = conversation(rng, summary, "b", 2)
    calls = first + second
    samples = build_samples(ROLLOUT, calls)
    check_all(samples, calls)
    assert [s.call_ids for s in samples] == [["a0", "a1", "a2"], ["b0", "b1"]]
    assert [s.branch for s in samples] == [0, 1] and [s.sample_id for s in samples] == ["ro-1#0", "ro-1#1"]
    assert {s.reward for s in samples} == {0.75}


def test_dropped_middle_turn_breaks_the_prefix() -> None:
    rng = random.Random(5)
    calls = conversation(rng, SYSTEM, "a", 3)
    p = calls[2]["prompt_token_ids"]
    cut = len(calls[1]["prompt_token_ids"]) - 2  # delete a few tokens of an earlier turn, keep the rest
    rewritten = call("x", p[:cut] + p[cut + 2 :], toks(rng, 4))
    samples = build_samples(ROLLOUT, [*calls[:2], rewritten])
    assert [s.call_ids for s in samples] == [["a0", "a1"], ["x"]]
    check_all(samples, [*calls[:2], rewritten])


def test_interleaved_branches_merge_into_their_own_samples() -> None:
    rng = random.Random(6)
    a0, a1 = conversation(rng, SYSTEM, "A", 2)
    b0, b1 = conversation(rng, SYSTEM, "B", 2)  # a subagent with the same system prompt
    calls = [a0, b0, a1, b1]
    samples = build_samples(ROLLOUT, calls)
    check_all(samples, calls)
    assert [s.call_ids for s in samples] == [["A0", "A1"], ["B0", "B1"]]
    assert [s.n_calls for s in samples] == [2, 2]


def test_the_longest_matching_sample_wins() -> None:
    rng = random.Random(7)
    t, x = [*SYSTEM, *toks(rng, 6)], toks(rng, 8)
    long_ = call("long", t + x[:-3], x[-3:])  # sequence T + X
    short = call("short", t[:-2], t[-2:])  # sequence T: a prefix of the other, started later
    nxt = call("next", t + x + toks(rng, 4), toks(rng, 3))  # extends both; the longer must take it
    samples = build_samples(ROLLOUT, [long_, short, nxt])
    assert [s.call_ids for s in samples] == [["long", "next"], ["short"]]
    check_all(samples, [long_, short, nxt])


def test_a_regenerated_turn_is_a_new_sample() -> None:
    rng = random.Random(8)
    c0, c1 = conversation(rng, SYSTEM, "c", 2)
    again = call("again", c1["prompt_token_ids"], toks(rng, 5))  # the harness asks turn 1 again: not c1's sequence
    samples = build_samples(ROLLOUT, [c0, c1, again])
    assert [s.call_ids for s in samples] == [["c0", "c1"], ["again"]]


def test_proxy_columns_are_not_trusted(caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(9)
    c0 = call("c0", [*SYSTEM, 1, 2], [3, 4], branch=0, extends_parent=False)
    liar = call("liar", [*SYSTEM, 1, 2, 3, 5], [6], branch=0, extends_parent=True)  # says it extends; token 5 != 4
    quiet = call("quiet", [*SYSTEM, 1, 2, 3, 4, *toks(rng, 3)], [7], branch=9, extends_parent=False)  # does extend
    with caplog.at_level(logging.WARNING, logger="core.train.samples"):
        samples = build_samples(ROLLOUT, [c0, liar, quiet])
    assert [s.call_ids for s in samples] == [["c0", "quiet"], ["liar"]]
    assert any("liar" in r.getMessage() and "token ids say not" in r.getMessage() for r in caplog.records)
    check_all(samples, [c0, liar, quiet])


def test_diagnostics() -> None:
    rng = random.Random(10)
    one = build_samples(ROLLOUT, conversation(rng, SYSTEM, "a", 4))
    two = build_samples({**ROLLOUT, "rollout_id": "ro-2"}, conversation(rng, SYSTEM, "b", 2) + conversation(rng, [9, 9], "c", 2))
    d = diagnostics(one + two)
    assert (d.rollouts, d.samples, d.calls, d.merged_calls) == (2, 3, 8, 5)
    assert d.merge_rate == pytest.approx(5 / 8) and d.branches_per_rollout == pytest.approx(1.5) and d.max_branches == 2
    assert d.trainable_tokens == sum(s.trainable_tokens for s in one + two)
    assert diagnostics([]).merge_rate == 0.0 and diagnostics([]).as_dict()["samples"] == 0


# ----------------------------------------------------------------------------- (d) bad input
def test_missing_logprobs_is_a_clear_error() -> None:
    calls = conversation(random.Random(11), SYSTEM, "c", 2)
    calls[1]["completion_logprobs"] = None
    with pytest.raises(TrainingDataError, match=r"call c1 .*no logprobs.*training needs one logprob.*passthrough") as info:
        build_samples(ROLLOUT, calls)
    assert isinstance(info.value, ForgetuiError)


def test_logprob_length_mismatch_and_missing_token_ids_are_errors() -> None:
    calls = conversation(random.Random(12), SYSTEM, "c", 2)
    calls[0]["completion_logprobs"] = calls[0]["completion_logprobs"][:-1]
    with pytest.raises(TrainingDataError, match=r"call c0 .*completion tokens but \d+ logprobs"):
        build_samples(ROLLOUT, calls)
    passthrough = call("p", [1], [])
    passthrough.update(prompt_token_ids=None, completion_token_ids=None, completion_logprobs=None)
    with pytest.raises(TrainingDataError, match=r"call p .*no prompt token ids.*passthrough"):
        build_samples(ROLLOUT, [passthrough])


def test_infra_error_and_unfinished_rollouts_yield_nothing() -> None:
    calls = conversation(random.Random(13), SYSTEM, "c", 2)
    assert build_samples({**ROLLOUT, "status": "infra_error"}, calls) == []
    assert build_samples({**ROLLOUT, "status": "running"}, calls) == []
    assert build_samples({**ROLLOUT, "status": "timeout", "reward": None}, calls)[0].reward == 0.0


def test_error_and_cancelled_calls_are_skipped() -> None:
    rng = random.Random(14)
    c0, c1 = conversation(rng, SYSTEM, "c", 2)
    # the harness retried after an error: the failed call's partial tokens never reached it
    failed = call("failed", c1["prompt_token_ids"], toks(rng, 2), status="error")
    failed["completion_logprobs"] = None  # would be an error if it were not skipped
    cancelled = call("cancelled", [*SYSTEM, 4], [5], status="cancelled")
    samples = build_samples(ROLLOUT, [c0, failed, cancelled, c1])
    assert [s.call_ids for s in samples] == [["c0", "c1"]]


# ----------------------------------------------------------------------------- the store
def seed_store(store: Store) -> dict[str, list[dict[str, Any]]]:
    """Three rollouts of run-1 (one infra_error, one at another step) plus one of another run."""
    rng = random.Random(15)
    store.insert_run("run-1", {})
    rollouts = {
        "ro-1": ({**ROLLOUT}, conversation(rng, SYSTEM, "x", 3) + conversation(rng, [5, 5], "y", 2)),
        "ro-2": ({**ROLLOUT, "rollout_id": "ro-2", "reward": 0.0, "status": "failed"}, conversation(rng, SYSTEM, "z", 2)),
        "ro-3": ({**ROLLOUT, "rollout_id": "ro-3", "status": "infra_error", "reward": None}, conversation(rng, SYSTEM, "i", 2)),
        "ro-4": ({**ROLLOUT, "rollout_id": "ro-4", "step": 4}, conversation(rng, SYSTEM, "s", 2)),
        "other": ({**ROLLOUT, "rollout_id": "other", "run_id": "run-2"}, conversation(rng, SYSTEM, "o", 2)),
        "empty": ({**ROLLOUT, "rollout_id": "empty"}, []),
    }
    rollouts["ro-2"][1].insert(1, call("err", [*SYSTEM, 1], [2], status="error"))
    for rollout_id, (row, calls) in rollouts.items():
        store.upsert_rollout(row)
        for seq, c in enumerate(reversed(calls)):  # written out of order: seq decides
            store.record_call({**c, "rollout_id": rollout_id, "seq": len(calls) - 1 - seq})
    store.flush()
    return {rid: calls for rid, (_, calls) in rollouts.items()}


class CountingCursor:
    """A DuckDB cursor that counts the statements run on it."""

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.cur, self.sql = cur, []

    def execute(self, sql: str, params: Any = None) -> Any:
        self.sql.append(sql)
        return self.cur.execute(sql, params) if params is not None else self.cur.execute(sql)


def test_samples_for_run_reads_the_store_in_one_query(tmp_path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        calls = seed_store(store)
        counting = CountingCursor(store.cursor())
        samples = samples_for_run(counting, "run-1")
        assert len(counting.sql) == 1 and "FROM rollouts" in counting.sql[0]
        assert [(s.rollout_id, s.call_ids) for s in samples] == [
            ("ro-1", ["x0", "x1", "x2"]),
            ("ro-1", ["y0", "y1"]),
            ("ro-2", ["z0", "z1"]),
            ("ro-4", ["s0", "s1"]),
        ]
        for rollout_id in ("ro-1", "ro-2", "ro-4"):
            check_all([s for s in samples if s.rollout_id == rollout_id], calls[rollout_id])
        assert [s.reward for s in samples] == [0.75, 0.75, 0.0, 0.75] and [s.step for s in samples] == [3, 3, 3, 4]
        assert [s.rollout_id for s in samples_for_run(store, "run-1", step=3)] == ["ro-1", "ro-1", "ro-2"]
        assert [s.sample_id for s in samples_for_run(store, "run-1", rollout_ids=["ro-2", "ro-3"])] == ["ro-2#0"]
        assert samples_for_run(store, "run-1", rollout_ids=[]) == []


def test_samples_for_run_builds_arrays_equal_to_build_samples_lists(tmp_path) -> None:
    """One pass over the store, no Python object per token: the token columns are numpy arrays, equal to the lists."""
    with Store.open(tmp_path / "s.duckdb") as store:
        calls = seed_store(store)
        samples = samples_for_run(store, "run-1")
    assert {(s.token_ids.dtype, s.loss_mask.dtype, s.logprobs.dtype) for s in samples} == {
        (np.dtype(np.int32), np.dtype(np.int32), np.dtype(np.float64))
    }
    for rollout_id in ("ro-1", "ro-2", "ro-4"):
        built = build_samples({**ROLLOUT, "rollout_id": rollout_id}, calls[rollout_id])
        assert all(isinstance(s.token_ids, list) for s in built)  # build_samples keeps lists unless asked
        mine = [listed(s) for s in samples if s.rollout_id == rollout_id]
        assert [(s.call_ids, s.token_ids, s.loss_mask, s.logprobs) for s in mine] == [
            (s.call_ids, s.token_ids, s.loss_mask, s.logprobs) for s in built
        ]
    assert sum(s.trainable_tokens for s in samples) == sum(int(s.loss_mask.sum()) for s in samples) > 0


def test_only_the_final_attempts_calls_are_read(tmp_path) -> None:
    rng = random.Random(16)
    dead, final = conversation(rng, SYSTEM, "dead", 2), conversation(rng, SYSTEM, "final", 2)
    with Store.open(tmp_path / "s.duckdb") as store:
        store.upsert_rollout({**ROLLOUT, "attempt": 1})  # attempt 0 died of an infrastructure error, 1 finished
        for attempt, calls in ((0, dead), (1, final)):
            for seq, c in enumerate(calls):
                store.record_call({**c, "rollout_id": "ro-1", "seq": seq, "attempt": attempt})
        (sample,) = samples_for_run(store, "run-1")
    assert sample.call_ids == ["final0", "final1"]
    check_all([sample], final)


def test_write_samples_round_trips(tmp_path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        seed_store(store)
        samples = samples_for_run(store, "run-1")
        assert write_samples(store, samples) == len(samples) == 4
        store.flush()
        got = store.cursor().execute(
            "SELECT sample_id, token_ids, loss_mask, logprobs, call_ids, completion_starts, completion_ends, n_calls, "
            "reward, advantage, prompt_tokens, weights_version, task_id, step FROM samples ORDER BY sample_id"
        ).fetchall()
    for row, s in zip(got, sorted(map(listed, samples), key=lambda s: s.sample_id), strict=True):
        assert row == (
            s.sample_id, s.token_ids, s.loss_mask, s.logprobs, s.call_ids, s.completion_starts, s.completion_ends,
            s.n_calls, s.reward, 0.0, s.prompt_tokens, 0, "task-a", s.step,
        )


# ----------------------------------------------------------------------------- (b) real recorded rollouts
def finish(proxy: Any, reward: float) -> list[Sample]:
    """Mark the fixture's rollout finished and build its samples from the proxy's store."""
    proxy.store.upsert_rollout({"rollout_id": "rollout-1", "status": "done", "reward": reward, "task_id": "chat", "step": 0})
    return samples_for_run(proxy.store, "run-test")


def recorded_calls(proxy: Any) -> list[dict[str, Any]]:
    cols = ("call_id", "status", "prompt_token_ids", "completion_token_ids", "completion_logprobs", "extends_parent")
    return [dict(zip(cols, r, strict=True)) for r in proxy.rows(CALL_SQL)]


@pytest.mark.parametrize("stream", [False, True])
def test_real_proxy_tool_conversation_is_one_sample(live_proxy, script_file, stream: bool) -> None:
    turns = [
        {"tool": "shell", "command": "echo hi > hello.txt"},
        {"tool": "shell", "command": "cat hello.txt"},
        {"text": "Created hello.txt; it says hi."},
        {"text": "You are welcome."},
    ]
    proxy = live_proxy(f"scripted:{script_file(turns)}")
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a terse shell agent."},
        {"role": "user", "content": "make hello.txt containing hi"},
    ]
    results = iter(["", "hi\n"])
    for _ in range(4):
        msg = ask(client, messages, stream)
        messages.append(msg)
        for tc in msg.get("tool_calls") or []:  # echo each tool result back, as a harness does
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": next(results)})
        if not msg.get("tool_calls"):
            messages.append({"role": "user", "content": "thanks!"})
    calls = recorded_calls(proxy)
    assert [c["status"] for c in calls] == ["ok"] * 4 and all(c["extends_parent"] for c in calls[1:])
    (sample,) = finish(proxy, 1.0)
    check_all([sample], calls)
    assert sample.n_calls == 4 and sample.reward == 1.0 and sample.sample_id == "rollout-1#0"
    assert list(sample.token_ids[: sample.prompt_tokens]) == list(calls[0]["prompt_token_ids"])
    assert diagnostics([sample]).merge_rate == pytest.approx(3 / 4)


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One chat call; the assistant message as a harness would append it."""
    if not stream:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[SHELL_TOOL])
        return reply.choices[0].message.model_dump(exclude_none=True)
    content, calls = "", {}
    for chunk in client.chat.completions.create(model="policy", messages=messages, tools=[SHELL_TOOL], stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.id or slot["id"]
                slot["function"]["name"] += (tc.function.name or "") if tc.function else ""
                slot["function"]["arguments"] += (tc.function.arguments or "") if tc.function else ""
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def test_real_proxy_rewritten_history_is_a_second_sample(live_proxy, script_file) -> None:
    proxy = live_proxy(f"scripted:{script_file([{'tool': 'shell', 'command': 'ls'}, {'text': 'done'}, {'text': 'short'}])}")
    client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "list files"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[SHELL_TOOL]).choices[0].message
    tc = first.tool_calls[0]
    messages += [first.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": tc.id, "content": "a.txt"}]
    client.chat.completions.create(model="policy", messages=messages, tools=[SHELL_TOOL])
    compacted = [{"role": "system", "content": "agent"}, {"role": "user", "content": "Summary: listed files, found a.txt."}]
    client.chat.completions.create(model="policy", messages=compacted, tools=[SHELL_TOOL])
    calls = recorded_calls(proxy)
    samples = finish(proxy, 0.5)
    check_all(samples, calls)
    assert [s.call_ids for s in samples] == [[calls[0]["call_id"], calls[1]["call_id"]], [calls[2]["call_id"]]]
    assert [s.reward for s in samples] == [0.5, 0.5]


@pytest.mark.docker
def test_real_react_harness_run_in_docker(docker_client, base_image, tmp_path) -> None:
    from core.config import load_config
    from core.run import execute_run

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "Done."}]}))
    config = load_config(None, [
        "env.name=toy", 'env.tasks=["hello"]', 'harness.name="react"', f'policy.backend="scripted:{script}"',
        "runtime.kind=docker", "run.n_samples=2", "run.concurrency=2", "run.max_retries=0", "run.timeout_s=120",
    ])  # fmt: skip
    summary = asyncio.run(execute_run(config))
    assert summary.rollouts == 2 and summary.passed == 2, summary
    con = duckdb.connect(summary.store, read_only=True)
    try:
        samples = samples_for_run(con, summary.run_id)
        cols = ("call_id", "status", "prompt_token_ids", "completion_token_ids", "completion_logprobs", "extends_parent")
        calls = [dict(zip(cols, r, strict=True)) for r in con.execute(CALL_SQL.replace("ORDER BY seq", "ORDER BY rollout_id, seq")).fetchall()]
    finally:
        con.close()
    assert len(calls) == 4 and {c["status"] for c in calls} == {"ok"}
    assert len(samples) == 2
    check_all(samples, calls)
    assert [s.n_calls for s in samples] == [2, 2] and [s.reward for s in samples] == [1.0, 1.0]
    assert {s.task_id for s in samples} == {"hello"} and len({s.rollout_id for s in samples}) == 2
