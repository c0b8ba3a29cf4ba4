"""What the TUI launches: `forgetui ARGS` (a `run --no-ui`) in this process, its log as plain lines, and what
became of it written to its launch record (`forgetui.tui.launcher`): this pid, the run it created, and when it
ends its exit code and every error it logged. The TUI shows them; nothing here changes what the run does.

    python -m forgetui.launched_run run CONFIG.toml --no-ui
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

from core import paths
from forgetui.cli import main as cli_main
from forgetui.tui.launcher import RECORD_ENV, write_record

# a run's store path as core's log lines name it (the live-query endpoint's line comes first, right after the
# store opens); a run created before this launch (an SFT teacher's, say) is not this launch's run
STORE_PATH = re.compile(r"/runs/([0-9A-Za-z._-]+)/store\.duckdb")


class LaunchRecorder(logging.Handler):
    """Catches the run this process created (the first new run folder a log line names) and every error logged."""

    def __init__(self, record_path: Path, home: Path) -> None:
        super().__init__(level=logging.INFO)
        self.path = record_path
        self.home = home
        self.data = json.loads(record_path.read_text())
        self.data["pid"] = os.getpid()
        self.data.setdefault("errors", [])
        resume = _resume_of(self.data.get("args") or [])
        if resume:
            self.data["run_id"] = resume
        self.save()

    def save(self) -> None:
        write_record(self.path, self.data)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed log call must not break the run
            return
        changed = False
        if self.data.get("run_id") is None:
            for run_id in STORE_PATH.findall(message):
                run_dir = self.home / "runs" / run_id
                if run_dir.is_dir() and run_dir.stat().st_mtime >= self.data["started_at"] - 1:
                    self.data["run_id"] = run_id
                    changed = True
                    break
        if record.levelno >= logging.ERROR:
            self.data["errors"].append(message)
            changed = True
        if changed:
            self.save()

    def finish(self, exit_code: int) -> None:
        self.data["exit_code"] = exit_code
        self.save()


def _resume_of(args: list[str]) -> str | None:
    """The run id of `run --resume RUN_ID ...`."""
    for i, arg in enumerate(args):
        if arg == "--resume" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--resume="):
            return arg.split("=", 1)[1]
    return None


def main(argv: list[str] | None = None) -> int:
    # plain lines, one per record: set before the CLI's own setup, which then leaves the root logger alone
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    recorder = LaunchRecorder(Path(os.environ[RECORD_ENV]), paths.home())
    logging.getLogger().addHandler(recorder)
    code = 1
    try:
        code = cli_main(sys.argv[1:] if argv is None else argv)
    except BaseException as exc:
        recorder.data["errors"].append(f"{type(exc).__name__}: {exc}")
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        raise
    finally:
        recorder.finish(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
