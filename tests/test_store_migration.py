"""Stores written by schema 4's code (before request deltas) and schema 5's (before token text) open and read exactly
as that code read them: read-only as they are, and through the writer, which migrates them in place (token columns
turned into token text, the stored behaviour views dropped) and then writes deltas into them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from core.store.behaviour import VIEW_NAMES, with_views
from core.store.bodies import request_of, select_calls
from core.store.query import run_query
from core.store.schema import SCHEMA_VERSION, TOKEN_COLUMNS
from core.store.writer import Store
from core.train.samples import samples_for_run
from tests.harness_histories import bodies

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# both were written by tests/fixtures/make_store_fixture.py with the same contents, so they read the same
EXPECTED: dict[str, Any] = json.loads((FIXTURES / "store-v4.json").read_text(encoding="utf-8"))


@pytest.fixture(params=[4, 5])
def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    fixture = FIXTURES / f"store-v{request.param}.duckdb"
    assert json.loads(fixture.with_suffix(".json").read_text(encoding="utf-8")) == {**EXPECTED, "schema_version": request.param}
    path = tmp_path / "store.duckdb"
    shutil.copyfile(fixture, path)
    return path


def version(cur: Any) -> int:
    return int(cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])


def digest(text: str | None) -> tuple[str, int]:
    body = (text or "").encode()
    return hashlib.sha256(body).hexdigest(), len(body)


def expected_bodies() -> dict[str, tuple[str, int]]:
    return {c: (v["request_sha256"], v["request_bytes"]) for c, v in EXPECTED["calls"].items()}


def check_reads(cur: Any) -> None:
    """Bodies (both Python readers), responses, whole prompts and samples as schema 4's code read them."""
    rows = select_calls(cur, "SELECT call_id, response, {request} FROM calls WHERE rollout_id IN ('r-claude', 'r-codex')")
    assert {r["call_id"]: digest(r["request"]) for r in rows} == expected_bodies()
    assert {r["call_id"]: r["response"] for r in rows} == {c: v["response"] for c, v in EXPECTED["calls"].items()}
    for call_id, want in EXPECTED["calls"].items():
        assert digest(request_of(cur, call_id)) == (want["request_sha256"], want["request_bytes"])
        (prompt,) = cur.execute(f"SELECT prompt_token_ids FROM full_prompt('{call_id}')").fetchone()
        assert list(prompt) == want["prompt_token_ids"]
    samples = [
        {"sample_id": s.sample_id, "token_ids": list(s.token_ids), "loss_mask": list(s.loss_mask), "logprobs": list(s.logprobs), "call_ids": s.call_ids}
        for s in samples_for_run(cur, "run-v4")
    ]
    assert samples == EXPECTED["samples"]


def test_the_fixtures_are_older_schemas() -> None:
    assert EXPECTED["schema_version"] == 4 < 5 < SCHEMA_VERSION


def test_an_old_store_reads_the_same_read_only(old_store: Path) -> None:
    con = duckdb.connect(str(old_store), read_only=True)
    try:
        assert version(con) < SCHEMA_VERSION
        assert con.execute("SELECT data_type FROM information_schema.columns WHERE table_name = 'calls' AND column_name = 'prompt_token_ids'").fetchall() == [("INTEGER[]",)]
        check_reads(con)
    finally:
        con.close()
    # the TUI's and analytics' path: the file opened read-only by run_query, behaviour views inlined
    result = run_query(old_store, with_views("SELECT rollout_id, count(*) FROM offered_tools GROUP BY ALL ORDER BY 1"))
    assert [r[0] for r in result.rows] == ["r-claude", "r-codex"] and all(r[1] > 5 for r in result.rows)


def test_an_old_store_migrates_in_place_and_reads_the_same(old_store: Path) -> None:
    with Store.open(old_store) as store:
        cur = store.cursor()
        assert version(cur) == SCHEMA_VERSION
        token_types = cur.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'calls' AND column_name LIKE '%token_ids'"
        ).fetchall()
        assert dict(token_types) == dict.fromkeys(TOKEN_COLUMNS["calls"], "VARCHAR")
        views = {v for (v,) in cur.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        assert not views & set(VIEW_NAMES)
        check_reads(cur)
        # the SQL views read the old rows' whole bodies as they are
        sql = {c: digest(b) for c, b in cur.execute("SELECT call_id, request FROM calls_full").fetchall()}
        assert sql == expected_bodies()
        prompts = {c: p for c, p in cur.execute("SELECT call_id, prompt_token_ids FROM calls_full").fetchall()}
        assert prompts == {c: v["prompt_token_ids"] for c, v in EXPECTED["calls"].items()}  # the converted token text
        one = {c: digest(b) for c, b in cur.execute("SELECT call_id, request FROM rollout_requests('r-codex')").fetchall()}
        assert one == {c: d for c, d in expected_bodies().items() if c.startswith("r-codex")}
        # and new calls go in as deltas beside them
        texts = bodies("codex", 3)
        for seq, body in enumerate(texts):
            store.record_call({"call_id": f"new-{seq}", "rollout_id": "r-new", "seq": seq, "api": "responses", "request": body,
                               "prompt_token_ids": [seq, 70_000 + seq], "completion_token_ids": []})
        store.flush()
        assert cur.execute("SELECT token_ids(prompt_token_ids), token_ids(completion_token_ids) FROM calls WHERE call_id = 'new-2'").fetchone() == ([2, 70_002], [])
        forms = [f for (f,) in cur.execute("SELECT request_form FROM calls WHERE rollout_id = 'r-new' ORDER BY seq").fetchall()]
        assert forms[1:] == ["delta", "delta"]
        got = [digest(b) for _, b in cur.execute("SELECT call_id, request FROM rollout_requests('r-new') ORDER BY call_id").fetchall()]
        assert got == [digest(t.decode()) for t in texts]
    con = duckdb.connect(str(old_store), read_only=True)  # after a clean stop, read-only again
    try:
        check_reads(con)
    finally:
        con.close()
