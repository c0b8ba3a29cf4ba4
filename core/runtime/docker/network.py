"""The isolated network of a Docker sandbox: its own network namespace where only the proxy answers.

Why not an internal bridge network: on an (internal) bridge the host owns the bridge's gateway address, so
a sandbox reaches every host service listening on all addresses through it (Docker's isolation rules only
cover forwarded traffic, not traffic to the host itself), and this engine (20.10) cannot create a bridge
without a host address. So a sandbox gets a namespace with no interface but loopback, and no route at all,
and the proxy is brought into it at the same ``127.0.0.1:PORT`` the harness would use on the host. Two ways:

* **listener in the namespace** (when forgetui runs as root next to the engine): after the container starts
  and before the harness does, a thread of the run's process enters the sandbox's network namespace
  (``setns``), opens a listening socket on its loopback and leaves; the socket stays in that namespace.
  The run's process accepts on it and connects to the proxy from the host's namespace. No extra container,
  nothing in the sandbox to kill, nothing needed in its image.
* **forwarder container** (otherwise: not root, a remote engine):

    sandbox ──127.0.0.1:PORT──► forwarder (same namespace, its own container) ──unix socket──► HostRelay ──► proxy

* The forwarder is a small container started with ``network_mode="none"``; the sandbox joins its namespace
  (``network_mode="container:<forwarder>"``), so the harness reaches the proxy at the very URL it would on
  the host (``http://127.0.0.1:PORT``). The forwarder's only way out is a unix socket in a folder bind-mounted
  read-only into it (never into the sandbox). The sandbox cannot see or signal the forwarder's process.
* The HostRelay is a thread in the run's process: it accepts on that unix socket and connects to the proxy
  on the host's loopback. Nothing else is reachable: there is no route, so the internet and metadata
  addresses are unroutable by construction.

With ``runtime.egress_allow`` the same two ways bring a second port into the sandbox, the egress proxy's
(``core.runtime.docker.egress``): a listener (or a forwarder port and a unix socket of its own) whose connections
the run's process serves as an HTTP(S) forward proxy for the allowed names only.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from core.errors import SandboxError

log = logging.getLogger(__name__)

SOCKET_DIR_IN_FORWARDER = "/run/forgetui-net"
SOCKET_NAME = "proxy.sock"
Handler = Callable[[socket.socket], None]  # serves one accepted connection, then closes it
FORWARDER_READY = b"forgetui-forwarder-ready"
READY_TIMEOUT_S = 30.0
FORWARDER_MEMORY = "64m"
# Runs as the forwarder container's process (python3 from the sandbox's own image): listen on the
# namespace's loopback (one port per unix socket: argv = ready, then port path pairs), relay each connection
# to its host unix socket, both directions, until either ends.
FORWARDER_SCRIPT = r"""
import socket, sys, threading
ready, pairs = sys.argv[1], sys.argv[2:]
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
def serve(conn, path):
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
def accept(srv, path):
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, path), daemon=True).start()
servers = [(socket.create_server(("127.0.0.1", int(port)), backlog=256), path) for port, path in zip(pairs[::2], pairs[1::2])]
print(ready, flush=True)
for srv, path in servers[1:]:
    threading.Thread(target=accept, args=(srv, path), daemon=True).start()
accept(*servers[0])
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


def splice(conn: socket.socket, up: socket.socket) -> None:
    """Copy bytes between two connected sockets, both ways, until both directions end; then close both."""
    up.settimeout(None)
    conn.settimeout(None)
    back = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
    back.start()
    _pipe(conn, up)
    back.join()
    conn.close()
    up.close()


def relay_to(conn: socket.socket, target: tuple[str, int]) -> None:
    """Connect to `target` and copy bytes both ways until both directions end; then close both."""
    try:
        up = socket.create_connection(target, timeout=10)
    except OSError as exc:
        log.warning("sandbox network relay: the proxy at %s:%d does not answer (%s)", *target, exc)
        conn.close()
        return
    splice(conn, up)


