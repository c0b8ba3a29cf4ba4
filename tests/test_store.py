"""The DuckDB store: schema, batched writer, dead letters, crash durability, live and read-only queries."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import orjson
import pytest

from core.errors import StoreError
from core.store import (
    SCHEMA_DOC,
    QueryResult,
    Store,
    format_result,
    handle_query,
    latest_store,
    run_query,
    store_for_run,
)
from core.store.schema import COLUMNS, SCHEMA_VERSION
from core.store.sidecar import sidecar_path

REPO = Path(__file__).resolve().parents[1]
TABLES = {"meta", "runs", "rollouts", "calls", "samples", "train_steps", "store_errors"}


def call_row(i: int, **over: object) -> dict:
    row = {
        "call_id": f"c{i}",
        "rollout_id": "r1",
        "seq": i,
        "api": "chat",
        "model": "policy",
        "request": {"messages": [{"role": "user", "content": f"hi {i}"}], "stream": False},
        "response": {"choices": [{"message": {"content": "ok"}}]},
        "prompt_token_ids": [1, 2, 3, i],
        "completion_token_ids": [7, 8],
        "completion_logprobs": [-0.5, -0.25],
        "finish_reason": "stop",
        "status": "ok",
        "started_at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "latency_ms": 12.5,
        "branch": 0,
        "extends_parent": True,
        "stream": False,
    }
    row.update(over)
    return row


def wait_until(predicate, timeout: float = 10.0, step: float = 0.01):
    """Poll `predicate` until it returns something truthy (a liveness guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "runs" / "r" / "store.duckdb")
    yield s
    s.close()


def test_an_older_store_gains_the_new_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    import duckdb

    path = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(path))  # a version-1 store: no rollouts.step, no calls.weights_version
    con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute("CREATE TABLE rollouts (rollout_id VARCHAR PRIMARY KEY, run_id VARCHAR, status VARCHAR)")
    con.execute("INSERT INTO rollouts VALUES ('r1', 'run1', 'done')")
    con.close()
    with Store.open(path) as s:
        s.upsert_rollout({"rollout_id": "r2", "run_id": "run1", "status": "pending", "step": 3})
        s.flush()
        cur = s.cursor()
        assert cur.execute("SELECT rollout_id, step FROM rollouts ORDER BY 1").fetchall() == [("r1", None), ("r2", 3)]
        assert cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (str(SCHEMA_VERSION),)


def test_schema_created_and_reopen_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "store.duckdb"
    with Store.open(path) as s:
        s.insert_run("run1", {"lr": 1e-6})
        s.flush()
    assert path.exists()
    with Store.open(path) as s:  # reopening must not recreate or duplicate anything
        cur = s.cursor()
        tables = {r[0] for r in cur.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert TABLES <= tables
        assert cur.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [(str(SCHEMA_VERSION),)]
        assert cur.execute("SELECT run_id, status, CAST(config->>'lr' AS DOUBLE) FROM runs").fetchall() == [("run1", "running", 1e-6)]
        calls_cols = cur.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'calls' ORDER BY ordinal_position"
        ).fetchall()
        assert [c for c, _ in calls_cols] == list(COLUMNS["calls"])
        assert dict(calls_cols)["prompt_token_ids"] == "VARCHAR"  # token text (core/store/tokens.py)
    for table in TABLES:
        assert f"`{table}`" in SCHEMA_DOC


def test_record_call_types_round_trip(store: Store) -> None:
    for i in range(3):
        store.record_call(call_row(i))
    store.record_call({"call_id": "partial", "rollout_id": "r1", "status": "error", "error": "boom"})
    store.flush()
    cur = store.cursor()
    rows = cur.execute(
        "SELECT call_id, token_ids(prompt_token_ids), completion_logprobs, request->>'$.messages[0].content', "
        "typeof(request), typeof(prompt_token_ids), started_at, extends_parent, latency_ms "
        "FROM calls WHERE call_id LIKE 'c%' ORDER BY seq"
    ).fetchall()
    assert rows[2] == (
        "c2", [1, 2, 3, 2], [-0.5, -0.25], "hi 2", "JSON", "VARCHAR", dt.datetime(2026, 1, 2, 3, 4, 5), True, 12.5
    )
    assert len(rows) == 3
    assert cur.execute("SELECT status, error, prompt_token_ids FROM calls WHERE call_id = 'partial'").fetchall() == [
        ("error", "boom", None)
    ]


