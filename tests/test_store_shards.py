"""`forgetui sql --run RUN_ID` over a veRL run's store shards (one per agent-loop worker), read as one.

A shard whose worker still writes is held by that process (DuckDB refuses even read-only opens): the tests
keep one open in a real child process, with its live endpoint, and read the run while it writes.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from core.errors import StoreError
from core.store.query import run_shards
from core.store.shard_query import run_query_shards
from core.store.sidecar import read_sidecar
from core.store.writer import Store
from forgetui.cli import main

REPO = Path(__file__).resolve().parents[1]
# a veRL worker in miniature: holds its shard as the one writer, serves live queries, writes more on request
LIVE_WRITER = """
import sys
from core.store.writer import Store

path, run_id, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = Store.open(path)
store.insert_run(run_id, {"worker": "live"})
written = 0

def add(n):
    global written
    for _ in range(n):
        rid = f"live/{written}"
        store.upsert_rollout({"rollout_id": rid, "run_id": run_id, "task_id": "hello", "status": "done", "reward": 0.25,
                              "passed": written % 2 == 0, "started_at": 1.7e9 + written, "meta": {"n": written}})
        store.record_call({"call_id": f"{rid}#0", "rollout_id": rid, "seq": 0, "request": {"messages": [{"role": "user", "content": "hi, 'you'"}]},
                           "completion_token_ids": [written, written + 1], "completion_logprobs": [-0.5, float("nan")]})
        written += 1
    store.flush()

add(2)
store.record_blob({"sha256": "ab12", "media_type": "image/png", "bytes": 3, "data": bytes([0, 255, 120])})
store.flush()
store.serve_queries(max_rows=cap)
print("ready", flush=True)
for line in sys.stdin:
    add(int(line))
    print("ok", flush=True)
