"""`forgetui sql --run RUN_ID` over a veRL run's store shards (one per agent-loop worker), read as one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import StoreError
from core.store.query import run_query_shards, run_shards
from core.store.writer import Store
from forgetui.cli import main


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


def test_a_shard_held_by_a_live_writer_is_named(sharded_run) -> None:
    _, shards = sharded_run
    holder = "import sys, time, duckdb; con = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", holder, str(shards[0])], stdout=subprocess.PIPE, text=True)  # a running worker
    try:
        assert proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match="--store"):
            run_query_shards(shards, "SELECT 1")
    finally:
        proc.kill()
        proc.wait()