def test_unknown_column_is_refused_at_once(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown column"):
        store.record_call({"call_id": "x", "not_a_column": 1})


def test_upsert_rollout_updates_only_given_columns(store: Store) -> None:
    store.upsert_rollout({"rollout_id": "ro1", "run_id": "run1", "task_id": "t1", "status": "pending", "meta": {"k": 1}})
    store.upsert_rollout({"rollout_id": "ro1", "status": "running"})
    store.flush()
    store.upsert_rollout({"rollout_id": "ro1", "status": "done", "reward": 1.0, "passed": True})
    store.insert_run("run1", {"a": 1})
    store.update_run_status("run1", "done")
    store.insert_samples([{"sample_id": "s1", "run_id": "run1", "token_ids": [1, 2], "loss_mask": [0, 1]}])
    store.insert_train_step({"run_id": "run1", "step": 0, "loss": 0.5, "metrics": {"kl": 0.1}})
    store.flush()
    cur = store.cursor()
    assert cur.execute("SELECT run_id, task_id, status, reward, passed, meta->>'k' FROM rollouts").fetchall() == [
        ("run1", "t1", "done", 1.0, True, "1")
    ]
    assert cur.execute("SELECT status FROM runs").fetchall() == [("done",)]
    assert cur.execute("SELECT loss_mask, typeof(loss_mask), created_at IS NOT NULL FROM samples").fetchall() == [
        ([0, 1], "TINYINT[]", True)
    ]
    assert cur.execute("SELECT step, loss, metrics->>'kl' FROM train_steps").fetchall() == [(0, 0.5, "0.1")]


def test_bad_row_goes_to_store_errors_without_losing_others(store: Store) -> None:
    store.record_call(call_row(0))
    store.flush()
    for i in range(1, 6):
        store.record_call(call_row(i, seq="not a number") if i == 3 else call_row(i))
    store.record_call(call_row(0))  # duplicate primary key
    store.flush()
    cur = store.cursor()
    assert [r[0] for r in cur.execute("SELECT call_id FROM calls ORDER BY call_id").fetchall()] == [
        "c0", "c1", "c2", "c4", "c5"
    ]
    errors = cur.execute("SELECT table_name, row->>'call_id', error FROM store_errors ORDER BY row->>'call_id'").fetchall()
    assert [(t, c) for t, c, _ in errors] == [("calls", "c0"), ("calls", "c3")]
    assert "not a number" in errors[1][2] or "Conversion" in errors[1][2]
    assert [d["row"]["call_id"] for d in store.dead_letter] == ["c3", "c0"]


def test_durable_within_flush_interval_through_live_endpoint(store: Store) -> None:
    url = store.serve_queries()
    assert url.startswith("http://127.0.0.1:")
    side = json.loads(sidecar_path(store.path).read_text())
    assert side["pid"] == os.getpid() and side["url"] == url
    store.record_call(call_row(42))  # no flush: the background thread must commit on its own
    seen = wait_until(lambda: run_query(store.path, "SELECT count(*) FROM calls").rows == [[1]], timeout=2.0)
    assert seen, "a recorded call was not committed within 2 s"
    res = run_query(store.path, "SELECT call_id, token_ids(prompt_token_ids) AS prompt_token_ids, request FROM calls")
    assert res.columns == ["call_id", "prompt_token_ids", "request"]
    assert res.rows[0][:2] == ["c42", [1, 2, 3, 42]]
    assert orjson.loads(res.rows[0][2])["messages"][0]["content"] == "hi 42"
    store.close()
    assert not sidecar_path(store.path).exists()


def test_non_select_is_rejected(store: Store, tmp_path: Path) -> None:
    store.record_call(call_row(1))
    store.flush()
    store.serve_queries()
    for sql in [
        "DELETE FROM calls",
        "INSERT INTO runs (run_id) VALUES ('x')",
        "SELECT 1; DROP TABLE calls",
        f"COPY calls TO '{tmp_path / 'x.csv'}'",
        f"ATTACH '{tmp_path / 'other.duckdb'}'",
        "PRAGMA enable_profiling",
        "CHECKPOINT",
    ]:
        with pytest.raises(StoreError):
            handle_query(store, sql)
        with pytest.raises(StoreError, match="only read-only|not allowed"):
            run_query(store.path, sql)
    assert store.cursor().execute("SELECT count(*) FROM calls").fetchall() == [(1,)]
    assert run_query(store.path, "DESCRIBE calls").rows[0][:2] == ["call_id", "VARCHAR"]
    assert run_query(store.path, "PRAGMA table_info('calls')").rows[0][1] == "call_id"
    assert run_query(store.path, "WITH x AS (SELECT 2 AS n) SELECT n FROM x").rows == [[2]]
    assert run_query(store.path, "SHOW TABLES").rows


def test_results_are_capped(store: Store) -> None:
    for i in range(10):
        store.record_call(call_row(i))
    store.flush()
    res = QueryResult.from_dict(handle_query(store, "SELECT seq FROM calls ORDER BY seq", max_rows=4))
    assert res.rows == [[0], [1], [2], [3]] and res.truncated
    store.serve_queries()
    assert run_query(store.path, "SELECT seq FROM calls", max_rows=20).truncated is False


def test_live_endpoint_needs_token_and_answers_with_it(store: Store) -> None:
    import httpx

    store.record_call(call_row(1))
    store.flush()
    url = store.serve_queries()
    assert httpx.post(url, json={"sql": "SELECT 1"}).status_code == 401
    ok = httpx.post(url, json={"sql": "SELECT count(*) AS n FROM calls"}, headers={"X-Forgetui-Token": store.query_token})
    assert ok.status_code == 200 and ok.json()["rows"] == [[1]] and ok.json()["columns"] == ["n"]
    bad = httpx.post(url, json={"sql": "DROP TABLE calls"}, headers={"X-Forgetui-Token": store.query_token})
    assert bad.status_code == 400 and "read-only" in bad.json()["error"]


def test_read_only_open_when_no_writer_and_stale_sidecar(tmp_path: Path) -> None:
    path = tmp_path / "stores" / "s.duckdb"
    with Store.open(path) as s:
        s.record_call(call_row(1))
    sidecar_path(path).write_text(json.dumps({"pid": 2**22 + 12345, "url": "http://127.0.0.1:9/", "token": "x"}))
    assert run_query(path, "SELECT call_id FROM calls").rows == [["c1"]]
    assert not sidecar_path(path).exists()
    with pytest.raises(StoreError, match="only read-only"):
        run_query(path, "UPDATE calls SET seq = 0")


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from core.store import Store
    path, n = sys.argv[1], int(sys.argv[2])
    s = Store.open(path)
    for i in range(n):
        s.record_call({"call_id": f"c{i}", "rollout_id": "r", "seq": i, "request": {"i": i},
                       "prompt_token_ids": [i, i + 1]})
    s.flush()
    print("flushed", flush=True)
    for i in range(n, n + 10**6):  # keep writing until killed: the last batch may or may not land
        s.record_call({"call_id": f"c{i}", "rollout_id": "r", "seq": i})
        time.sleep(0.001)
    """
)


def test_kill_9_keeps_every_committed_call(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    n = 500
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(path), str(n)],
        stdout=subprocess.PIPE, text=True, env=subprocess_env(), cwd=REPO,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "flushed"
        with pytest.raises(StoreError, match="no live query endpoint"):  # locked, and nobody to ask
            run_query(path, "SELECT count(*) FROM calls")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    ro = duckdb.connect(str(path), read_only=True)
    assert ro.execute("SELECT count(*) FROM calls WHERE seq < ?", [n]).fetchone() == (n,)
    ro.close()
    with Store.open(path) as s:
        cur = s.cursor()
        assert cur.execute("SELECT count(*), sum(seq) FROM calls WHERE seq < ?", [n]).fetchone() == (n, n * (n - 1) // 2)
        assert cur.execute("SELECT token_ids(prompt_token_ids) FROM calls WHERE call_id = 'c7'").fetchone() == ([7, 8],)


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from core.store import Store, install_signal_flush
    s = Store.open(sys.argv[1], linger_s=30)  # nothing commits on its own before the signal
    install_signal_flush(s)
    for i in range(100):
        s.record_call({"call_id": f"c{i}", "seq": i})
    print("recorded", flush=True)
    time.sleep(60)
    """
)


