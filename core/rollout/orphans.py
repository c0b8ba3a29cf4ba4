"""Orphaned sandboxes: every run leaves a pid file; sandboxes of runs whose process is gone are removed by label."""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from core.paths import runs_dir
from core.runtime.base import Runtime
from core.runtime.labels import default_owner
from core.store.query import pid_alive, process_start

log = logging.getLogger(__name__)
PID_FILE = "pid.json"


def write_pid_file(run_dir: Path) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": process_start(os.getpid())}
    (run_dir / PID_FILE).write_text(json.dumps(info))


def remove_pid_file(run_dir: Path) -> None:
    (run_dir / PID_FILE).unlink(missing_ok=True)


def dead_runs(root: Path | None = None) -> list[str]:
    """Runs on this host whose process died without cleaning up (kill -9, power loss)."""
    root = root or runs_dir()
    dead = []
    for pid_file in sorted(root.glob(f"*/{PID_FILE}")):
        try:
            info = json.loads(pid_file.read_text())
        except (OSError, json.JSONDecodeError):
            dead.append(pid_file.parent.name)
            continue
        started = info.get("started")
        if info.get("host") == socket.gethostname() and not pid_alive(int(info.get("pid", 0)), started if isinstance(started, int) else None):
            dead.append(pid_file.parent.name)
    return dead


async def reap_dead_runs(runtime: Runtime, root: Path | None = None, *, everything: bool = False) -> int:
    """Remove this owner's stopped sandboxes and the sandboxes of dead runs (or, with `everything`, every one of this owner's).

    Stopped ones go whichever run (or FORGETUI_HOME) made them: no run can still be using one.
    """
    root = root or runs_dir()
    owner = default_owner()
    removed = await runtime.reap(owner=owner, stopped=True)
    if everything:
        removed += await runtime.reap(owner=owner)
    for run_id in dead_runs(root):
        count = await runtime.reap(run_id=run_id)
        if count:
            log.info("removed %d orphaned sandbox(es) of dead run %s", count, run_id)
        removed += count
        remove_pid_file(root / run_id)
    return removed
