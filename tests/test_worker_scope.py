"""Several processes of one run (veRL agent-loop workers): each one's exit or death removes its own sandboxes only.

Real engine, real containers: two workers' sandboxes of one run, one worker dead (its pid file names a
process that exited), the other alive; the reaper removes the dead worker's sandbox and pid file and
leaves the live sibling's. A worker's session writes its pid file in its shard folder and labels its
sandboxes with its own scope.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from core.rollout.orphans import PID_FILE, dead_runs, reap_dead_runs, write_pid_file
from core.runtime import labels as L
from core.store.query import SHARDS_DIR

pytestmark = pytest.mark.docker


def _sandbox(client, image: str, scope: str, rollout: str):
    return client.containers.run(image, ["sleep", "600"], detach=True, network_mode="none", labels=L.sandbox_labels(scope, rollout, L.default_owner()))


def test_a_dead_worker_loses_its_sandboxes_and_its_live_sibling_keeps_them(docker_client, base_image, tmp_path: Path) -> None:
    from core.runtime.docker.runtime import DockerRuntime

    run_id = f"test-{uuid.uuid4().hex[:10]}"
    root = tmp_path / "runs"
    dead_dir, live_dir = root / run_id / SHARDS_DIR / "w-dead", root / run_id / SHARDS_DIR / "w-live"
    for d in (dead_dir, live_dir):
        d.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    write_pid_file(live_dir, f"{run_id}@w-live")
    info = json.loads((live_dir / PID_FILE).read_text())
    (dead_dir / PID_FILE).write_text(json.dumps({**info, "pid": int(gone.stdout), "started": None, "scope": f"{run_id}@w-dead"}))
    dead_box = _sandbox(docker_client, base_image, f"{run_id}@w-dead", "a")
    live_box = _sandbox(docker_client, base_image, f"{run_id}@w-live", "b")
    try:
        assert dead_runs(root) == [f"{run_id}@w-dead"]
        removed = asyncio.run(reap_dead_runs(DockerRuntime(), root))
        assert removed >= 1
        alive = {c.id for c in docker_client.containers.list(all=True, filters={"label": f"{L.MANAGED}=true"})}
        assert dead_box.id not in alive and live_box.id in alive  # the sibling's rollout goes on
        assert not (dead_dir / PID_FILE).exists() and (live_dir / PID_FILE).exists()
    finally:
        for box in (dead_box, live_box):
            try:
                box.remove(force=True)
            except Exception:  # noqa: BLE001 - already removed
                pass


def test_a_worker_session_has_its_own_pid_file_and_sandbox_scope(tmp_path: Path, monkeypatch) -> None:
    from core.config import load_config
    from core.session import RunSession

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    config = load_config(None, ["runtime.kind=local", "env.name=toy", "harness.name=noop"])
    seen: dict[str, object] = {}

    async def open_and_close() -> Path:
        async with RunSession(config, run_id="r1", worker="w7") as session:
            assert session.ctx is not None
            seen["ctx_scope"] = session.ctx.sandbox_scope
            seen["pid"] = json.loads((session.pid_dir / PID_FILE).read_text())
            seen["run_pid_file"] = (session.run_dir / PID_FILE).exists()
            return session.pid_dir

    pid_dir = asyncio.run(open_and_close())
    assert seen["ctx_scope"] == "r1@w7" and seen["pid"]["scope"] == "r1@w7"  # type: ignore[index]
    assert pid_dir.name == "w7" and pid_dir.parent.name == SHARDS_DIR and seen["run_pid_file"] is False
    assert not (pid_dir / PID_FILE).exists()  # removed on close