store.close()
"""


def make_shard(run_dir: Path, name: str, rewards: list[float]) -> Path:
    path = run_dir / "shards" / name / "store.duckdb"
    path.parent.mkdir(parents=True)
    store = Store.open(path)
    store.insert_run(run_dir.name, {"worker": name})
    for i, reward in enumerate(rewards):
        store.upsert_rollout({"rollout_id": f"{name}/{i}", "run_id": run_dir.name, "task_id": "hello", "status": "done", "reward": reward})
    store.close()
    return path


@pytest.fixture
def sharded_run() -> tuple[str, list[Path]]:
    run_id = f"shards-{os.getpid()}-{os.urandom(3).hex()}"
    run_dir = Path(os.environ["FORGETUI_HOME"]) / "runs" / run_id
    shards = [make_shard(run_dir, "worker-a", [1.0, 0.0]), make_shard(run_dir, "worker-b", [1.0])]
    return run_id, shards


def test_run_shards_are_found_in_name_order(sharded_run) -> None:
    run_id, shards = sharded_run
    assert run_shards(run_id) == shards
    assert run_shards("no-such-run") == []


def test_sql_run_reads_every_shard_as_one_store(sharded_run, capsys) -> None:
    run_id, _ = sharded_run
    sql = "SELECT count(*) AS n, sum(reward) AS r, count(DISTINCT r.run_id) AS runs FROM rollouts r JOIN runs USING (run_id)"
    assert main(["sql", sql, "--run", run_id, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 3, "r": 2.0, "runs": 1}]  # one runs row per run, though every worker wrote one


def test_shard_queries_stay_read_only(sharded_run) -> None:
    _, shards = sharded_run
    with pytest.raises(StoreError, match="read-only"):
        run_query_shards(shards, "DELETE FROM rollouts")
    with pytest.raises(StoreError):
        run_query_shards(shards, "SELECT 1; ATTACH 'x.duckdb' AS x")
    assert run_query_shards(shards, "SELECT count(*) FROM rollouts").rows == [[3]]


def test_a_held_shard_without_a_live_endpoint_is_named(sharded_run, caplog) -> None:
    run_id, shards = sharded_run
    holder = "import sys, time, duckdb; con = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", holder, str(shards[0])], stdout=subprocess.PIPE, text=True)  # a writer with no endpoint
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match="no live query endpoint") as err:
            run_query_shards(shards, "SELECT count(*) FROM rollouts", lock_wait_s=0.2)
        assert f"store {shards[0]} is held by a running writer process that serves no live query endpoint" in str(err.value)
        assert main(["sql", "SELECT count(*) FROM rollouts", "--run", run_id]) == 2
        assert f"store {shards[0]} is held by a running writer process that serves no live" in caplog.text
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def live_writer(sharded_run):
    """Start a child process that holds runs/<id>/shards/worker-c/store.duckdb open as its writer; (path, add(n))."""
    run_id, _ = sharded_run
    procs = []

    def start(cap: int = 100_000) -> tuple[Path, object]:
        path = Path(os.environ["FORGETUI_HOME"]) / "runs" / run_id / "shards" / "worker-c" / "store.duckdb"
        path.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(path), run_id, str(cap)], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"

        def add(n: int) -> None:
            proc.stdin.write(f"{n}\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "ok"

        return path, add

    yield start
    for proc in procs:
        proc.stdin.close()  # the writer closes its store and exits
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sql_json(capsys, run_id: str, sql: str) -> list[dict]:
    assert main(["sql", sql, "--run", run_id, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sql_run_reads_a_live_shard_with_the_closed_ones(sharded_run, live_writer, capsys) -> None:
    run_id, shards = sharded_run
    path, add = live_writer()
    with pytest.raises(duckdb.Error):  # the child really holds it: no reader may open the file
        duckdb.connect(str(path), read_only=True)
    assert read_sidecar(path) is not None
    sql = "SELECT count(*) AS n, sum(reward) AS r, count(DISTINCT r.run_id) AS runs FROM rollouts r JOIN runs USING (run_id)"
    assert sql_json(capsys, run_id, sql) == [{"n": 5, "r": 2.5, "runs": 1}]  # 2 + 1 closed, 2 live; one runs row of 3 workers'
    everything = [*shards, path]
    ids = run_query_shards(everything, "SELECT rollout_id FROM rollouts ORDER BY rollout_id").rows
    assert ids == [["live/0"], ["live/1"], ["worker-a/0"], ["worker-a/1"], ["worker-b/0"]]
    per_reward = run_query_shards(everything, "SELECT reward, count(*), count(*) FILTER (WHERE passed) FROM rollouts GROUP BY 1 ORDER BY 1")
    assert per_reward.rows == [[0.0, 1, 0], [0.25, 2, 1], [1.0, 2, 0]]
    add(3)  # the worker writes on: the next read sees it
    assert sql_json(capsys, run_id, sql) == [{"n": 8, "r": 3.25, "runs": 1}]
    assert sql_json(capsys, run_id, "SELECT count(*) AS n FROM runs") == [{"n": 1}]


def test_live_rows_keep_their_types(sharded_run, live_writer) -> None:
    _, shards = sharded_run
    path, _ = live_writer()
    calls = run_query_shards([*shards, path], (
        "SELECT c.call_id, token_ids(c.completion_token_ids), c.completion_logprobs, c.request ->> '$.messages[0].content' AS said, "
        "r.meta ->> '$.n' AS n, r.started_at, r.passed FROM calls c JOIN rollouts r USING (rollout_id) ORDER BY c.call_id"))
    (a, b) = calls.rows
    assert a[:2] == ["live/0#0", [0, 1]] and a[2][0] == -0.5 and math.isnan(a[2][1])  # NaN survives the trip
    assert a[3:5] == ["hi, 'you'", "0"] and b[4] == "1"
    assert a[5] == dt.datetime(2023, 11, 14, 22, 13, 20) and (a[6], b[6]) is not None and [a[6], b[6]] == [True, False]
    assert run_query_shards([*shards, path], "SELECT data, bytes FROM blobs").rows == [[bytes([0, 255, 120]), 3]]
    assert calls.types[:3] == ["VARCHAR", "INTEGER[]", "DOUBLE[]"]


def test_only_the_tables_and_columns_a_query_reads_are_pulled(sharded_run, live_writer, caplog) -> None:
    _, shards = sharded_run
    path, _ = live_writer()
    with caplog.at_level(logging.DEBUG, logger="core.store.shard_query"):
        assert run_query_shards([*shards, path], "SELECT count(*) FROM rollouts WHERE reward > 0.1").rows == [[4]]
    pulled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pulled")]
    assert pulled == [f"pulled 2 rollouts rows (1 columns) from the live store {path}"]  # reward only; no calls, no runs
    star = run_query_shards([*shards, path], "SELECT * FROM rollouts WHERE rollout_id = 'live/1'")
    assert star.columns == run_query_shards(shards, "SELECT * FROM rollouts").columns and star.rows[0][0] == "live/1"
    excluded = run_query_shards([*shards, path], "SELECT * EXCLUDE (meta, reward) FROM rollouts WHERE reward < 0.5 ORDER BY rollout_id")
    assert [r[0] for r in excluded.rows] == ["live/0", "live/1", "worker-a/1"] and "reward" not in excluded.columns
    assert run_query_shards([*shards, path], "SELECT count(*) FROM (SELECT * FROM rollouts)").rows == [[5]]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="core.store.shard_query"):  # folded away by the planner, yet bound: every column then
        assert run_query_shards([*shards, path], "SELECT count(*) FROM rollouts WHERE reward IS NULL OR true").rows == [[5]]
    assert "reading every column of rollouts" in caplog.text


def test_a_live_table_past_the_endpoint_row_cap_is_refused(sharded_run, live_writer) -> None:
    _, shards = sharded_run
    path, add = live_writer(cap=3)
    assert run_query_shards([*shards, path], "SELECT count(*) FROM rollouts").rows == [[5]]  # 2 live rows: under the cap
    add(2)
    with pytest.raises(StoreError, match=r"table rollouts has more than 3 rows.*--store"):
        run_query_shards([*shards, path], "SELECT count(*) FROM rollouts")
    assert run_query_shards([*shards, path], "SELECT count(*) FROM runs").rows == [[1]]  # a small table still reads


def test_a_store_this_process_writes_reads_through_its_endpoint(sharded_run) -> None:
    run_id, shards = sharded_run
    path = shards[0].parent.parent / "worker-here" / "store.duckdb"
    store = Store.open(path)
    try:
        store.upsert_rollout({"rollout_id": "here/0", "run_id": run_id, "status": "done", "reward": 0.5})
        store.flush()
        store.serve_queries()
        assert run_query_shards([*shards, path], "SELECT count(*), sum(reward) FROM rollouts").rows == [[4, 2.5]]
    finally:
        store.close()


def test_the_tui_reads_a_run_whose_worker_still_writes(sharded_run, live_writer) -> None:
    from forgetui.tui.source import RunSource

    run_id, shards = sharded_run
    path, add = live_writer()
    run_dir = shards[0].parents[2]
    (info,) = RunSource(run_dir).run_infos()  # the Runs list's line
    assert info.reason is None and info.live and info.shards == 3
    assert (info.total, info.done, info.passed, info.mean_reward) == (5, 5, 1, 0.5)  # (1 + 0 + 1 + 0.25 + 0.25) / 5
    add(1)
    detail = RunSource(run_dir).run_detail()  # the Run screen
    assert len(detail.rollouts) == 6 and detail.n_calls == 3
    assert {r.rollout_id: r.tokens for r in detail.rollouts if r.rollout_id.startswith("live/")} == {"live/0": 2, "live/1": 2, "live/2": 2}
    rollout = RunSource(run_dir).rollout("live/2", decode=False)  # the Rollout screen
    assert [c["completion_token_ids"] for c in rollout.calls] == [[2, 3]] and json.loads(rollout.calls[0]["request"])["messages"]
