"""The record at scale: compact prompts round-trip, shrink the store, give the same samples; spliced plans
rendered incrementally equal the full-render plans on the real harness requests."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest

from core.chat import ChatRequest, Completion
from core.proxy import recorder
from core.proxy.policy import CallTrace
from core.proxy.recorder import CallInFlight
from core.proxy.sessions import Session
from core.store.schema import SCHEMA_VERSION
from core.store.writer import Store
from core.tokens.continuation import Continuation, PromptPlan, tail_full, tail_incremental, template_facts
from core.tokens.template import encode
from core.train.samples import build_samples, samples_for_run
from tests.test_protocols import FIXTURE_API, parse_fixture

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
WORDS = "the file read write run command output error test tool call result code list name line fix".split()


def words(rng: random.Random, k: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(k))


def plan_fields(plan: PromptPlan) -> tuple:
    return (plan.prompt_ids, plan.branch, plan.parent_call_id, plan.extends_parent, plan.prefix_tokens)


class Harness:
    """A harness session through the token path and the real recorder: plan, answer, remember, record."""

    def __init__(self, tok: Any, store: Store, rollout_id: str, rng: random.Random, system: str) -> None:
        self.tok, self.store, self.rng = tok, store, rng
        self.session = Session(token=rollout_id, rollout_id=rollout_id, run_id="run-1")
        self.cont = self.session.continuation_for(tok)
        self.system = system
        self.planned: dict[str, list[int]] = {}
        self.seq = 0

    def start(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": words(self.rng, 20)}]

    def call(self, messages: list[dict[str, Any]], status: str = "ok") -> tuple[dict[str, Any], PromptPlan]:
        """One call on `messages`; returns the answer (a tool call) and the plan."""
        plan = self.cont.plan(messages, TOOLS)
        command = f"grep {words(self.rng, 2)}"
        answer = {
            "role": "assistant",
            "content": words(self.rng, 6),
            "tool_calls": [{"id": f"t{self.seq}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}],
        }
        text = answer["content"] + '\n<tool_call>\n{"name": "bash", "arguments": ' + json.dumps({"command": command}) + "}\n</tool_call>"
        completion = encode(self.tok, text) + [self.tok.eos_token_id]
        call_id = f"{self.session.rollout_id}-{self.seq}"
        self.cont.remember(call_id, plan, messages, TOOLS, answer, completion)
        self.planned[call_id] = list(plan.prompt_ids)
        trace = CallTrace(
            branch=plan.branch, parent_call_id=plan.parent_call_id, extends_parent=plan.extends_parent,
            prefix_tokens=plan.prefix_tokens, weights_version=0,
        )  # fmt: skip
        request = ChatRequest(api="chat", model="policy", messages=messages, tools=TOOLS)
        done = Completion(
            prompt_token_ids=plan.prompt_ids, completion_token_ids=list(completion), completion_logprobs=[-0.25] * len(completion)
        )
        flight = CallInFlight(call_id, self.session, self.seq, "chat", request, {"n": len(messages)}, "test", trace)
        self.store.record_call(flight.row(status, done, None, None))
        self.seq += 1
        return answer, plan

    def result(self, answer: dict[str, Any]) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": words(self.rng, 15)}


def branched_rollout(tok: Any, store: Store, rollout_id: str, seed: int, system: str = "You are a coding agent.") -> Harness:
    """Main line of 4 calls, a title call (new branch), a retry from call 1 (a sibling of call 2), an error call."""
    rng = random.Random(seed)
    h = Harness(tok, store, rollout_id, rng, system)
    messages = h.start()
    history = []
    for _ in range(4):
        answer, _ = h.call(messages)
        history.append(list(messages) + [answer])
        messages = messages + [answer, h.result(answer)]
    h.call([{"role": "user", "content": "Title for: " + words(rng, 5)}])  # a rewritten history: new branch
    retry = history[1] + [{"role": "tool", "tool_call_id": history[1][-1]["tool_calls"][0]["id"], "content": "other"}]
    answer, plan = h.call(retry)  # splices onto call 1, not the latest turn
    assert plan.parent_call_id == f"{rollout_id}-1" and plan.extends_parent
    h.call(retry + [answer, h.result(answer)], status="error")  # its parent row is ok, this one is not
    h.call(messages)  # the main line continues from call 3
    return h


@pytest.fixture
def compact_everything(monkeypatch):
    monkeypatch.setattr(recorder, "COMPACT_MIN_PREFIX", 1)


def seed(store: Store, tok: Any, n: int = 3, system: str = "You are a coding agent.") -> list[Harness]:
    store.insert_run("run-1", {})
    out = []
    for i in range(n):
        rollout_id = f"ro-{i}"
        store.upsert_rollout({"rollout_id": rollout_id, "run_id": "run-1", "task_id": "t", "step": 0, "status": "done", "reward": 0.5})
        out.append(branched_rollout(tok, store, rollout_id, seed=i, system=system))
    store.flush()
    return out


# ----------------------------------------------------------------------------- compact storage
def test_compact_prompts_round_trip_through_view_and_macro(tmp_path: Path, tiny_tokenizer, compact_everything) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        harnesses = seed(store, tiny_tokenizer)
        cur = store.cursor()
        planned = {cid: ids for h in harnesses for cid, ids in h.planned.items()}
        stored = dict(cur.execute("SELECT call_id, prompt_token_ids IS NULL FROM calls").fetchall())
        assert sum(stored.values()) == 3 * 6  # per rollout: calls 1-3, the retry, the error call, the last call
        assert not stored["ro-0-0"] and not stored["ro-0-4"]  # branch starts keep full ids
        full = {cid: list(ids) for cid, ids in cur.execute("SELECT call_id, prompt_token_ids FROM calls_full").fetchall()}
        assert full == planned
        for cid, ids in planned.items():
            assert cur.execute("SELECT * FROM full_prompt(?)", [cid]).fetchall() == [(cid, ids)]
        # a compact row whose parent length disagrees is not rebuilt (NULL), not rebuilt wrong
        cur.execute("UPDATE calls SET prefix_tokens = prefix_tokens + 1 WHERE call_id = 'ro-0-2'")
        assert cur.execute("SELECT prompt_token_ids FROM calls_full WHERE call_id = 'ro-0-2'").fetchone() == (None,)
        assert cur.execute("SELECT prompt_token_ids FROM calls_full WHERE call_id = 'ro-0-3'").fetchone() == (None,)
        assert cur.execute("SELECT prompt_token_ids FROM full_prompt('ro-0-3')").fetchone() == (None,)


def test_recorder_keeps_full_ids_unless_it_can_prove_the_prefix(tiny_tokenizer, compact_everything) -> None:
    session = Session(token="t", rollout_id="r", run_id="run")
    cont = session.continuation_for(tiny_tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    plan = cont.plan(messages, [])
    cont.remember("c0", plan, messages, [], {"role": "assistant", "content": "yo"}, [7, 8, tiny_tokenizer.eos_token_id])
    parent = plan.prompt_ids + [7, 8, tiny_tokenizer.eos_token_id]
    prompt = parent + [5, 6]

    def columns(**trace: Any) -> dict[str, Any]:
        base = {"extends_parent": True, "parent_call_id": "c0", "prefix_tokens": len(parent)}
        return recorder.prompt_columns(prompt, CallTrace(**{**base, **trace}), session)

    assert columns() == {"prompt_token_ids": None, "prompt_new_token_ids": [5, 6]}
    assert columns(extends_parent=False) == {"prompt_token_ids": prompt}
    assert columns(parent_call_id="gone") == {"prompt_token_ids": prompt}  # not held in memory: cannot prove
    assert columns(prefix_tokens=len(parent) - 1) == {"prompt_token_ids": prompt}
    prompt[1] += 1  # the ids disagree with the parent's
    assert columns() == {"prompt_token_ids": prompt}


def test_compact_store_is_smaller(tmp_path: Path, tiny_tokenizer, monkeypatch) -> None:
    system = "You are a coding agent. " + words(random.Random(1), 20_000)
    sizes, ids = {}, {}
    for name, minimum in (("full", 10**9), ("compact", 1)):
        monkeypatch.setattr(recorder, "COMPACT_MIN_PREFIX", minimum)
        path = tmp_path / f"{name}.duckdb"
        with Store.open(path) as store:
            seed(store, tiny_tokenizer, n=2, system=system)
            (ids[name],) = store.cursor().execute(
                "SELECT sum(coalesce(len(prompt_token_ids), 0) + coalesce(len(prompt_new_token_ids), 0)) FROM calls"
            ).fetchone()
        sizes[name] = path.stat().st_size
    assert ids["compact"] * 4 < ids["full"]
    assert sizes["compact"] < sizes["full"]


def test_samples_from_compact_prompts_equal_samples_from_full_prompts(tmp_path: Path, tiny_tokenizer, compact_everything) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        seed(store, tiny_tokenizer)
        compact = samples_for_run(store, "run-1")
        cur = store.cursor()
        cols = ["call_id", "status", "prompt_token_ids", "completion_token_ids", "completion_logprobs", "weights_version", "extends_parent"]
        rollout = {"run_id": "run-1", "task_id": "t", "step": 0, "reward": 0.5, "status": "done"}
        full = []
        for rid in ("ro-0", "ro-1", "ro-2"):
            rows = cur.execute(f"SELECT {', '.join(cols)} FROM calls_full WHERE rollout_id = ? ORDER BY seq", [rid]).fetchall()
            full += build_samples({**rollout, "rollout_id": rid}, [dict(zip(cols, r, strict=True)) for r in rows])
    def columns(samples: list) -> list:
        return [(s.sample_id, s.call_ids, list(s.token_ids), list(s.loss_mask), list(s.logprobs), s.completion_starts) for s in samples]

    assert columns(compact) == columns(full)
    assert [s.call_ids for s in compact if s.rollout_id == "ro-0"] == [
        ["ro-0-0", "ro-0-1", "ro-0-2", "ro-0-3", "ro-0-7"],
        ["ro-0-4"],
        ["ro-0-5"],
    ]


def test_a_compact_prompt_whose_parent_row_is_missing_is_an_error(tmp_path: Path, tiny_tokenizer, compact_everything) -> None:
    from core.errors import TrainingDataError

    with Store.open(tmp_path / "s.duckdb") as store:
        seed(store, tiny_tokenizer, n=1)
        store.cursor().execute("DELETE FROM calls WHERE call_id = 'ro-0-1'")
        with pytest.raises(TrainingDataError, match="ro-0-2 .*cannot be rebuilt"):
            samples_for_run(store, "run-1")


def test_a_schema_2_store_gains_the_compact_form(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with Store.open(path):
        pass
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW calls_full; DROP MACRO TABLE full_prompt; DROP MACRO token_ids; ALTER TABLE calls DROP COLUMN prompt_new_token_ids")
    for column in ("prompt_token_ids", "completion_token_ids"):  # schema 2's types
        con.execute(f"ALTER TABLE calls DROP COLUMN {column}; ALTER TABLE calls ADD COLUMN {column} INTEGER[]")
    con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    con.execute("INSERT INTO calls (call_id, rollout_id, prompt_token_ids) VALUES ('old', 'r', [1, 2, 3])")
    con.close()
    with Store.open(path) as store:
        cur = store.cursor()
        assert cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)
        assert cur.execute("SELECT prompt_token_ids, prompt_new_token_ids FROM calls_full").fetchall() == [([1, 2, 3], None)]
        assert cur.execute("SELECT prompt_token_ids FROM full_prompt('old')").fetchall() == [([1, 2, 3],)]


# ----------------------------------------------------------------------------- incremental splicing
FIXTURES = ["claude-code", "codex", "gemini-cli", "mini-swe-agent", "openclaw-chat", "opencode", "pi"]


def replay(tok: Any, request: ChatRequest, turns: int = 5) -> None:
    """The request as the first of a multi-turn conversation: incremental plans equal full-render plans."""
    rng = random.Random(3)
    fast, slow = Continuation(tok), Continuation(tok)
    messages, tools = list(request.messages), list(request.tools)
    answered = -1  # index of the last answer in `messages`
    for turn in range(turns):
        a, b = fast.plan(messages, tools), slow.plan_full(messages, tools)
        assert plan_fields(a) == plan_fields(b), turn
        if turn > 0:
            assert a.extends_parent and a.parent_call_id == f"c{turn - 1}", turn
            assert tail_incremental(tok, messages, answered, tools) == tail_full(tok, messages, answered, tools), turn
        name = (tools[0].get("function") or tools[0]).get("name", "bash") if tools else None
        answer: dict[str, Any] = {"role": "assistant", "content": words(rng, 8)}
        text = answer["content"]
        calls = 0 if not name or turn % 3 == 2 else 2 if turn % 3 == 0 else 1  # two results in a row, too
        answer_calls = []
        for i in range(calls):
            args = json.dumps({"command": words(rng, 2)})
            answer_calls.append({"id": f"x{turn}{i}", "type": "function", "function": {"name": name, "arguments": args}})
            text += ("\n" if i else "") + f'\n<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>'
        if answer_calls:
            answer["tool_calls"] = answer_calls
        completion = encode(tok, text) + [tok.eos_token_id]
        fast.remember(f"c{turn}", a, messages, tools, answer, completion)
        slow.remember(f"c{turn}", b, messages, tools, answer, completion)
        messages = messages + [answer]
        answered = len(messages) - 1
        for c in answer_calls:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": words(rng, 30)})
        if not answer_calls:
            messages.append({"role": "user", "content": words(rng, 12)})


@pytest.mark.parametrize("harness", FIXTURES)
def test_incremental_plans_equal_full_render_plans_on_harness_requests(tiny_tokenizer, harness: str) -> None:
    assert template_facts(tiny_tokenizer).incremental
    for request in parse_fixture(harness):
        if request.messages:
            replay(tiny_tokenizer, request)
    assert FIXTURE_API  # the fixtures are parsed with their own protocols
