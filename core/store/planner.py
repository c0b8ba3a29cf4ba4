"""A live query is rehearsed in a sacrificial child process before the writer runs it.

DuckDB's planner is neither bounded by `memory_limit` nor interruptible: 30,000 `UNION ALL SELECT 1`
terms (560 KB) grow quadratically while they are planned (the proxy reached 22 GB and was killed),
and 14 nested `NOT MATERIALIZED` CTEs (1 KB) plan for 30 s in 600 MB, doubling with each level. Nor
are the values a query makes bounded: `SELECT repeat('x', 4000000) FROM range(2048)` fills one 8 GB
vector whatever `memory_limit` says. So before a live query reaches the writer's connection, a
child process (`plan_child.py`) holding an empty copy of the store's schema plans and runs it there
under a memory cap and a deadline. A query that outgrows either is refused with a 400 and the child
is replaced; the writer never starts on it. Planning costs the same on empty tables as on full ones
(it is the query's shape that grows, not the data), so what passed here plans within the same
bounds in the writer. What this cannot see is a cost that grows with the store's own rows (a
`repeat(request, 10^6)` over `calls`): the writer's `memory_limit`, its time limit and the answer's
size cap bound most of that, and the endpoint serves only the holder of the store's token.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from core.errors import StoreError

log = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("plan_child.py")
PLAN_DEADLINE_S = 2.0  # an analytics view's query plans in milliseconds; 2 s is a UNION ALL of ~3,000 terms
PLAN_MEMORY_BYTES = 512 << 20
START_WAIT_S = 60.0


class QueryTooCostly(StoreError):
    """A live query that would take the writer more than its planning budget (time or memory)."""

    kind = "invalid_request"


class Planner:
    """The child that rehearses live queries first; one query at a time, restarted after a query killed it."""

    def __init__(self, ddl: str, settings: dict[str, Any], *, deadline_s: float = PLAN_DEADLINE_S, memory_bytes: int = PLAN_MEMORY_BYTES) -> None:
        self.deadline_s = deadline_s
        self.memory_bytes = memory_bytes
        self._setup = orjson.dumps({"ddl": ddl, "settings": {"memory_limit": f"{memory_bytes >> 20}MB", **settings}, "memory_bytes": memory_bytes})
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ready = False

    def start(self) -> None:
        """Start the child now (its schema takes a moment to create), so the first query does not wait for it."""
        with self._lock:
            self._spawn()

    def _spawn(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-I", str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self._ready = False
            self._send(self._proc, self._setup)
        return self._proc

    def check(self, sql: str) -> str | None:
        """Rehearse `sql` in the child: None, or DuckDB's own error for it; QueryTooCostly past the time or memory budget."""
        with self._lock:
            try:
                proc = self._spawn()
                if not self._ready:
                    self._started(proc)
                self._send(proc, sql.encode("utf-8"))
                answer = self._receive(proc, self.deadline_s)
            except TimeoutError:
                self._kill()
                raise QueryTooCostly(
                    f"the query takes more than {self.deadline_s:g} s to plan and run on empty tables, so it was not run on the store "
                    "(DuckDB's planner cannot be interrupted: long UNION ALL chains and nested NOT MATERIALIZED CTEs grow without bound); simplify it"
                ) from None
            except (EOFError, BrokenPipeError, OSError):
                crash = self._crash()
                if crash is not None:
                    raise StoreError(f"the live query planner process failed on this query, which was not run: {crash}") from None
                raise QueryTooCostly(
                    f"the query needs more than {self.memory_bytes >> 20} MiB before reading a single row of the store "
                    "(the process rehearsing it ran out), so it was not run on the store; simplify it"
                ) from None
        if not answer.get("planned"):
            raise QueryTooCostly(
                f"the query needs more than {self.memory_bytes >> 20} MiB before reading a single row of the store "
                f"({answer.get('error')}), so it was not run on the store; simplify it"
            )
        return answer.get("error")

    def _started(self, proc: subprocess.Popen) -> None:
        """Wait for a new child to have its schema; a StoreError (500) saying why when it could not start."""
        try:
            self._receive(proc, START_WAIT_S)
        except (TimeoutError, EOFError, OSError) as exc:
            why = _last_words(proc)[-1000:]
            self._kill()
            raise StoreError(f"the live query planner process could not start ({type(exc).__name__}): {why or 'no message'}") from None
        self._ready = True

    def _send(self, proc: subprocess.Popen, data: bytes) -> None:
        assert proc.stdin is not None
        proc.stdin.write(struct.pack("<Q", len(data)) + data)
        proc.stdin.flush()

    def _receive(self, proc: subprocess.Popen, timeout: float) -> dict[str, Any]:
        head = self._read(proc, 8, time.monotonic() + timeout)
        return orjson.loads(self._read(proc, struct.unpack("<Q", head)[0], time.monotonic() + timeout))

    def _read(self, proc: subprocess.Popen, n: int, deadline: float) -> bytes:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, n - len(out))
                if not chunk:
                    raise EOFError
                out += chunk
        return bytes(out)

    def _crash(self) -> str | None:
        """Stop the child that just died; the last line of its Python traceback when an exception other than running
        out of memory killed it (a bug to report, not a costly query), else None."""
        why = _last_words(self._proc) if self._proc is not None else ""
        self._kill()
        last = why.splitlines()[-1] if why else ""
        if "Traceback" not in why or "MemoryError" in last:
            return None
        return last[-1000:]

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def stop(self) -> None:
        with self._lock:
            self._kill()


def _last_words(proc: subprocess.Popen) -> str:
    """What a child wrote to stderr, once it is stopped (killed if it still runs)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stderr is None:
        return ""
    try:
        return proc.stderr.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
