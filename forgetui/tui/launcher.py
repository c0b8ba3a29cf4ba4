"""Runs the TUI starts, stops and deletes: each a headless `forgetui run --no-ui` in its own session, so it keeps
running when the TUI quits; the TUI re-attaches by reading its store. Stopping signals the store's writer."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError, StoreError
from core.store.query import read_sidecar

log = logging.getLogger(__name__)


def forgetui_argv() -> list[str]:
    """How to start this forgetui: the venv's script beside the interpreter, else `python -m forgetui.cli`."""
    script = Path(sys.executable).with_name("forgetui")
    return [str(script)] if script.exists() else [sys.executable, "-m", "forgetui.cli"]


@dataclass(frozen=True)
class Launched:
    """A run process the TUI started: its pid, the command and where its stdout/stderr go."""

    pid: int
    argv: tuple[str, ...]
    log_path: Path
    process: subprocess.Popen | None = None

    def alive(self) -> bool:
        """Still running (a child that exited is reaped here, so it does not linger as a zombie)."""
        return self.process.poll() is None if self.process is not None else False


def launch(args: list[str], home: Path) -> Launched:
    """Start `forgetui ARGS` detached (new session, stdin closed), output to FORGETUI_HOME/tui/launched/*.log."""
    folder = home / "tui" / "launched"
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{dt.datetime.now():%Y%m%d-%H%M%S-%f}.log"
    argv = [*forgetui_argv(), *args]
    env = {**os.environ, "FORGETUI_HOME": str(home)}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    (folder / f"{proc.pid}.json").write_text(json.dumps({"pid": proc.pid, "argv": argv, "log": str(log_path)}))
    log.info("launched %s (pid %d, output in %s)", " ".join(argv), proc.pid, log_path)
    return Launched(proc.pid, tuple(argv), log_path, proc)


def launch_run(config_path: Path, home: Path) -> Launched:
    if not Path(config_path).is_file():
        raise ConfigError(f"no config file at {config_path}")
    return launch(["run", str(config_path), "--no-ui"], home)


def resume_run(run_id: str, home: Path) -> Launched:
    if not (home / "runs" / run_id).is_dir():
        raise StoreError(f"no run {run_id} under {home / 'runs'}")
    return launch(["run", "--resume", run_id, "--no-ui"], home)


def writer_pid(run_dir: Path) -> int | None:
    """The pid of the process writing the run's store now (its live-query sidecar), or None."""
    info = read_sidecar(run_dir / "store.duckdb")
    return int(info["pid"]) if info and info.get("pid") else None


def stop_run(run_dir: Path) -> int:
    """SIGTERM the run's writer: its cleanup removes every sandbox and marks the run interrupted. Returns the pid."""
    pid = writer_pid(run_dir)
    if pid is None:
        raise StoreError(f"run {run_dir.name} has no live writer: it is not running")
    if pid == os.getpid():
        raise StoreError(f"run {run_dir.name} runs inside this TUI: stop it with q on its dashboard")
    os.kill(pid, signal.SIGTERM)
    return pid


def terminate(pid: int) -> None:
    """SIGTERM a run process started here (its own cleanup then runs); gone already is fine."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def delete_run(run_dir: Path) -> None:
    """Remove a run's folder (store, shards, logs, checkpoints); refused while it runs."""
    if writer_pid(run_dir) is not None:
        raise StoreError(f"run {run_dir.name} is running: stop it first")
    if run_dir.parent.name != "runs" or not (run_dir / "store.duckdb").exists() and not (run_dir / "shards").is_dir():
        raise StoreError(f"{run_dir} is not a run folder")
    shutil.rmtree(run_dir)


def gc(home: Path, runtimes: tuple[str, ...] = ()) -> str:
    """`forgetui gc` (sandboxes of runs that died); its output."""
    args = ["gc", *(a for kind in runtimes for a in ("--runtime", kind))]
    done = subprocess.run([*forgetui_argv(), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "FORGETUI_HOME": str(home)}, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise StoreError(f"forgetui gc failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return f"gc removed {done.stdout.strip() or '0'} sandbox(es)"
