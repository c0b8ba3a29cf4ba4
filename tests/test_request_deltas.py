"""Request bodies stored as deltas: every real harness's history reads back byte for byte through every reader,
the store keeps only what is new, and bodies that cannot be deltas are stored whole and counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.store.behaviour import with_views
from core.store.bodies import MIN_BODY_CHARS, request_of, select_calls, splice
from core.store.query import run_query
from core.store.writer import Store
from tests.harness_histories import HARNESSES, History, bodies

CALLS = 40


def record(store: Store, rollout_id: str, api: str, texts: list[bytes], start: int = 0) -> list[str]:
    ids = []
    for seq, body in enumerate(texts, start):
        call_id = f"{rollout_id}-{seq}"
        store.record_call({"call_id": call_id, "rollout_id": rollout_id, "seq": seq, "attempt": 0, "api": api, "request": body, "status": "ok"})
        ids.append(call_id)
    return ids


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, bytes]]]:
    """One store holding a CALLS-call history of every fixture harness (each its own rollout)."""
    path = tmp_path_factory.mktemp("deltas") / "store.duckdb"
    sent: dict[str, dict[str, bytes]] = {}
    with Store.open(path) as store:
        for harness in HARNESSES:
            texts = bodies(harness, CALLS)
            ids = record(store, harness, History(harness).api, texts)
            sent[harness] = dict(zip(ids, texts, strict=True))
        store.flush()
    return path, sent


def as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


@pytest.mark.parametrize("harness", HARNESSES)
def test_every_body_reads_back_byte_for_byte(histories: tuple[Path, dict[str, dict[str, bytes]]], harness: str) -> None:
    path, sent = histories
    want = sent[harness]
    with Store.open(path) as store:
        cur = store.cursor()
        forms = dict(cur.execute("SELECT call_id, request_form FROM calls WHERE rollout_id = ?", [harness]).fetchall())
        # the first body is whole, or a splice on an earlier rollout's first body (chat harnesses share a shape)
        assert forms[f"{harness}-0"] in ("whole", "delta") and all(forms[c] == "delta" for c in want if not c.endswith("-0"))
        (stored,) = cur.execute("SELECT count(*) FROM calls WHERE rollout_id = ? AND request IS NOT NULL", [harness]).fetchone()
        assert stored <= 1  # every later body is a delta: `request` is NULL on its row
        # Python readers (trajectory, export, sft, the TUI) and one call at a time (vision, the call inspector)
        rows = select_calls(cur, "SELECT call_id, {request} FROM calls WHERE rollout_id = ?", [harness])
        assert {r["call_id"]: as_bytes(r["request"]) for r in rows} == want
        backwards = select_calls(cur, "SELECT call_id, {request} FROM calls WHERE rollout_id = ? ORDER BY seq DESC", [harness])
        assert {r["call_id"]: as_bytes(r["request"]) for r in backwards} == want
        assert as_bytes(request_of(cur, f"{harness}-{CALLS - 1}")) == want[f"{harness}-{CALLS - 1}"]
        # SQL: the rollout macro, one call, every call, calls_full
        sql_rollout = dict(cur.execute("SELECT call_id, request FROM rollout_requests(?)", [harness]).fetchall())
        assert {c: as_bytes(b) for c, b in sql_rollout.items()} == want
        (one,) = cur.execute(f"SELECT request FROM full_request('{harness}-{CALLS // 2}')").fetchone()
        assert as_bytes(one) == want[f"{harness}-{CALLS // 2}"]
        every = dict(cur.execute("SELECT call_id, request FROM call_requests WHERE call_id LIKE ?", [f"{harness}-%"]).fetchall())
        assert {c: as_bytes(b) for c, b in every.items()} == want
        full = dict(cur.execute("SELECT call_id, request FROM calls_full WHERE rollout_id = ?", [harness]).fetchall())
        assert {c: as_bytes(b) for c, b in full.items()} == want


def test_the_record_grows_with_what_is_new(histories: tuple[Path, dict[str, dict[str, bytes]]]) -> None:
    path, sent = histories
    with Store.open(path) as store:
        for harness, want in sent.items():
            first, last = want[f"{harness}-0"], want[f"{harness}-{CALLS - 1}"]
            (new,) = store.cursor().execute(
                "SELECT sum(strlen(request_new)) FROM calls WHERE rollout_id = ?", [harness]).fetchone()
            # stored: the first body whole + each call's new part; distinct content: the final body
            assert len(first) + new <= 1.6 * len(last), harness
            assert sum(map(len, want.values())) > 10 * (len(first) + new), harness


def test_a_reader_of_an_older_layout_reads_through_the_same_helpers(tmp_path: Path) -> None:
    """The TUI's read-only path (run_query) and the analytics' inlined views see the rebuilt bodies too."""
    path = tmp_path / "s.duckdb"
    texts = bodies("codex", 6)
    with Store.open(path) as store:
        record(store, "r", "responses", texts)
    result = run_query(path, "SELECT call_id, request FROM rollout_requests('r') ORDER BY call_id")
    assert [as_bytes(b) for _, b in result.rows] == texts
    counted = run_query(path, with_views("SELECT count(*) FROM tool_results WHERE rollout_id = 'r'"))
    assert counted.rows[0][0] == 0  # no rollouts row: final_calls joins rollouts; the inlined SQL still binds


def test_a_rewritten_history_is_stored_whole_and_counted(tmp_path: Path) -> None:
    history = History("openclaw-chat")
    for _ in range(3):
        history.grow()
    before = history.encoded()
    history.body["messages"] = list(reversed(history.body["messages"]))  # re-ordered history
    after = history.encoded()
    with Store.open(tmp_path / "s.duckdb") as store:
        record(store, "r", "chat", [before, after])
        store.flush()
        rows = store.cursor().execute("SELECT call_id, request_form, request IS NOT NULL FROM calls ORDER BY seq").fetchall()
        assert rows == [("r-0", "whole", True), ("r-1", "whole:diverged", True)]
        assert as_bytes(request_of(store.cursor(), "r-1")) == after


def test_a_body_that_is_not_json_is_kept_whole_in_store_errors(tmp_path: Path) -> None:
    texts = bodies("pi", 4)
    broken = texts[2][:-1] + b"!"  # the same history, then not JSON: a splice would rebuild text the column refuses
    with Store.open(tmp_path / "s.duckdb") as store:
        record(store, "r", "chat", [texts[0], texts[1], broken, texts[3]])
        assert store.problem_counts()["store_errors"] == 1
        cur = store.cursor()
        ((row, error),) = cur.execute("SELECT row, error FROM store_errors").fetchall()
        kept = json.loads(row)
        assert kept["call_id"] == "r-2" and kept["request"].encode() == broken  # never lost, byte for byte
        forms = dict(cur.execute("SELECT call_id, request_form FROM calls").fetchall())
        assert forms == {"r-0": "whole", "r-1": "delta", "r-3": "delta"}
        (base,) = cur.execute("SELECT request_base FROM calls WHERE call_id = 'r-3'").fetchone()
        assert base == "r-1"  # the failed row never became a base
        got = {c: as_bytes(b) for c, b in cur.execute("SELECT call_id, request FROM rollout_requests('r')").fetchall()}
        assert got == {"r-0": texts[0], "r-1": texts[1], "r-3": texts[3]}


def test_a_rollout_starts_on_an_earlier_rollouts_first_body(tmp_path: Path) -> None:
    """Every rollout of a run sends the same tools and system prompt: its first body is a splice on an earlier one."""
    one, two = History("claude-code"), History("claude-code")
    two.body["messages"][0]["content"][-1]["text"] = "Fix the failing test in src/"
    sent = {"a-0": one.encoded(), "b-0": two.encoded()}
    two.grow()
    sent["b-1"] = two.encoded()
    with Store.open(tmp_path / "s.duckdb") as store:
        record(store, "a", "messages", [sent["a-0"]])
        record(store, "b", "messages", [sent["b-0"], sent["b-1"]])
        store.flush()
        cur = store.cursor()
        assert cur.execute("SELECT request_form, request_base FROM calls WHERE call_id = 'b-0'").fetchone() == ("delta", "a-0")
        (new,) = cur.execute("SELECT strlen(request_new) FROM calls WHERE call_id = 'b-0'").fetchone()
        assert new < 100
        got = {c: as_bytes(b) for c, b in cur.execute("SELECT call_id, request FROM rollout_requests('b')").fetchall()}
        assert got == {"b-0": sent["b-0"], "b-1": sent["b-1"]}
        rows = select_calls(cur, "SELECT call_id, {request} FROM calls WHERE rollout_id = 'b'")
        assert {r["call_id"]: as_bytes(r["request"]) for r in rows} == {"b-0": sent["b-0"], "b-1": sent["b-1"]}


def test_small_bodies_stay_whole(tmp_path: Path) -> None:
    small = [json.dumps({"messages": ["x" * n]}).encode() for n in (10, 20)]
    assert all(len(b) < MIN_BODY_CHARS for b in small)
    with Store.open(tmp_path / "s.duckdb") as store:
        record(store, "r", "chat", small)
        store.flush()
        assert store.cursor().execute("SELECT count(*) FROM calls WHERE request_form = 'whole'").fetchone() == (2,)


@pytest.mark.parametrize(
    ("base", "body"),
    [("abcdef", "abcXYdef"), ("abc", "abc"), ("", "x"), ("aaaa", "aa"), ("é–ü😀", "é–x😀"), ("ab", "ba")],
)
def test_splice_rebuilds_exactly(base: str, body: str) -> None:
    from core.store.bodies import rebuild

    head, tail = splice(base, body)
    assert head + tail <= min(len(base), len(body))
    assert rebuild(base, head, body[head : len(body) - tail], tail) == body


def test_the_writer_remembers_a_bounded_amount_of_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running proxy forgets the least recently written rollouts' bodies past MAX_KEPT_CHARS."""
    from core.store import bodies as module

    monkeypatch.setattr(module, "MAX_KEPT_CHARS", 300_000)
    deltas = module.BodyDeltas()
    texts = [t.decode() for t in bodies("pi", 3)]
    for r in range(20):  # 20 rollouts x 3 bodies of ~6-9 KB
        for seq, text in enumerate(texts):
            deltas.encode({"call_id": f"r{r}-{seq}", "rollout_id": f"r{r}", "api": "chat"}, text)
            deltas.commit()
    assert deltas._kept <= 300_000 and "r1" not in {k[0] for k in deltas._rollouts} and ("r19", 0) in deltas._rollouts
    assert deltas._kept == sum(len(b.text) for kept in deltas._rollouts.values() for b in kept)
    again = deltas.encode({"call_id": "r1-3", "rollout_id": "r1", "api": "chat"}, texts[2])
    assert again["request_form"] == "delta" and again["request_base"] == "r0-0"  # r1's own bodies are gone: on the root


def test_compose_equals_splicing_one_step_at_a_time() -> None:
    import random

    from core.store.bodies import compose, rebuild

    rng = random.Random(7)
    for _ in range(200):
        text = "".join(rng.choice("ab{}é😀") for _ in range(rng.randrange(0, 40)))
        base, steps = text, []
        for _ in range(rng.randrange(1, 8)):
            head = rng.randrange(0, len(text) + 1)
            tail = rng.randrange(0, len(text) - head + 1)
            new = "".join(rng.choice("xyz–") for _ in range(rng.randrange(0, 6)))
            steps.append((head, new, tail))
            text = rebuild(text, head, new, tail)
        assert compose(base, steps) == text
