"""Token ids stored as token text (schema 6): exact through every reader, bad ids kept in store_errors, and the
file layout choices that keep a store small (zstd token text, no free blocks after a clean stop, unindexed keys)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from core.errors import StoreError
from core.store.tokens import MAX_ID, id_list, ids_column, ids_of, ids_text
from core.store.writer import Store
from core.train.samples import samples_for_run

# every range the mapping treats differently: NUL's neighbour, the last id below the surrogates, the first above,
# the tiny model's vocabulary, Qwen's, and the largest id a character holds
EDGES = [0, 1, 127, 128, 2047, 2048, 0xD7FE, 0xD7FF, 0xD800, 0xDFFE, 0xDFFF, 0xE000, 4095, 0xFFFE, 0xFFFF, 65_536, 151_935, MAX_ID]


def test_token_text_round_trips_every_range() -> None:
    text = ids_text(EDGES)
    assert isinstance(text, str) and len(text) == len(EDGES) and "\0" not in text
    assert ids_of(text).tolist() == EDGES and ids_of(text).dtype == np.int32
    assert id_list(ids_text([])) == [] and ids_text(None) is None and ids_of(None) is None
    assert ids_of([3, 4]).tolist() == [3, 4]  # an older store's list reads the same
    column = ["", None, text, ids_text([5]), [9, 8], np.array([7], dtype=np.int32)]
    assert [None if v is None else v.tolist() for v in ids_column(column)] == [[], None, EDGES, [5], [9, 8], [7]]


@pytest.mark.parametrize("bad", [[-1], [MAX_ID + 1], [1.5], [[1, 2]], ["a"]])
def test_ids_no_character_holds_are_refused(bad: list) -> None:
    with pytest.raises(StoreError, match="token id"):
        ids_text(bad)


def call(call_id: str, seq: int, **extra) -> dict:
    return {"call_id": call_id, "rollout_id": "r", "seq": seq, "attempt": 0, "status": "ok", "weights_version": 0, **extra}


def test_every_reader_gets_the_ids_back(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    first, answer, new = EDGES[:9], [10, 0xD7FF, 70_000], EDGES[9:]
    with Store.open(path) as store:
        store.insert_run("run", {})
        store.upsert_rollout({"rollout_id": "r", "run_id": "run", "task_id": "t", "status": "done", "reward": 1.0, "attempt": 0})
        store.record_call(call("c0", 0, prompt_token_ids=first, completion_token_ids=answer, completion_logprobs=[-0.5] * 3))
        store.record_call(call("c1", 1, prompt_new_token_ids=new, parent_call_id="c0", prefix_tokens=len(first) + 3,
                               completion_token_ids=[], completion_logprobs=[], extends_parent=True))
        store.flush()
        live = store.handle_query("SELECT token_ids(completion_token_ids), len(prompt_new_token_ids) FROM calls ORDER BY seq")
        assert live["rows"] == [[answer, None], [[], len(new)]]  # len() counts tokens
    whole = first + answer + new
    con = duckdb.connect(str(path), read_only=True)
    try:
        assert con.execute("SELECT prompt_token_ids FROM full_prompt('c1')").fetchone() == (whole,)
        assert con.execute("SELECT prompt_token_ids, completion_token_ids FROM calls_full ORDER BY seq").fetchall() == [(first, answer), (whole, [])]
        (sample,) = samples_for_run(con, "run")
        assert sample.token_ids.tolist() == whole and sample.loss_mask.tolist() == [0] * 9 + [1] * 3 + [0] * len(new)
        # the token text is zstd-compressed in the file
        kinds = {k for (k,) in con.execute("SELECT compression FROM pragma_storage_info('calls') WHERE column_name = 'prompt_token_ids'").fetchall()}
        assert "ZSTD" in kinds
    finally:
        con.close()


def test_a_row_with_ids_no_character_holds_goes_to_store_errors(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store.duckdb") as store:
        store.record_call(call("good", 0, completion_token_ids=[1, 2]))
        store.record_call(call("bad", 1, completion_token_ids=[1, -7]))
        store.flush()
        cur = store.cursor()
        assert cur.execute("SELECT call_id FROM calls").fetchall() == [("good",)]
        ((table, row, error),) = cur.execute("SELECT table_name, row->>'call_id', error FROM store_errors").fetchall()
        assert (table, row) == ("calls", "bad") and "token id -7 is outside" in error


def test_a_clean_stop_leaves_no_free_blocks(tmp_path: Path) -> None:
    """Token ids as INTEGER[] lists (before schema 6), appended a call per commit as the proxy does, left blocks free
    after the final checkpoint (10 of 29 here: DuckDB's checkpoint of list columns); token text leaves none."""
    path = tmp_path / "store.duckdb"
    rng = np.random.default_rng(0)
    with Store.open(path) as store:
        for seq in range(100):
            store.record_call(call(f"c{seq}", seq, prompt_token_ids=rng.integers(0, 4096, 2000).tolist()))
            store.flush()
    con = duckdb.connect(str(path), read_only=True)
    try:
        _, _, _, total, used, free, *_ = con.execute("PRAGMA database_size").fetchone()
    finally:
        con.close()
    assert (free, used) == (0, total)


def test_small_tables_keep_unique_keys_without_an_index(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store.duckdb") as store:
        for status in ("pending", "running", "done"):
            store.insert_run("run", {"a": status})
            store.upsert_rollout({"rollout_id": "r", "run_id": "run", "status": status})
        store.flush()
        cur = store.cursor()
        assert cur.execute("SELECT count(*), any_value(status) FROM rollouts").fetchone() == (1, "done")
        assert cur.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        keyed = {t for (t,) in cur.execute("SELECT table_name FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'").fetchall()}
        assert keyed == {"calls", "blobs", "samples"}
