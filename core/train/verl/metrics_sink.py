"""veRL's per-step metrics → one `train_steps` row per trainer step, in the run's own store.

veRL 0.9's `Tracking` (verl/utils/tracking.py) takes its backends from a fixed list (`trainer.logger`
names them; an unknown name fails an assert), so forgetui adds none: it turns on veRL's own `file`
backend (`trainer.logger=[console,file]`, `VERL_FILE_LOGGER_PATH` = runs/<id>/verl/metrics.jsonl),
whose `FileLogger` appends `{"step": N, "data": {metric: value}}` at every `Tracking.log`. The
`forgetui train --trainer verl` process, the one writer of runs/<id>/store.duckdb (each agent-loop
worker writes its own shard), follows that file while veRL runs and writes the rows:

- `step` = veRL's `training/global_step` − 1 (forgetui's steps count from 0, as the local trainer's do;
  veRL's own number stays in `metrics`), as the step's rollouts have it (`agent_loop.rollout_step`);
  a record without `training/global_step` is validation before training, not a step, and is skipped;
- `loss` = `actor/pg_loss`, `reward_mean` = `critic/score/mean` (the verifier's reward), when logged;
- `metrics` = veRL's whole dict, plus the local trainer's names for the metrics both have (`kl`,
  `entropy`, `grad_norm`, `lr`, ...) so the TUI's curves and reports read both kinds of run alike.

Each step is written once: a resumed veRL run redoes the steps after its last checkpoint (and its
`FileLogger` starts the file anew), and a step that already has a row keeps it, as in the local loop.
"""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from core.errors import StoreError
from core.status import RunStatus
from core.store.writer import Store

log = logging.getLogger(__name__)

FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"  # where veRL's FileLogger writes (verl/utils/tracking.py)
METRICS_FILE = "metrics.jsonl"
STEP_KEY = "training/global_step"  # set by veRL's trainer on every training step's metrics, never on validation alone
LOSS_KEYS = ("actor/pg_loss",)
# the sequence score (the verifier's reward); critic/rewards/* has veRL's KL penalty in it
REWARD_KEYS = ("critic/score/mean",)
ALIASES = {  # the local trainer's metric name → veRL's
    "pg_loss": "actor/pg_loss",
    "pg_clipfrac": "actor/pg_clipfrac",
    "ppo_kl": "actor/ppo_kl",
    "kl": "actor/kl_loss",  # KL to the reference policy, as the local trainer's `kl`
    "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm",
    "lr": "actor/lr",
}
POLL_S = 5.0
HEAD_BYTES = 1 << 20  # a record is a few KB; the first line tells one file from the next


def metrics_path(run_dir: Path) -> Path:
    """runs/<id>/verl/metrics.jsonl: veRL's FileLogger output for the run."""
    return run_dir / "verl" / METRICS_FILE


