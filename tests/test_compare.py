"""`forgetui compare` and `forgetui analyze` on two crafted runs whose pass counts are set per task."""

from __future__ import annotations

import json

import pytest

from core.analytics.compare import compare_runs
from core.analytics.metrics import behaviour_table, display_rows
from core.analytics.stats import bootstrap_mean, paired_bootstrap
from core.store.writer import Store
from forgetui.cli import main

# task → (passes in A, passes in B) out of 4 samples each
PASSES = {"t1": (4, 4), "t2": (0, 3), "t3": (3, 1), "t4": (1, 1)}


def write_run(path, run_id: str, side: int, extra_task: str) -> str:
    store = Store.open(path)
    store.insert_run(run_id, {"policy": {"backend": f"builtin:model-{run_id}"}})
    tasks = {**PASSES, extra_task: (2, 2)}
    for task, passes in tasks.items():
        for i in range(4):
            passed = i < passes[side]
            store.upsert_rollout({"rollout_id": f"{run_id}/{task}/{i}", "run_id": run_id, "env": "toy", "task_id": task, "harness": "react",
                                  "sample_index": i, "step": 0, "status": "done", "passed": passed, "reward": 1.0 if passed else 0.2, "attempt": 0})  # fmt: skip
    # an infrastructure error is no outcome: it must not count anywhere
    store.upsert_rollout({"rollout_id": f"{run_id}/t1/9", "run_id": run_id, "env": "toy", "task_id": "t1", "harness": "react", "status": "infra_error", "attempt": 0})
    store.close()
    return str(path)


@pytest.fixture
def runs(tmp_path):
    return write_run(tmp_path / "a.duckdb", "A", 0, "only-a"), write_run(tmp_path / "b.duckdb", "B", 1, "only-b")


def test_per_task_flips_and_pass_k(runs):
    result = compare_runs(*runs)
    tasks = {t["task"]: t for t in result["tasks"]}
    assert set(tasks) == {"toy:t1", "toy:t2", "toy:t3", "toy:t4"}
    assert result["only_a"] == ["toy:only-a"] and result["only_b"] == ["toy:only-b"]
    assert (tasks["toy:t1"]["a"]["n"], tasks["toy:t1"]["a"]["passed"]) == (4, 4)  # the infra error left out
    assert tasks["toy:t2"]["delta_pass_rate"] == 0.75 and tasks["toy:t2"]["delta_reward"] == pytest.approx(0.75 * 0.8)
    assert {t["task"]: t["flip"] for t in result["flipped"]} == {"toy:t2": "fixed", "toy:t3": "broken"}
    pk = {row["metric"]: row for row in result["pass_k"]}
    assert set(pk) == {f"pass{s}{k}" for s in "@^" for k in range(1, 5)}
    assert pk["pass@1"]["a"]["value"] == 0.5 and pk["pass@1"]["b"]["value"] == 0.5625
    assert pk["pass@1"]["delta"]["value"] == pytest.approx(0.0625)
    assert pk["pass^2"]["a"]["value"] == pytest.approx(0.375) == pk["pass^2"]["b"]["value"]
    assert pk["pass@4"]["a"]["value"] == 0.75 and pk["pass@4"]["b"]["value"] == 1.0
    for row in pk.values():  # n = 4 tasks: an interval around every estimate
        for side in ("a", "b", "delta"):
            assert row[side]["n"] == 4 and row[side]["low"] <= row[side]["value"] + 1e-12 <= row[side]["high"] + 2e-12
    metrics = {m["metric"]: m for m in result["metrics"]}
    assert metrics["pass_rate"]["delta"]["value"] == pytest.approx(0.0625)
    assert compare_runs(*runs) == result  # seeded: the same data gives the same intervals


def test_paired_bootstrap_interval_is_narrower_than_unpaired_for_correlated_tasks():
    a = {f"t{i}": [float(i)] for i in range(20)}
    b = {k: [v[0] + 1.0] for k, v in a.items()}  # B = A + 1 on every task: the difference has no spread
    est = paired_bootstrap(a, b, lambda xs: xs[0])
    assert est["delta"].value == 1.0 and est["delta"].low == est["delta"].high == 1.0
    assert est["a"].high - est["a"].low > 2.0
    assert bootstrap_mean([1.0]).low is None and bootstrap_mean([]).value is None


def test_cli_compare_and_analyze(runs, tmp_path, capsys):
    assert main(["compare", *runs, "--format", "json", "-k", "1,2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [row["metric"] for row in data["pass_k"]] == ["pass@1", "pass^1", "pass@2", "pass^2"]
    assert main(["compare", *runs]) == 0
    text = capsys.readouterr().out
    assert "toy:t2" in text and "fixed" in text and "pass@1" in text and "flipped: 2" in text
    plot = tmp_path / "behaviour.png"
    assert main(["analyze", *runs, "--format", "json", "--plot", str(plot)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [g["model"] for g in data["groups"]] == ["builtin:model-A", "builtin:model-B"]
    assert data["groups"][0]["rollouts"] == 20 and data["groups"][0]["pass_rate"]["value"] == pytest.approx(10 / 20)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["analyze", *runs, "--by", "model"]) == 0
    assert "pass rate" in capsys.readouterr().out
    header, rows = display_rows(behaviour_table(runs, by="model"), by="model")  # what the TUI's run screen shows
    assert header[1:] == ["toy · builtin:model-A (n=20)", "toy · builtin:model-B (n=20)"]
    assert rows[0][0] == "pass rate" and rows[0][1].startswith("0.50 [")


def test_a_sharded_run_reads_as_one(runs, tmp_path, monkeypatch):
    """A veRL run's worker shards give the same analysis as the one store holding all their rollouts."""
    home = tmp_path / "home"
    monkeypatch.setenv("FORGETUI_HOME", str(home))
    whole = write_run(tmp_path / "whole.duckdb", "S", 1, "only-a")
    for name in ("worker-a", "worker-b"):
        path = home / "runs" / "S" / "shards" / name / "store.duckdb"
        path.parent.mkdir(parents=True)
        write_run(path, "S", 1, "only-a")
    # each worker kept half of the rollouts (the infra error, sample_index NULL, stays with worker-b)
    import duckdb

    for name, dropped in (("worker-a", "coalesce(sample_index, 9) >= 2"), ("worker-b", "sample_index < 2")):
        con = duckdb.connect(str(home / "runs" / "S" / "shards" / name / "store.duckdb"))
        con.execute(f"DELETE FROM rollouts WHERE {dropped}")
        con.close()
    sharded, single = behaviour_table(["S"]), behaviour_table([whole])
    assert sharded[0]["rollouts"] == single[0]["rollouts"] == 20
    assert sharded[0]["pass_rate"] == single[0]["pass_rate"]
    assert sharded[0]["reward"] == single[0]["reward"]


def test_a_run_is_a_run_id_a_run_folder_or_a_store_file(runs, tmp_path, monkeypatch):
    from core.errors import ConfigError
    from core.store.locate import stores_of

    home = tmp_path / "home"
    monkeypatch.setenv("FORGETUI_HOME", str(home))
    run_dir = home / "runs" / "R"
    run_dir.mkdir(parents=True)
    write_run(run_dir / "store.duckdb", "R", 0, "only-a")
    by_id, by_dir, by_file = behaviour_table(["R"]), behaviour_table([run_dir]), behaviour_table([run_dir / "store.duckdb"])
    assert by_id == by_dir == by_file and by_id[0]["rollouts"] == 20
    assert stores_of(run_dir) == [run_dir / "store.duckdb"]
    with pytest.raises(ConfigError, match="no run 'nope'"):
        stores_of("nope")