def test_sigterm_closes_and_keeps_queued_calls(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT, str(path)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "recorded"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # the default action still runs after the flush
    ro = duckdb.connect(str(path), read_only=True)
    assert ro.execute("SELECT count(*), sum(seq) FROM calls").fetchone() == (100, 4950)
    ro.close()


READER_SCRIPT = textwrap.dedent(
    """
    import sys
    from core.store import run_query
    path = sys.argv[1]
    for line in sys.stdin:  # one query per line the test sends; "q" ends
        if line.strip() == "q":
            break
        try:
            rows = run_query(path, "SELECT count(*), max(seq) FROM calls").rows
            print("ok", rows[0][0], flush=True)
        except Exception as exc:
            print("ERR", repr(exc), flush=True)
    """
)


def test_reader_in_another_process_while_writer_writes(store: Store) -> None:
    store.serve_queries()
    reader = subprocess.Popen(
        [sys.executable, "-c", READER_SCRIPT, str(store.path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=subprocess_env(), cwd=REPO,
    )
    answers: list[str] = []
    stop = threading.Event()

    def ask_in_a_loop() -> None:
        assert reader.stdin is not None and reader.stdout is not None
        while not stop.is_set():
            reader.stdin.write("go\n")
            reader.stdin.flush()
            answers.append(reader.stdout.readline().strip())

    asker = threading.Thread(target=ask_in_a_loop)
    asker.start()
    try:
        total, chunk = 5000, 500
        for start in range(0, total, chunk):
            for i in range(start, start + chunk):
                store.record_call(call_row(i, request={"pad": "x" * 2000, "i": i}))
            store.flush()
            seen_before = len(answers)
            wait_until(lambda n=seen_before: len(answers) > n + 1)  # the reader queried while we write
    finally:
        stop.set()
        asker.join(timeout=30)
        assert reader.stdin is not None
        reader.stdin.write("q\n")
        reader.stdin.close()
        reader.wait(timeout=30)
    assert answers and all(a.startswith("ok ") for a in answers), [a for a in answers if not a.startswith("ok")][:3]
    counts = [int(a.split()[1]) for a in answers]
    assert counts == sorted(counts)  # each reader sees a consistent, growing snapshot
    assert len(set(counts)) >= 5  # and it saw the writer's commits as they happened
    assert store.cursor().execute("SELECT count(*), count(DISTINCT call_id) FROM calls").fetchone() == (5000, 5000)


def test_long_query_does_not_block_writer(store: Store) -> None:
    store.serve_queries()
    result: dict = {}

    def slow_query() -> None:
        try:
            result["r"] = handle_query(store, "SELECT count(*) FROM range(100000000000) t(x) WHERE x % 7 = 3", timeout_s=2)
        except StoreError as exc:
            result["err"] = str(exc)

    t = threading.Thread(target=slow_query)
    t.start()
    try:
        for i in range(200):
            store.record_call(call_row(i))
        store.flush()
        assert t.is_alive()  # the reader is still busy, yet the writer committed everything
        assert store.cursor().execute("SELECT count(*) FROM calls").fetchone() == (200,)
    finally:
        t.join(timeout=60)
    assert "err" in result and "INTERRUPT" in result["err"].upper()


def test_formats() -> None:
    res = QueryResult(["id", "toks", "note"], [["a", [1, 2], None], ["b,c", [], "[red]x[/red]"]], False)
    csv_out = format_result(res, "csv")
    assert csv_out.splitlines() == ["id,toks,note", "a,\"[1,2]\",", '"b,c",[],[red]x[/red]']
    assert json.loads(format_result(res, "json")) == [
        {"id": "a", "toks": [1, 2], "note": None},
        {"id": "b,c", "toks": [], "note": "[red]x[/red]"},
    ]
    table = format_result(res, "table")
    assert "id" in table and "b,c" in table and "[red]x[/red]" in table and "NULL" in table
    with pytest.raises(StoreError, match="unknown output format"):
        format_result(res, "xml")


def test_latest_store_and_store_for_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path))
    assert latest_store(tmp_path) is None
    old = tmp_path / "runs" / "old" / "store.duckdb"
    new = tmp_path / "stores" / "proxy.duckdb"
    for i, p in enumerate([old, new]):
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x")
        os.utime(p, (1_000_000 + i * 100, 1_000_000 + i * 100))
    assert latest_store(tmp_path) == new
    os.utime(old, (2_000_000, 2_000_000))
    assert latest_store(tmp_path) == old
    assert store_for_run("abc") == tmp_path / "runs" / "abc" / "store.duckdb"


def test_close_is_idempotent_and_refuses_writes(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "s.duckdb")
    s.record_call(call_row(1))
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.record_call(call_row(2))
    ro = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    assert ro.execute("SELECT count(*) FROM calls").fetchone() == (1,)
    ro.close()


def test_upsert_inserts_a_missing_key_once(store: Store) -> None:
    store.upsert_rollout({"rollout_id": "ro9"})  # key only: an insert, then nothing
    store.upsert_rollout({"rollout_id": "ro9"})
    store.upsert_rollout({"rollout_id": "ro8", "status": "running"})  # an update that matches nothing inserts
    store.upsert_rollout({"rollout_id": "ro8", "reward": 0.5})
    store.flush()
    rows = store.cursor().execute("SELECT rollout_id, status, reward FROM rollouts ORDER BY rollout_id").fetchall()
    assert rows == [("ro8", "running", 0.5), ("ro9", None, None)]


def assert_folded_in(path, caplog, sql: str, rows: list[tuple]) -> None:
    """The closed store has no WAL left, logged no checkpoint trouble, and reads `rows` for `sql`."""
    assert not path.with_name(path.name + ".wal").exists()
    assert "checkpoint" not in caplog.text.lower()
    con = duckdb.connect(str(path), read_only=True)
    try:
        assert con.execute(sql).fetchall() == rows
    finally:
        con.close()


def test_close_checkpoints_even_with_a_reader_transaction_open(tmp_path, caplog):
    """A cursor left inside a transaction must not stop close from folding the WAL into the file."""
    store = Store.open(tmp_path / "s.duckdb")
    store.insert_run("r", {})
    store.flush()
    cur = store.cursor()
    cur.execute("BEGIN TRANSACTION")
    assert cur.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]
    store.close()
    assert_folded_in(tmp_path / "s.duckdb", caplog, "SELECT run_id FROM runs", [("r",)])


