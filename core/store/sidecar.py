"""A store's writer, seen from a reader: its sidecar (`<store>.live.json`), whether its process lives, its live endpoint."""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

import orjson

from core.errors import StoreError
from core.store.readonly import QueryResult

log = logging.getLogger(__name__)


def sidecar_path(store_path: Path) -> Path:
    """`<store>.live.json`: written by a writer that serves live queries."""
    return Path(str(store_path) + ".live.json")


def process_state(pid: int) -> str | None:
    """The one-letter state in /proc/<pid>/stat (R, S, Z...), or None where there is no such file."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else None


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot, /proc/<pid>/stat field 22): tells a reused pid apart; None if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int, started: int | None = None) -> bool:
    """Whether `pid` runs: not gone, not a zombie (dead, not yet reaped), and (given `started`) not a reused pid."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if process_state(pid) in ("Z", "X"):  # killed; only its exit status is left for its parent to read
        return False
    return started is None or process_start(pid) in (None, started)


def read_sidecar(store_path: Path) -> dict[str, Any] | None:
    """The live endpoint of the store's writer, or None; a sidecar left by a dead process is removed."""
    side = sidecar_path(store_path)
    try:
        info = orjson.loads(side.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", side, exc)
        return None
    host = info.get("host")
    if host and host != socket.gethostname():  # a writer on another node (a shared FORGETUI_HOME): its pid says nothing here
        log.debug("%s belongs to a writer on host %s", side, host)
        return None
    pid = int(info.get("pid", 0))
    if pid <= 0 or not pid_alive(pid):
        log.info("removing stale %s (pid %s is gone)", side, pid)
        side.unlink(missing_ok=True)
        return None
    return info


def sidecar_host(store_path: Path) -> str | None:
    """The host a store's sidecar says its writer runs on; None without a (readable) sidecar or a host in it."""
    try:
        host = orjson.loads(sidecar_path(store_path).read_bytes()).get("host")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    return str(host) if host else None


_client_lock = threading.Lock()
_client: Any = None


def _http() -> Any:
    """One HTTP client for every live read of this process (a new one costs ~30 ms of TLS setup); no proxy from the environment."""
    global _client
    import httpx

    with _client_lock:
        if _client is None:
            _client = httpx.Client(trust_env=False)
        return _client


def post_live(info: dict[str, Any], sql: str, max_rows: int, timeout: float) -> QueryResult:
    """Send read-only SQL to a writer's live endpoint (`info` from its sidecar); httpx.TransportError if it does not answer."""
    headers = {"X-Forgetui-Token": str(info.get("token", ""))}
    resp = _http().post(info["url"], json={"sql": sql, "max_rows": max_rows}, headers=headers, timeout=timeout)
    try:
        data = resp.json()
    except ValueError:
        data = {}
    if resp.status_code != 200:
        raise StoreError(data.get("error") or f"live query failed with HTTP {resp.status_code}")
    return QueryResult.from_dict(data)