def relay_handler(target: tuple[str, int]) -> Handler:
    """A handler that relays each connection to `target` (the model proxy on the host)."""
    return lambda conn: relay_to(conn, target)


def _accept_loop(sock: socket.socket, handle: Handler, closed: threading.Event) -> None:
    while not closed.is_set():
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


CLONE_NEWNET = 0x40000000


def can_enter_namespaces() -> bool:
    """Whether this process may open listeners in other network namespaces (root on Linux)."""
    return sys.platform.startswith("linux") and os.geteuid() == 0 and os.path.exists("/proc/thread-self/ns/net")


def same_container(pid: int, rootfs: str | None) -> bool:
    """Whether host pid `pid` is the container whose root is mounted at `rootfs` (a local engine, same pid view)."""
    if not rootfs or pid <= 0:
        return False
    try:
        a, b = os.stat(f"/proc/{pid}/root/"), os.stat(rootfs)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _listen_in(pid: int, port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port` in the network namespace of host pid `pid` (run in a throwaway thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    theirs = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(theirs, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into the network namespace of pid {pid}: {os.strerror(err)}")
        try:
            return socket.create_server(("127.0.0.1", port), backlog=256)
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:  # the thread ends right after: nothing else runs in it
                log.error("could not return a thread to its own network namespace")
    finally:
        os.close(own)
        os.close(theirs)


class NetnsListener:
    """A port inside one sandbox's network namespace whose connections `handle` serves in this process
    (the model proxy's port, relayed to the proxy on the host; or the egress proxy's)."""

    def __init__(self, pid: int, port: int, handle: Handler) -> None:
        box: dict[str, Any] = {}

        def enter() -> None:
            try:
                box["sock"] = _listen_in(pid, port)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc

        worker = threading.Thread(target=enter, name="netns-listen")  # setns changes only this thread
        worker.start()
        worker.join()
        if "error" in box:
            raise SandboxError(f"cannot open the proxy's port in the sandbox's network namespace: {box['error']}")
        self.sock: socket.socket = box["sock"]
        self._closed = threading.Event()
        threading.Thread(target=_accept_loop, args=(self.sock, handle, self._closed), name=f"netns-port:{pid}:{port}", daemon=True).start()

    def close(self) -> None:
        """Stop listening; the namespace is freed once the container is gone too."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class UnixListener:
    """Accepts on a unix socket in a private folder (mounted into a forwarder) and serves each connection with `handle`.

    Our own relay, not a library: a few lines of socket copying, one thread per direction (a run has at
    most its concurrency's worth of open calls).
    """

    def __init__(self, handle: Handler, name: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="forgetui-net-")
        os.chmod(self.dir, 0o711)  # root in the forwarder opens the socket; nobody else lists the folder
        self.path = os.path.join(self.dir, SOCKET_NAME)
        weakref.finalize(self, shutil.rmtree, self.dir, True)  # at the latest when the process exits
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        self._sock.listen(256)
        self._closed = threading.Event()
        threading.Thread(target=_accept_loop, args=(self._sock, handle, self._closed), name=name, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class HostRelay(UnixListener):
    """A unix socket whose connections are relayed to the proxy on host loopback (one per proxy address)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        super().__init__(relay_handler(self.target), f"net-relay:{port}")


def forwarder_kwargs(name: str, image: str, routes: list[tuple[int, UnixListener]], labels: dict[str, str], life: str) -> dict[str, Any]:
    """``containers.create`` arguments of a sandbox's forwarder: no network, no capabilities, read-only root.

    `routes`: each port the forwarder opens on the namespace's loopback and the unix socket it leads to.
    """
    argv = ["python3", "-c", FORWARDER_SCRIPT, FORWARDER_READY.decode()]
    volumes: dict[str, dict[str, str]] = {}
    for i, (port, listener) in enumerate(routes):
        folder = f"{SOCKET_DIR_IN_FORWARDER}/{i}"
        argv += [str(port), f"{folder}/{SOCKET_NAME}"]
        volumes[listener.dir] = {"bind": folder, "mode": "ro"}
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
        "volumes": volumes,
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