@pytest.mark.timeout(60)  # before cursors were closed on close, FORCE CHECKPOINT spun here for minutes
def test_close_with_a_reader_result_open_and_a_later_write(tmp_path, caplog):
    """A cursor holding a fetched-from result while the writer commits again: close still folds the WAL in."""
    store = Store.open(tmp_path / "s.duckdb")
    store.insert_run("r", {})
    store.upsert_rollout({"rollout_id": "a", "run_id": "r", "status": "done"})
    store.flush()
    cur = store.cursor().execute("SELECT rollout_id, status FROM rollouts WHERE rollout_id = ?", ["a"])
    assert cur.fetchone() == ("a", "done")
    store.update_run_status("r", "failed")
    store.close()
    assert_folded_in(tmp_path / "s.duckdb", caplog, "SELECT status FROM runs", [("failed",)])


def test_close_while_readers_keep_asking_for_cursors(tmp_path):
    """Live-query threads hand themselves cursors while the store closes: close never meets a busy connection,
    and a reader after it gets a StoreError, not a crash."""
    import threading

    for round_ in range(5):
        store = Store.open(tmp_path / f"s{round_}.duckdb")
        store.insert_run("r", {})
        store.flush()
        stop = threading.Event()
        unexpected: list[BaseException] = []

        def read(store: Store, stop: threading.Event, unexpected: list[BaseException]) -> None:
            while not stop.is_set():
                try:
                    store.cursor().execute("SELECT count(*) FROM runs").fetchall()
                except (StoreError, duckdb.Error):
                    pass  # closed (or closing) under it: an answer, not a crash
                except BaseException as exc:  # noqa: BLE001
                    unexpected.append(exc)
                    return

        readers = [threading.Thread(target=read, args=(store, stop, unexpected)) for _ in range(4)]
        for t in readers:
            t.start()
        try:
            store.close()  # raised "connection is busy with another call" when a cursor was being handed out
        finally:
            stop.set()
            for t in readers:
                t.join()
        assert unexpected == []
        with pytest.raises(StoreError, match="closed"):
            store.cursor()


def test_set_meta_writes_replaces_and_removes_one_key_after_the_queue(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.duckdb")
    try:
        store.insert_run("r1", {"a": 1})  # queued before: committed first
        store.set_meta("failure:r1", "boom")
        store.set_meta("failure:r1", "boom again")  # one row per key, the newer value
        rows = store.cursor().execute("SELECT value FROM meta WHERE key = 'failure:r1'").fetchall()
        assert rows == [("boom again",)]
        assert store.cursor().execute("SELECT count(*) FROM runs WHERE run_id = 'r1'").fetchone() == (1,)
        store.set_meta("failure:r1", None)
        assert store.cursor().execute("SELECT count(*) FROM meta WHERE key = 'failure:r1'").fetchone() == (0,)
        assert store.cursor().execute("SELECT count(*) FROM meta WHERE key = 'schema_version'").fetchone() == (1,)
    finally:
        store.close()