def _number(data: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    """The first of `keys` that holds a number (NaN is logged as null)."""
    for key in keys:
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def step_row(run_id: str, record: dict[str, Any]) -> dict[str, Any] | None:
    """The `train_steps` row of one FileLogger record; None for a record that is no training step."""
    data = record.get("data")
    if not isinstance(data, dict) or not isinstance(data.get(STEP_KEY), int | float):
        return None
    metrics = dict(data)
    for name, key in ALIASES.items():
        if key in data and name not in metrics:
            metrics[name] = data[key]
    return {
        "run_id": run_id,
        "step": int(data[STEP_KEY]) - 1,
        "loss": _number(data, LOSS_KEYS),
        "reward_mean": _number(data, REWARD_KEYS),
        "metrics": metrics,
    }


@dataclass
class FilePosition:
    """How far the file has been read, and its first line then (a file started anew has another)."""

    offset: int = 0
    head: bytes = b""


def read_records(path: Path, pos: FilePosition) -> list[dict[str, Any]]:
    """The complete records after `pos` (which moves past them); a line still being written waits."""
    try:
        with path.open("rb") as fh:
            head = fh.readline(HEAD_BYTES)
            if not head.endswith(b"\n") and len(head) < HEAD_BYTES:
                return []  # nothing complete yet
            if pos.offset and head != pos.head:  # a resumed veRL reopened the file ("wb"): it starts over
                log.info("%s was started anew: reading it from the top", path)
                pos.offset = 0
            fh.seek(pos.offset)
            data = fh.read()
    except FileNotFoundError:
        pos.offset = 0
        return []
    end = data.rfind(b"\n") + 1
    pos.offset, pos.head = pos.offset + end, head
    return _parse(path, data[:end])


def _parse(path: Path, data: bytes) -> list[dict[str, Any]]:
    """One record per JSON line; a malformed line is skipped with a warning."""
    records = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            log.warning("skipping a malformed line of %s: %r", path, line[:200])
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


class MetricsSink:
    """Follows veRL's metrics file and writes the run's `train_steps` rows (and its `runs` row) into runs/<id>/store.duckdb.

    The store is opened only to write (once per new step): between writes readers can open it, and a
    reader that holds it for a moment only delays the rows to the next poll.
    """

    def __init__(self, run_id: str, run_dir: Path, config: dict[str, Any] | None = None) -> None:
        self.run_id = run_id
        self.run_dir = run_dir
        self.config = config
        self.path = metrics_path(run_dir)
        self.store_path = run_dir / "store.duckdb"
        self.pos = FilePosition()
        self.pending: dict[int, dict[str, Any]] = {}  # step → row not yet in the store
        self.status: str | None = None  # the run's status, not yet in the store
        self.run_written = config is None  # the runs row (from the config) is written with the first status
        self.written = 0

    def begin(self) -> None:
        """The run's row (running); rows for what an earlier launch logged; that file set aside, so veRL starts a fresh one."""
        self.poll(status=RunStatus.RUNNING)
        if self.path.exists() and not self.pending:
            self.path.replace(self.path.with_name(f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))
            self.pos = FilePosition()

    def poll(self, status: str | None = None) -> int:
        """Read what veRL logged since the last poll; write the steps that have no row yet; how many were written."""
        self.status = status or self.status
        records = read_records(self.path, self.pos)
        for record in records:
            row = step_row(self.run_id, record)
            if row is not None:  # the first record of a step wins, as its first row does
                self.pending.setdefault(row["step"], row)
        return self._write()

    def end(self, status: str) -> None:
        """The last records and the run's final status."""
        self.poll(status=status)

    def _write(self) -> int:
        status = self.status
        if not self.pending and status is None:
            return 0
        try:
            store = Store.open(self.store_path)
        except StoreError as exc:
            log.warning("veRL step metrics wait for the next poll: %s", exc)
            return 0
        try:
            if status is not None and not self.run_written:
                store.insert_run(self.run_id, self.config or {}, status=status)
                self.run_written = True
            elif status is not None:
                store.update_run_status(self.run_id, status)
            new = self._insert_missing(store)
        finally:
            store.close()
        self.pending.clear()
        self.status = None
        self.written += new
        if new:
            log.info("veRL run %s: %d step row(s) written (%d in all)", self.run_id, new, self.written)
        return new

    def _insert_missing(self, store: Store) -> int:
        """Insert the pending rows whose step has none yet (a resumed run redoes steps)."""
        store.flush()
        sql = "SELECT step FROM train_steps WHERE run_id = ?"
        have = {step for (step,) in store.cursor().execute(sql, [self.run_id]).fetchall()}
        new = [row for step, row in sorted(self.pending.items()) if step not in have]
        for row in new:
            store.insert_train_step(row)
        store.flush()
        return len(new)


def run_recording_metrics(
    command: list[str], env: dict[str, str], sink: MetricsSink, *, poll_s: float = POLL_S
) -> int:
    """Run veRL's command to its end while `sink` records its step metrics; its exit status."""
    sink.begin()
    status = RunStatus.FAILED
    try:
        with subprocess.Popen(command, env=env) as proc:
            try:
                code = _wait_polling(proc, sink, poll_s)
            except BaseException:
                proc.kill()  # as subprocess.call does: no veRL outlives its launcher
                raise
        status = RunStatus.DONE if code == 0 else RunStatus.FAILED
        return code
    except KeyboardInterrupt:
        status = RunStatus.INTERRUPTED
        raise
    finally:
        try:
            sink.end(status)
        except Exception:  # noqa: BLE001 - the training's own outcome matters more than its rows
            log.exception("could not record veRL's last step metrics")


def _wait_polling(proc: subprocess.Popen, sink: MetricsSink, poll_s: float) -> int:
    """Wait for the process, polling the sink between waits; its exit status."""
    while True:
        try:
            return proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            try:
                sink.poll()
            except Exception:  # noqa: BLE001 - metrics must not stop training
                log.exception("could not record veRL's step metrics")
