"""The isolated network of a Docker sandbox: its own network namespace where only the proxy answers.

Why a forwarder container and not an internal bridge network: on an (internal) bridge the host owns the
bridge's gateway address, so a sandbox reaches every host service listening on all addresses through it
(Docker's isolation rules only cover forwarded traffic, not traffic to the host itself), and this engine
(20.10) cannot create a bridge without a host address. So a sandbox gets a namespace with no interface but
loopback, and no route at all:

    sandbox ──127.0.0.1:PORT──► forwarder (same namespace, its own container) ──unix socket──► HostRelay ──► proxy

* The forwarder is a small container started with ``network_mode="none"``; the sandbox joins its namespace
  (``network_mode="container:<forwarder>"``), so the harness reaches the proxy at the very URL it would on
  the host (``http://127.0.0.1:PORT``). The forwarder's only way out is a unix socket in a folder bind-mounted
  read-only into it (never into the sandbox). The sandbox cannot see or signal the forwarder's process.
* The HostRelay is a thread in the run's process: it accepts on that unix socket and connects to the proxy
  on the host's loopback. Nothing else is reachable: there is no route, so the internet and metadata
  addresses are unroutable by construction.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import weakref
from typing import Any
from urllib.parse import urlsplit

from core.errors import SandboxError

log = logging.getLogger(__name__)

SOCKET_DIR_IN_FORWARDER = "/run/forgetui-net"
SOCKET_NAME = "proxy.sock"
FORWARDER_READY = b"forgetui-forwarder-ready"
READY_TIMEOUT_S = 30.0
FORWARDER_MEMORY = "64m"
# Runs as the forwarder container's process (python3 from the sandbox's own image): listen on the
# namespace's loopback, relay each connection to the host's unix socket, both directions, until either ends.
FORWARDER_SCRIPT = r"""
import socket, sys, threading
port, path, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(conn):
    up = socket.socket(socket.AF_UNIX)
    try:
        up.connect(path)
    except OSError:
        conn.close(); up.close(); return
    back = threading.Thread(target=pipe, args=(up, conn), daemon=True)
    back.start()
    pipe(conn, up)
    back.join()
    conn.close(); up.close()
srv = socket.create_server(("127.0.0.1", port), backlog=256)
print(ready, flush=True)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def proxy_address(url: str) -> tuple[str, int]:
    """(host, port) of the proxy URL a sandbox is given; SandboxError if it names no port."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if not parts.hostname or not parts.port:
        raise SandboxError(f"isolated network: the proxy address {url!r} has no host:port; give the sandbox the proxy's URL")
    return parts.hostname, parts.port


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class HostRelay:
    """Accepts on a unix socket in a private folder and relays each connection to the proxy on host loopback.

    Our own relay, not a library: a few lines of socket copying, one thread per direction (a run has at
    most its concurrency's worth of open calls).
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.dir = tempfile.mkdtemp(prefix="forgetui-net-")
        os.chmod(self.dir, 0o711)  # root in the forwarder opens the socket; nobody else lists the folder
        self.path = os.path.join(self.dir, SOCKET_NAME)
        weakref.finalize(self, shutil.rmtree, self.dir, True)  # at the latest when the process exits
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        self._sock.listen(256)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name=f"net-relay:{port}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(self.target, timeout=10)
        except OSError as exc:
            log.warning("sandbox network relay: the proxy at %s:%d does not answer (%s)", *self.target, exc)
            conn.close()
            return
        up.settimeout(None)
        back = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
        back.start()
        _pipe(conn, up)
        back.join()
        conn.close()
        up.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def forwarder_kwargs(name: str, image: str, port: int, relay: HostRelay, labels: dict[str, str], life: str) -> dict[str, Any]:
    """``containers.create`` arguments of a sandbox's forwarder: no network, no capabilities, read-only root."""
    argv = ["python3", "-c", FORWARDER_SCRIPT, str(port), f"{SOCKET_DIR_IN_FORWARDER}/{SOCKET_NAME}", FORWARDER_READY.decode()]
    if life != "infinity":  # never outlives its sandbox's own keep-alive
        argv = ["timeout", "-s", "KILL", life, *argv]
    return {
        "image": image,
        "command": argv,
        "entrypoint": [],
        "name": name,
        "init": True,
        "labels": {**labels, "forgetui.role": "network"},
        "network_mode": "none",
        "mem_limit": FORWARDER_MEMORY,
        "memswap_limit": FORWARDER_MEMORY,
        "pids_limit": 64,
        "nano_cpus": int(0.5e9),
        "privileged": False,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "read_only": True,
        "volumes": {relay.dir: {"bind": SOCKET_DIR_IN_FORWARDER, "mode": "ro"}},
        "user": f"{os.getuid()}:{os.getgid()}",  # the owner of the relay socket (mode 0600), with no capabilities
    }


def start_forwarder(client: Any, kwargs: dict[str, Any]) -> Any:
    """Create and start a forwarder; return it once it listens (SandboxError with its output if it cannot)."""
    container = client.containers.create(**kwargs)
    try:
        stream = client.api.attach(container.id, stdout=True, stderr=True, stream=True, logs=True)
        container.start()
        seen = bytearray()
        deadline = time.monotonic() + READY_TIMEOUT_S
        for chunk in stream:
            seen += chunk
            if FORWARDER_READY in seen:
                break
            if time.monotonic() > deadline:
                break
        with contextlib.suppress(Exception):
            stream.close()
        if FORWARDER_READY not in seen:
            raise SandboxError(
                f"the network forwarder of sandbox {kwargs['name']} did not start from image {kwargs['image']!r} "
                f"(an isolated sandbox needs python3 in its image; or set runtime.network = \"host\"): "
                f"{bytes(seen).decode(errors='replace').strip()[-500:]}"
            )
    except BaseException:
        with contextlib.suppress(Exception):
            container.remove(force=True)
        raise
    return container
