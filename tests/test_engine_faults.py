"""Faults during a run: the Docker engine restarts mid-run; a run is killed with -9 and gc runs at once.

The engine restart happens on a PRIVATE dockerd this test starts (its own data root, exec root, pid file,
unix socket and containerd namespace under a temp folder, in a network namespace of its own, no bridge,
no iptables changes), with the base image copied in by `save | load`. The shared engine at /var/run/docker.sock is never restarted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.config import load_config
from core.rollout.orphans import PID_FILE
from core.run import execute_run
from core.runtime import labels as L
from core.store.sidecar import process_state

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[1]
CALL_PROXY = (
    "import json, os, urllib.request; "
    "body = json.dumps({'model': 'policy', 'messages': [{'role': 'user', 'content': 'hi'}]}).encode(); "
    "req = urllib.request.Request(os.environ['FORGETUI_BASE_URL'] + '/v1/chat/completions', body, {'Content-Type': 'application/json'}); "
    "urllib.request.urlopen(req, timeout=30).read()"
)


class PrivateEngine:
    """A dockerd of this test's own: started, stopped and restarted without touching any other engine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sock = root / "docker.sock"
        self.url = f"unix://{self.sock}"
        self.proc: subprocess.Popen | None = None
        ns = f"forgetui-test-{uuid.uuid4().hex[:8]}"
        # its own network namespace (unshare -n): a dockerd without a bridge deletes the host's docker0 at
        # start-up, which would break the shared engine; in a namespace of its own it touches nothing outside
        self.argv = [
            "unshare", "--net", "--", "dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
            "--pidfile", str(root / "docker.pid"), "--host", self.url, "--bridge", "none",
            "--iptables=false", "--ip-masq=false", "--containerd-namespace", ns,
            "--containerd-plugins-namespace", f"{ns}-plugins",
        ]

    def start(self, timeout: float = 60) -> None:
        import docker

        log = open(self.root / "dockerd.log", "ab")  # noqa: SIM115 - the daemon keeps writing to it
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"private dockerd exited: {(self.root / 'dockerd.log').read_text()[-2000:]}")
            try:
                client = docker.DockerClient(base_url=self.url, timeout=5)
                answers = client.ping()
                client.close()
                if answers:
                    return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.2)
        raise AssertionError("private dockerd did not answer within 60 s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # only our own daemon, by its pid
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def client(self, timeout: int = 60) -> Any:
        import docker

        return docker.DockerClient(base_url=self.url, timeout=timeout)


@pytest.fixture(scope="module")
def private_engine(docker_client, base_image) -> Iterator[PrivateEngine]:
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("unshare") is None:
        pytest.skip("a private Docker engine needs root and dockerd")
    root = Path(tempfile.mkdtemp(prefix="fte-", dir="/tmp"))  # short: unix socket paths have a length limit
    engine = PrivateEngine(root)
    try:
        engine.start()
        # `save | load` of a 200 MB image: on a busy machine the shared engine takes more than the
        # clients' default 30 s to send the first byte, so both ends get a long read timeout here
        import docker

        shared, client = docker.from_env(timeout=600), engine.client(timeout=600)
        try:
            client.images.load(b"".join(shared.images.get(base_image).save(named=True)))
        finally:
            shared.close()
            client.close()
        yield engine
    finally:
        try:
            if engine.proc is not None:
                c = engine.client()
                for container in c.containers.list(all=True):
                    container.remove(force=True)
                c.close()
        finally:
            engine.stop()
            shutil.rmtree(root, ignore_errors=True)


def test_engine_restart_mid_run_loses_nothing(private_engine: PrivateEngine, tmp_path: Path, monkeypatch, script_file) -> None:
    monkeypatch.setenv("DOCKER_HOST", private_engine.url)
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    cfg = load_config(None, [
        "runtime.kind=docker", "env.name=toy", 'env.tasks="hello"', "run.n_samples=4", "run.concurrency=2", "run.max_retries=2",
        f'policy.backend="scripted:{script_file([{"text": "ok"}])}"',
        'harness.name="tests.harness_fixtures:ShellHarness"',
    ])
    cfg.harness.options = {"command": f'python3 -c "{CALL_PROXY}"; sleep 5; echo hi > hello.txt'}
    restarted: list[list[str]] = []
    client = private_engine.client()

    def restart_when_busy() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                busy = [c.labels[L.ROLLOUT] for c in client.containers.list(filters={"label": L.RUN})
                        if c.labels.get("forgetui.role") != "network"]
            except Exception:  # noqa: BLE001
                busy = []
            if busy:
                time.sleep(1.0)  # the harness has called the proxy and sleeps
                logging.warning("test: stopping the private engine (busy: %s)", busy)
                private_engine.stop()
                time.sleep(2.0)  # the engine is away for a while: retries must wait for it
                private_engine.start()
                logging.warning("test: the private engine answers again")
                restarted.append(busy)
                return
            time.sleep(0.1)

    thread = threading.Thread(target=restart_when_busy)
    thread.start()
    try:
        summary = asyncio.run(execute_run(cfg))
    finally:
        thread.join()
    assert restarted, "the engine was never restarted mid-run"
    import duckdb

    con = duckdb.connect(summary.store, read_only=True)
    rollouts = con.execute("SELECT rollout_id, status, passed, attempt FROM rollouts ORDER BY rollout_id").fetchall()
    calls = con.execute("SELECT rollout_id, attempt, status FROM calls ORDER BY rollout_id, attempt").fetchall()
    con.close()
    assert len(rollouts) == 4 and all(status == "done" and passed for _, status, passed, _ in rollouts), rollouts
    assert summary.infra_errors == 0 and summary.passed == 4
    retried = {rid for rid, *_rest, attempt in rollouts if attempt >= 1}
    assert retried, f"no rollout was retried after the restart (in flight: {restarted[0]})"
    # nothing lost: the last attempt of every rollout has its answered call in the store; a call cut off by
    # the restart is recorded as cancelled, never dropped or left half-written
    assert {(rid, attempt) for rid, _s, _p, attempt in rollouts} <= {(rid, attempt) for rid, attempt, st in calls if st == "ok"}
    assert {status for *_x, status in calls} <= {"ok", "cancelled"}, calls
    leftovers = private_engine.client().containers.list(all=True)
    assert leftovers == [], [c.name for c in leftovers]


RUN_THEN_HANG = """
import sys, time
from core.rollout.orphans import write_pid_file
from core.runtime.base import SandboxSpec
from core.runtime.docker.runtime import DockerRuntime
import asyncio, docker
from core.runtime import labels as L
run_dir, image, run_id = sys.argv[1], sys.argv[2], sys.argv[3]
from pathlib import Path
write_pid_file(Path(run_dir))
rt = DockerRuntime()
sb = rt.create(SandboxSpec(image=image, run_id=run_id, rollout_id="started"))
asyncio.run(sb.start())
# a second sandbox created but not yet started when the kill comes
rt.client.containers.create(image, ["sleep", "600"], labels=L.sandbox_labels(run_id, "created", L.default_owner()))
print("ready", flush=True)
time.sleep(600)
"""


def test_gc_right_after_kill_9_sees_through_a_zombie(docker_client, base_image, tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_id = f"test-{uuid.uuid4().hex[:10]}"
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    env = {**os.environ, "FORGETUI_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", RUN_THEN_HANG, str(run_dir), base_image, run_id],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        states = {c.labels[L.ROLLOUT]: c.status for c in docker_client.containers.list(all=True, filters={"label": f"{L.RUN}={run_id}"})}
        assert states == {"started": "running", "created": "created"}, states
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_state(proc.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(proc.pid) == "Z"  # dead, and not reaped: we are its parent and have not waited
        assert json.loads((run_dir / PID_FILE).read_text())["pid"] == proc.pid
        gc = subprocess.run([sys.executable, "-m", "forgetui.cli", "gc", "--runtime", "docker"],
                            capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
        assert gc.returncode == 0, gc.stderr
        assert int(gc.stdout.strip()) >= 2
        assert docker_client.containers.list(all=True, filters={"label": f"{L.RUN}={run_id}"}) == []
        assert not (run_dir / PID_FILE).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for c in docker_client.containers.list(all=True, filters={"label": f"{L.RUN}={run_id}"}):
            c.remove(force=True)


def test_a_reused_pid_is_not_the_run(tmp_path: Path) -> None:
    """A pid file whose pid now belongs to another process (started later) names a dead run."""
    from core.rollout.orphans import dead_runs
    from core.store.sidecar import process_start

    root = tmp_path / "runs"
    for name, started in (("mine", process_start(os.getpid())), ("reused", (process_start(os.getpid()) or 0) - 1), ("old", None)):
        (root / name).mkdir(parents=True)
        info = {"pid": os.getpid(), "host": os.uname().nodename}
        if started is not None:
            info["started"] = started
        (root / name / PID_FILE).write_text(json.dumps(info))
    assert dead_runs(root) == ["reused"]
