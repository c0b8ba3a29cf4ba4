"""Orphaned sandboxes: every run leaves a pid file; sandboxes of runs whose process is gone are removed by label.

A run's pid file is ``runs/<run_id>/pid.json``. A process that runs only part of a run beside others
(a veRL agent-loop worker) labels its sandboxes with a scope of its own and keeps its pid file in its
shard folder, ``runs/<run_id>/shards/<shard>/pid.json``, naming that scope: one worker's exit or death
then removes its own sandboxes only, never its siblings'.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from core.paths import runs_dir
from core.runtime.base import Runtime
from core.runtime.labels import default_owner
from core.store.query import SHARDS_DIR
from core.store.sidecar import pid_alive, process_start

log = logging.getLogger(__name__)
PID_FILE = "pid.json"


def write_pid_file(run_dir: Path, scope: str | None = None) -> None:
    """This process's pid file in `run_dir`; `scope` is the run label its sandboxes carry (default: the folder's name)."""
    info: dict[str, object] = {"pid": os.getpid(), "host": socket.gethostname(), "started": process_start(os.getpid())}
    if scope is not None:
        info["scope"] = scope
    (run_dir / PID_FILE).write_text(json.dumps(info))


def remove_pid_file(run_dir: Path) -> None:
    (run_dir / PID_FILE).unlink(missing_ok=True)


def _pid_files(root: Path) -> list[Path]:
    return sorted([*root.glob(f"*/{PID_FILE}"), *root.glob(f"*/{SHARDS_DIR}/*/{PID_FILE}")])


def _scope(pid_file: Path, info: dict) -> str:
    scope = info.get("scope")
    return scope if isinstance(scope, str) and scope else pid_file.parent.name


def dead_scopes(root: Path | None = None) -> list[tuple[str, Path]]:
    """(sandbox scope, pid file) of each run or worker on this host whose process died without cleaning up."""
    root = root or runs_dir()
    dead = []
    for pid_file in _pid_files(root):
        try:
            info = json.loads(pid_file.read_text())
        except (OSError, json.JSONDecodeError):
            dead.append((pid_file.parent.name, pid_file))  # unreadable: only a run's own folder names a scope then
            continue
        started = info.get("started")
        if info.get("host") == socket.gethostname() and not pid_alive(int(info.get("pid", 0)), started if isinstance(started, int) else None):
            dead.append((_scope(pid_file, info), pid_file))
    return dead


def dead_runs(root: Path | None = None) -> list[str]:
    """Runs (or workers' scopes) on this host whose process died without cleaning up (kill -9, power loss)."""
    return [scope for scope, _ in dead_scopes(root)]


async def reap_dead_runs(runtime: Runtime, root: Path | None = None, *, everything: bool = False) -> int:
    """Remove this owner's stopped sandboxes and the sandboxes of dead runs (or, with `everything`, every one of this owner's).

    Stopped ones go whichever run (or FORGETUI_HOME) made them: no run can still be using one.
    """
    root = root or runs_dir()
    owner = default_owner()
    removed = await runtime.reap(owner=owner, stopped=True)
    if everything:
        removed += await runtime.reap(owner=owner)
    for scope, pid_file in dead_scopes(root):
        count = await runtime.reap(run_id=scope)
        if count:
            log.info("removed %d orphaned sandbox(es) of dead run %s", count, scope)
        removed += count
        pid_file.unlink(missing_ok=True)
    return removed
