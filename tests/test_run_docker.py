"""The orchestrator for real: runs in Docker containers, timeouts, lost sandboxes, Ctrl-C, kill -9 + gc, resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.config import load_config
from core.errors import ModelError
from core.paths import runs_dir
from core.run import execute_run
from core.status import Status

pytestmark = pytest.mark.docker
SOLVE_HELLO = "if [ {task} = hello ]; then echo hi > hello.txt; fi"
LABEL = "forgetui.run"


def config(**sets: object):
    overrides = [f"{k}={json.dumps(v) if isinstance(v, str | list) else v}" for k, v in sets.items()]
    return load_config(None, ["runtime.kind=docker", "policy.backend=builtin:tiny", *overrides])


def containers_of(client, run_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{LABEL}={run_id}"})


def rows(store: str, sql: str) -> list[tuple]:
    import duckdb

    con = duckdb.connect(store, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_six_tasks_two_samples_in_docker(docker_client, base_image):
    cfg = config(**{"env.name": "toy", "env.limit": 6, "harness.name": "tests.harness_fixtures:ShellHarness", "run.n_samples": 2, "run.concurrency": 3})
    cfg.harness.options = {"command": SOLVE_HELLO}
    summary = asyncio.run(execute_run(cfg))
    assert summary.rollouts == 12 and summary.infra_errors == 0 and summary.timeouts == 0
    assert summary.extra["max_concurrent_sandboxes"] == 3
    got = rows(summary.store, "SELECT task_id, sample_index, status, reward, passed, env, harness, started_at < ended_at, image_digest, task_hash FROM rollouts ORDER BY task_id, sample_index")
    assert len(got) == 12 and {r[2] for r in got} == {"done"}
    for task_id, _, _, reward, passed, env, harness, ordered, image, task_hash in got:
        assert env == "toy" and harness == "test-shell" and ordered and image.startswith("forgetui/") and task_hash
        assert passed == (task_id == "hello") and (reward == 1.0) == (task_id == "hello")
    assert summary.passed == 2 and summary.failed == 10
    assert summary.pass_at_k["1"] == pytest.approx(1 / 6) and set(summary.pass_hat_k) == {"1", "2"}
    assert containers_of(docker_client, summary.run_id) == []


def test_hanging_harness_times_out_and_others_pass(docker_client, base_image):
    cfg = config(**{"env.name": "toy", "env.tasks": ["hello"], "harness.name": "tests.harness_fixtures:HangingHarness", "run.n_samples": 2, "run.timeout_s": 3})
    cfg.harness.options = {"hang_on": "hello"}
    summary = asyncio.run(execute_run(cfg))
    assert summary.timeouts == 2 and summary.passed == 0 and summary.infra_errors == 0
    got = rows(summary.store, "SELECT status, reward, passed, error FROM rollouts")
    assert all(r[0] == "timeout" and r[1] == 0.0 and r[2] is False and "wall clock" in r[3] for r in got)
    assert containers_of(docker_client, summary.run_id) == []


def test_sandbox_killed_from_outside_is_infra_error_then_retried(docker_client, base_image, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FORGETUI_HOME", str(home))  # our run is the only one under this home
    cfg = config(**{"env.name": "toy", "env.tasks": ["hello"], "harness.name": "tests.harness_fixtures:ShellHarness", "run.max_retries": 2})
    cfg.harness.options = {"command": "sleep 4; echo hi > hello.txt"}
    killed: list[str] = []

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            runs = [d.name for d in (home / "runs").glob("*")]
            for c in docker_client.containers.list(filters={"label": f"{LABEL}={runs[0]}"}) if runs else []:
                if c.labels.get("forgetui.rollout", "").endswith("/hello/0") and c.labels.get("forgetui.role") != "network":
                    time.sleep(1.0)
                    c.kill()
                    killed.append(c.labels[LABEL])
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=killer)
    thread.start()
    summary = asyncio.run(execute_run(cfg))
    thread.join()
    assert killed, "the test never saw the sandbox to kill"
    ((status, attempt, passed),) = rows(summary.store, "SELECT status, attempt, passed FROM rollouts")
    assert status == "done" and attempt == 1 and passed is True
    assert summary.infra_errors == 0 and summary.passed == 1


def test_infra_errors_exhaust_retries_and_are_excluded(tmp_path, docker_client, base_image):
    cfg = config(**{"env.name": "toy", "env.tasks": ["hello"], "harness.name": "tests.harness_fixtures:ShellHarness", "run.max_retries": 1})
    cfg.runtime.base_image = "forgetui/base:bookworm"
    cfg.env.options = {}
    cfg.harness.options = {"command": "echo hi > hello.txt"}
    cfg.runtime.memory = "1g"
    cfg.runtime.workdir = "/workspace"
    cfg.proxy.public_url = None
    # a setup step that always fails is an infrastructure error (the task's workspace cannot be built)
    from envs.toy import ToyEnv

    class BrokenSetup(ToyEnv):
        def tasks(self):
            tasks = super().tasks()
            for t in tasks:
                t.setup = "exit 7"
            return tasks

    import core.session.run_session as run_mod

    real = run_mod.load_env
    run_mod.load_env = lambda name, **kw: BrokenSetup(**kw)
    try:
        summary = asyncio.run(execute_run(cfg))
    finally:
        run_mod.load_env = real
    assert summary.infra_errors == 1 and summary.pass_at_k == {} and summary.mean_reward is None
    ((status, attempt, error),) = rows(summary.store, "SELECT status, attempt, error FROM rollouts")
    assert status == Status.INFRA_ERROR and attempt == 1 and "setup failed" in error


def _cli_run(tmp_path: Path, *extra: str, home: Path) -> subprocess.Popen:
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        '[env]\nname = "toy"\nlimit = 6\n[harness]\nname = "tests.harness_fixtures:ShellHarness"\n'
        '[harness.options]\ncommand = "sleep 2; echo hi > hello.txt"\n[runtime]\nkind = "docker"\n[policy]\nbackend = "builtin:tiny"\n'
        "[run]\nconcurrency = 2\n"
    )
    env = {**os.environ, "FORGETUI_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, "-m", "forgetui.cli", "run", str(cfg), "--no-ui", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_containers(client, home: Path, n: int = 1, timeout: float = 90) -> str:
    """The run id of the CLI run under `home` once `n` of its sandboxes are up (other runs may share the engine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run_dir in (home / "runs").glob("*"):
            if len(client.containers.list(filters={"label": f"{LABEL}={run_dir.name}"})) >= n:
                return run_dir.name
        time.sleep(0.1)
    raise AssertionError("no sandbox appeared")


def _wait_for_done(store: Path, n: int, timeout: float = 120) -> None:
    """Until `n` rollouts are done, read live through the running writer (`forgetui sql`'s path)."""
    from core.store.query import run_query

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run_query(store, "SELECT count(*) FROM rollouts WHERE status = 'done'").rows[0][0] >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} rollouts finished in {timeout:g} s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_run_leaves_no_containers_and_resume_finishes(tmp_path, docker_client, base_image, sig):
    home = tmp_path / "home"
    proc = _cli_run(tmp_path, home=home)
    run_id = _wait_for_containers(docker_client, home, 2)
    _wait_for_done(home / "runs" / run_id / "store.duckdb", 2)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 130
    assert containers_of(docker_client, run_id) == []
    store = str(home / "runs" / run_id / "store.duckdb")
    before = dict(rows(store, "SELECT rollout_id, status FROM rollouts"))
    done_before = {rid: st for rid, st in before.items() if st == "done"}
    started = dict(rows(store, "SELECT rollout_id, started_at FROM rollouts WHERE status = 'done'"))
    assert 0 < len(done_before) < 6 and rows(store, "SELECT status FROM runs") == [("interrupted",)]

    resumed = subprocess.run([sys.executable, "-m", "forgetui.cli", "run", "--resume", run_id, "--no-ui"], capture_output=True, text=True, env={**os.environ, "FORGETUI_HOME": str(home)}, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout)
    assert summary["run_id"] == run_id and summary["rollouts"] == 6 and summary["passed"] == 1 and summary["failed"] == 5
    after = dict(rows(store, "SELECT rollout_id, started_at FROM rollouts WHERE status = 'done'"))
    assert len(after) == 6 and all(after[rid] == started[rid] for rid in started)  # nothing redone
    assert containers_of(docker_client, run_id) == []


