"""How big the token record grows and how fast it is written and read, for harnesses that resend their whole history.

    .venv/bin/python benchmarks/token_store_scale.py [--rollouts 100] [--calls 50] [--system 50000]

Synthetic rollouts through the real token path and recorder: a shared `--system`-token system prompt
(random words, the tiny model's tokenizer), then `--calls` calls per rollout, each request the whole
history so far + the last answer + a tool result, as a harness sends it. Each call is planned by
`Continuation.plan` (spliced onto the last answer), remembered, and recorded by
`core.proxy.recorder.CallInFlight.row` into a real `Store`. Reported:

* store bytes (after a checkpoint) against the bytes of the rollouts' distinct tokens (each
  rollout's final sequence, int32): floor <= 2x;
* recording throughput: `row` + `Store.record_call` + the final flush, calls/s (the plan's cost is
  reported apart);
* sample building: `samples_for_run` end to end from the store, calls/s: floor >= 10,000.

The request bodies are recorded as a small stub: `store_scale.py` measures real harness bodies (stored
as deltas) through a real proxy.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from core.chat import ChatRequest, Completion  # noqa: E402
from core.proxy.policy import CallTrace  # noqa: E402
from core.proxy.recorder import CallInFlight  # noqa: E402
from core.proxy.sessions import Session  # noqa: E402
from core.store.writer import Store  # noqa: E402
from core.tokens.continuation import PromptPlan  # noqa: E402
from core.tokens.template import encode  # noqa: E402
from core.train.samples import samples_for_run  # noqa: E402

log = logging.getLogger("token_store_scale")
FLOOR_BYTES_RATIO = 2.0
FLOOR_SAMPLES_PER_S = 10_000
VOCAB = (
    "the file folder read write edit run command output error test pass fail user tool call result "
    "model agent code python function class return import value string list dict json key name line "
    "config install build check fix bug change update search find grep open close start stop status"
).split()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]


def words(rng: random.Random, k: int) -> str:
    """`k` random words of a small vocabulary (about one token each)."""
    return " ".join(rng.choice(VOCAB) for _ in range(k))


def system_prompt(tok: Any, rng: random.Random, tokens: int) -> str:
    """A system prompt of about `tokens` tokens."""
    text = words(rng, tokens)
    ids = encode(tok, text)
    return tok.decode(ids[:tokens]) if len(ids) > tokens else text


class Rollout:
    """One synthetic harness session: plans, remembers and records each call like the token policy and proxy."""

    def __init__(self, tok: Any, store: Store, rollout_id: str, system: str, rng: random.Random) -> None:
        self.tok, self.store, self.rng = tok, store, rng
        self.session = Session(token=uuid.uuid4().hex, rollout_id=rollout_id, run_id="bench")
        self.cont = self.session.continuation_for(tok)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": words(rng, 40)}]
        self.plan_s = self.record_s = 0.0
        self.planned: dict[str, list[int]] = {}
        self.last: list[int] = []

    def call(self, seq: int) -> None:
        """One call: plan, sample (a scripted tool call), remember, record, and the harness's next messages."""
        t0 = time.perf_counter()
        plan = self.cont.plan(self.messages, TOOLS)
        self.plan_s += time.perf_counter() - t0
        command = f"grep -rn {words(self.rng, 2)} ."
        answer = {
            "role": "assistant",
            "content": words(self.rng, 12),
            "tool_calls": [{"id": f"c{seq}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}],
        }
        text = answer["content"] + '\n<tool_call>\n{"name": "bash", "arguments": ' + json.dumps({"command": command}) + "}\n</tool_call>"
        completion_ids = encode(self.tok, text) + [self.tok.eos_token_id]
        call_id = f"{self.session.rollout_id}-{seq}"
        self.cont.remember(call_id, plan, self.messages, TOOLS, answer, completion_ids)
        self.planned[call_id] = list(plan.prompt_ids)
        self.last = plan.prompt_ids + completion_ids
        t0 = time.perf_counter()
        self.store.record_call(self.row(call_id, seq, plan, completion_ids))
        self.record_s += time.perf_counter() - t0
        self.messages += [answer, {"role": "tool", "tool_call_id": f"c{seq}", "content": words(self.rng, self.rng.randrange(20, 120))}]

    def row(self, call_id: str, seq: int, plan: PromptPlan, completion_ids: list[int]) -> dict[str, Any]:
        """The recorder's `calls` row for this call."""
        trace = CallTrace(
            prompt_ids=plan.prompt_ids,
            completion_ids=list(completion_ids),
            logprobs=[-0.5] * len(completion_ids),
            branch=plan.branch,
            parent_call_id=plan.parent_call_id,
            extends_parent=plan.extends_parent,
            prefix_tokens=plan.prefix_tokens,
            weights_version=0,
        )
        request = ChatRequest(api="chat", model="policy", messages=self.messages, tools=TOOLS)
        flight = CallInFlight(call_id, self.session, seq, "chat", request, {"messages": len(self.messages)}, "bench", trace)
        completion = Completion(
            text="",
            finish_reason="tool_calls",
            prompt_tokens=len(plan.prompt_ids),
            completion_tokens=len(completion_ids),
            prompt_token_ids=plan.prompt_ids,
            completion_token_ids=list(completion_ids),
            completion_logprobs=[-0.5] * len(completion_ids),
        )
        return flight.row("ok", completion, None, None)


def run(args: argparse.Namespace, tok: Any, tmp: Path) -> dict[str, Any]:
    """Record the rollouts, then measure the store and sample building."""
    rng = random.Random(0)
    system = system_prompt(tok, rng, args.system)
    path = tmp / "scale.duckdb"
    distinct = plan_s = record_s = 0.0
    rollouts: list[Rollout] = []
    started = time.perf_counter()
    with Store.open(path) as store:
        store.insert_run("bench", {})
        for i in range(args.rollouts):
            rollout = Rollout(tok, store, f"r{i:03d}", system, rng)
            store.upsert_rollout({"rollout_id": rollout.session.rollout_id, "run_id": "bench", "task_id": "t", "step": 0, "status": "done", "reward": 1.0})
            for seq in range(args.calls):
                rollout.call(seq)
            distinct += 4 * len(rollout.last)
            plan_s, record_s = plan_s + rollout.plan_s, record_s + rollout.record_s
            if i < 2:  # kept for the round-trip check
                rollouts.append(rollout)
        t0 = time.perf_counter()
        store.flush()
        record_s += time.perf_counter() - t0
        wall = time.perf_counter() - started
        n = args.rollouts * args.calls
        check(store, rollouts)
        best = min(timed(lambda: samples_for_run(store, "bench")) for _ in range(3))
    return {
        "calls": n,
        "store_bytes": path.stat().st_size,
        "distinct_bytes": distinct,
        "plan_ms": plan_s / n * 1000,
        "record_per_s": n / record_s,
        "wall_s": wall,
        "samples_per_s": n / best,
        "system_tokens": len(encode(tok, system)),
    }


def timed(fn: Any) -> float:
    """Seconds `fn` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def check(store: Store, rollouts: list[Rollout]) -> None:
    """The store gives back exactly what was planned: `calls_full` and the samples' sequences."""
    cur = store.cursor()
    for rollout in rollouts:
        rows = cur.execute("SELECT call_id, prompt_token_ids FROM calls_full WHERE rollout_id = ?", [rollout.session.rollout_id]).fetchall()
        if {cid: list(ids) for cid, ids in rows} != rollout.planned:
            raise RuntimeError(f"calls_full does not rebuild the planned prompts of {rollout.session.rollout_id}")
    samples = {s.rollout_id: s for s in samples_for_run(store, "bench", rollout_ids=[r.session.rollout_id for r in rollouts])}
    for rollout in rollouts:
        if samples[rollout.session.rollout_id].token_ids != rollout.last:
            raise RuntimeError(f"the sample of {rollout.session.rollout_id} is not its last prompt + completion")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--system", type=int, default=50_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from transformers import AutoTokenizer

    from core.models.resolve import resolve_model

    tok = AutoTokenizer.from_pretrained(str(resolve_model("tiny")))
    with tempfile.TemporaryDirectory() as tmp:
        r = run(args, tok, Path(tmp))
    ratio = r["store_bytes"] / r["distinct_bytes"]
    print(f"{args.rollouts} rollouts x {args.calls} calls, system prompt {r['system_tokens']} tokens ({r['wall_s']:.0f} s to generate and record)")
    print(f"store file                 {r['store_bytes'] / 1e6:10,.1f} MB")
    print(f"distinct tokens (int32)    {r['distinct_bytes'] / 1e6:10,.1f} MB   ratio {ratio:.2f}x (floor <= {FLOOR_BYTES_RATIO:g}x)")
    print(f"plan (mean, all calls)     {r['plan_ms']:10.2f} ms/call (each rollout's first call renders and encodes everything)")
    print(f"recording                  {r['record_per_s']:10,.0f} calls/s (row + record_call + flush)")
    print(f"samples_for_run            {r['samples_per_s']:10,.0f} calls/s (floor >= {FLOOR_SAMPLES_PER_S:,})")
    ok = ratio <= FLOOR_BYTES_RATIO and r["samples_per_s"] >= FLOOR_SAMPLES_PER_S
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
