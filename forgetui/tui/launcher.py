"""Runs the TUI starts, stops and deletes: each a headless `forgetui run --no-ui` in its own session, so it keeps
running when the TUI quits; the TUI re-attaches by reading its store. Stopping signals the store's writer.

Each launch has a record, `FORGETUI_HOME/tui/launched/<stamp>.json`, beside its output (`<stamp>.log`): this
process writes the command and the start time; the launched process (`forgetui.launched_run`) adds its
pid, the run it created, and when it ends its exit code and the errors it logged. That is how a run that failed
says why on its Run screen and in the Runs list, and how a launch refused before it created a run still shows.
"""

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
from typing import Any

from core.errors import StoreError
from core.store.sidecar import read_sidecar

log = logging.getLogger(__name__)

RECORD_ENV = "FORGETUI_TUI_LAUNCH_RECORD"  # the launched process's record file


def forgetui_argv() -> list[str]:
    """How to start this forgetui: the venv's script beside the interpreter, else `python -m forgetui.cli`."""
    script = Path(sys.executable).with_name("forgetui")
    return [str(script)] if script.exists() else [sys.executable, "-m", "forgetui.cli"]


def launched_dir(home: Path) -> Path:
    return home / "tui" / "launched"


@dataclass(frozen=True)
class Launched:
    """A run process the TUI started: the command, where its output and record go, and its process."""

    argv: tuple[str, ...]
    log_path: Path
    record_path: Path
    process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else 0

    def alive(self) -> bool:
        """Still running (a child that exited is reaped here, so it does not linger as a zombie)."""
        return self.process.poll() is None if self.process is not None else False


@dataclass(frozen=True)
class LaunchRecord:
    """What a launch's record says: the command, the run it made (once known) and how it ended (once it did)."""

    path: Path
    args: tuple[str, ...]
    log_path: Path
    started_at: float
    pid: int | None = None
    run_id: str | None = None
    exit_code: int | None = None
    errors: tuple[str, ...] = ()

    @property
    def stamp(self) -> str:
        return self.path.stem

    @property
    def ended(self) -> bool:
        return self.exit_code is not None

    def alive(self) -> bool:
        """Its process is still running (not ended, and its pid still there)."""
        if self.ended:
            return False
        if self.pid is None:
            return _young(self.started_at)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def reason(self) -> str | None:
        """Why it failed, in the words it logged; how it ended when it logged nothing; None while it runs or when it did not fail."""
        if self.errors:  # the last: what the CLI said as it gave up (earlier ones may be a library's noise)
            return self.errors[-1]
        if self.exit_code not in (None, 0, 130):
            return f"`forgetui {' '.join(self.args)}` exited with code {self.exit_code}; its output: {self.log_path}"
        if self.exit_code is None and not self.alive():
            return f"`forgetui {' '.join(self.args)}` ended without a word (killed?); its output: {self.log_path}"
        return None


def _young(started_at: float, grace_s: float = 30.0) -> bool:
    """A launch whose process has not written its pid yet is taken as starting for this long."""
    return dt.datetime.now().timestamp() - started_at < grace_s


def launch(args: list[str], home: Path) -> Launched:
    """Start `forgetui ARGS` detached (new session, stdin closed), output to FORGETUI_HOME/tui/launched/<stamp>.log."""
    folder = launched_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = f"{dt.datetime.now():%Y%m%d-%H%M%S-%f}"
    log_path, record_path = folder / f"{stamp}.log", folder / f"{stamp}.json"
    write_record(record_path, {"args": list(args), "log": str(log_path), "started_at": dt.datetime.now().timestamp()})
    argv = [sys.executable, "-m", "forgetui.launched_run", *args]
    # one log record per line (a wide console: rich wraps at 80 columns when its output is a file)
    env = {**os.environ, "FORGETUI_HOME": str(home), RECORD_ENV: str(record_path), "COLUMNS": "400"}
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    log.info("launched %s (pid %d, output in %s)", " ".join(argv), proc.pid, log_path)
    return Launched(tuple(argv), log_path, record_path, proc)


def write_record(path: Path, data: dict[str, Any]) -> None:
    """Replace a launch record in one step (a reader never sees half of one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_record(path: Path) -> LaunchRecord | None:
    """A launch record, or None when it is not one (unreadable, or another file)."""
    try:
        data = json.loads(path.read_text())
        return LaunchRecord(
            path=path, args=tuple(str(a) for a in data["args"]), log_path=Path(data["log"]),
            started_at=float(data["started_at"]), pid=data.get("pid"), run_id=data.get("run_id"),
            exit_code=data.get("exit_code"), errors=tuple(str(e) for e in data.get("errors") or ()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_launches(home: Path) -> list[LaunchRecord]:
    """Every launch record under FORGETUI_HOME/tui/launched, oldest first."""
    found = (read_record(p) for p in sorted(launched_dir(home).glob("*.json")))
    return [r for r in found if r is not None]


def find_launch(home: Path, run_id: str) -> LaunchRecord | None:
    """The latest launch that made (or resumed) run `run_id`, if the TUI launched it."""
    found = [r for r in read_launches(home) if r.run_id == run_id]
    return found[-1] if found else None


def forget_launch(record: LaunchRecord) -> None:
    """Remove a launch's record and output (a launch that made no run: nothing else is left of it)."""
    for path in (record.path, record.log_path):
        path.unlink(missing_ok=True)


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