def test_kill_9_then_gc_leaves_nothing(tmp_path, docker_client, base_image):
    home = tmp_path / "home"
    proc = _cli_run(tmp_path, home=home)
    run_id = _wait_for_containers(docker_client, home, 2)
    proc.kill()
    proc.wait(timeout=30)
    assert containers_of(docker_client, run_id), "kill -9 should leave the sandboxes behind"
    gc = subprocess.run([sys.executable, "-m", "forgetui.cli", "gc", "--runtime", "docker"], capture_output=True, text=True, env={**os.environ, "FORGETUI_HOME": str(home)}, timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert int(gc.stdout.strip()) >= 2
    assert containers_of(docker_client, run_id) == []
    # the store of the killed run still opens and holds its rows
    assert rows(str(home / "runs" / run_id / "store.duckdb"), "SELECT count(*) FROM rollouts") == [(6,)]


def test_rollout_meta_keeps_task_meta_and_timings(docker_client, base_image):
    cfg = config(**{"env.name": "toy", "env.tasks": ["hello"], "harness.name": "tests.harness_fixtures:ShellHarness"})
    cfg.harness.options = {"command": "echo hi > hello.txt"}
    summary = asyncio.run(execute_run(cfg))
    ((meta,),) = rows(summary.store, "SELECT meta FROM rollouts")
    meta = json.loads(meta)
    assert meta["task_meta"]["family"] == "hello" or meta["task_meta"]
    assert set(meta["timings"]) == {"build_s", "sandbox_start_s", "harness_s", "verify_s"} and all(v >= 0 for v in meta["timings"].values())
    report = json.loads(Path(summary.extra["eval_json"]).read_text())
    assert report["groups"][0]["breakdown"]  # the eval report breaks down by the task's family/split


def test_a_policy_that_cannot_load_stops_the_run_with_its_error(docker_client, base_image, tmp_path, monkeypatch):
    """The policy loads while sandboxes start; when it fails, the run fails with that error and leaks nothing."""
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))  # its own runs folder: other runs may write the shared one
    cfg = config(**{"env.name": "toy", "env.limit": 4, "harness.name": "tests.harness_fixtures:ShellHarness", "policy.backend": f"builtin:{tmp_path}/no-model"})
    cfg.harness.options = {"command": "sleep 5"}
    before = set(runs_dir().glob("*"))
    with pytest.raises(ModelError, match="does not exist"):
        asyncio.run(execute_run(cfg))
    (run_dir,) = set(runs_dir().glob("*")) - before
    assert containers_of(docker_client, run_dir.name) == []
    assert rows(str(run_dir / "store.duckdb"), "SELECT status FROM runs") == [("failed",)]
