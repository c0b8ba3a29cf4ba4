"""A real `forgetui proxy` in a child process under a memory cap, and raw HTTP for inputs no client library sends.

The cap is twofold: RLIMIT_AS on the child (an allocation past it fails inside the proxy instead of
growing it), and a watchdog that kills the child when its resident memory passes `watch_mb`, so a
regression fails the test instead of the machine (which other sessions share).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> int:
    """Resident memory of a process in MiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except OSError:
        return 0
    return 0


class CappedProxy:
    """`forgetui proxy --backend SPEC` on a free port, in a child process capped in memory; its live endpoint too."""

    def __init__(
        self, spec: str, home: Path, *, extra: tuple[str, ...] = (), address_space_gb: int = 8, watch_mb: int = 2500, store: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.store = store or home / "adversarial.duckdb"
        self.stderr_path = home / "proxy.stderr"
        self.watch_mb = watch_mb
        self.peak_mb = 0
        self.killed_for_memory = False
        env = {**os.environ, "FORGETUI_HOME": str(home), **(env or {})}
        limit = address_space_gb << 30

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "forgetui.cli", "proxy", "--backend", spec, "--store", str(self.store), "--port", "0", *extra],
                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=REPO, preexec_fn=cap,  # noqa: PLW1509 - setrlimit only
            )  # fmt: skip
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise RuntimeError(f"the proxy did not start: {self.stderr()}")
        threading.Thread(target=self._watch, daemon=True).start()
        live = json.loads(Path(str(self.store) + ".live.json").read_text())
        self.live_url, self.live_token = live["url"], live["token"]

    def _watch(self) -> None:
        while self.proc.poll() is None:
            rss = rss_mb(self.proc.pid)
            self.peak_mb = max(self.peak_mb, rss)
            if rss > self.watch_mb:
                self.killed_for_memory = True
                self.proc.kill()
                return
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text()[-3000:]

    def query(self, sql: str) -> list[list[Any]]:
        """Rows of a read-only query, through the writer's live endpoint (as `forgetui sql` reads a running store)."""
        from core.store.sidecar import post_live

        return post_live({"url": self.live_url, "token": self.live_token}, sql, 100_000, 60.0).rows

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class RawAnswer:
    status: int | None
    headers: dict[str, str]
    body: bytes


def raw_request(url: str, data: bytes, *, timeout: float = 30.0, then_close: bool = False) -> RawAnswer:
    """Send bytes as they are to a server and read its answer (status None: it closed without one)."""
    host, port = url.removeprefix("http://").rstrip("/").split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        if then_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if _complete(b"".join(chunks)):
                    break
        except (ConnectionResetError, TimeoutError):
            pass
    return parse_answer(b"".join(chunks))


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    if head.startswith(b"HTTP/1.1 1"):  # an interim answer (100 Continue): the real one follows
        return _complete(body)
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def parse_answer(data: bytes) -> RawAnswer:
    head, _, body = data.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 1") and body.startswith(b"HTTP/1."):  # past an interim answer
        return parse_answer(body)
    if not head.startswith(b"HTTP/1."):
        return RawAnswer(None, {}, data)
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return RawAnswer(int(lines[0].split()[1]), headers, body)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "3m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (a full disk on demand); pytest.skip where mounting is not allowed (not root)."""
    import pytest

    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs, which needs root (mount -t tmpfs)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needed for a full disk): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def resize_tmpfs(where: Path, size: str) -> None:
    """Give a mounted tmpfs more (or less) room: the disk has space again."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True, capture_output=True)
