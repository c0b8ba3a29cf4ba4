"""Named outside destinations for isolated Docker sandboxes: an HTTP(S) forward proxy run by forgetui.

An isolated sandbox has no route off its loopback (``core.runtime.docker.network``). With ``runtime.egress_allow`` it gets
one more port on that loopback, served by this module in the run's process, and ``HTTP_PROXY``/``HTTPS_PROXY``
pointing at it (``NO_PROXY=127.0.0.1,localhost`` keeps the model proxy direct). For each request:

1. the *requested name* (``CONNECT host:port``, or the host of an absolute ``http://`` URI) must match a
   pattern of ``runtime.egress_allow``: ``host`` (ports 80 and 443), ``host:port``, ``*.domain`` (any
   subdomain, not the domain itself), ``*.domain:port``; anything else gets a 403 before any lookup;
2. forgetui resolves the name itself (never the sandbox) and checks every address: a link-local or cloud
   metadata address (169.254.0.0/16, fe80::/10, and ``core.runtime.cloud_metadata``'s list, the one the
   Kubernetes NetworkPolicy carves out too: fd00:ec2::254, 168.63.129.16, ...) is always refused, so are unspecified
   and multicast ones; loopback and private ranges (anything not globally routable) are refused unless the
   exact name is listed in ``runtime.egress_allow_private`` (no wildcards there: a wildcard never opens
   private addresses);
3. it connects to the checked address (so the name cannot re-resolve elsewhere in between) and relays.

Every decision is logged (``core.runtime.docker.egress``; refusals as warnings) and counted per rollout; the run
writes the counts into ``rollouts.meta.egress``.

Our own small proxy, not a library (proxy.py, mitmproxy): the decision must sit between name resolution and
connect, with resolver and connector hooks for tests, inside the listener threads that already carry the
model proxy's port into each sandbox; that is a request line, a header block and a socket splice.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from core.errors import ConfigError
from core.runtime.cloud_metadata import is_metadata
from core.runtime.docker.network import splice

log = logging.getLogger(__name__)

DEFAULT_PORTS = (80, 443)  # what a pattern without a port allows
SANDBOX_PORT = 3128  # the egress proxy's port on a sandbox's loopback (3129 when the model proxy has 3128)
MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
CONFIG_KEY = "runtime.egress_allow"
PRIVATE_KEY = "runtime.egress_allow_private"
HOP_HEADERS = frozenset({"proxy-connection", "proxy-authorization", "connection", "keep-alive"})

Resolver = Callable[[str, int], list[str]]
Connector = Callable[[str, int], socket.socket]


@dataclass(frozen=True)
class Rule:
    """One pattern of ``runtime.egress_allow``: a name (``*.``-prefixed for subdomains) and a port or None."""

    host: str
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        if (port not in DEFAULT_PORTS) if self.port is None else (port != self.port):
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])  # "a.example.com" and deeper; never "example.com" itself
        return host == self.host

    def __str__(self) -> str:
        return self.host if self.port is None else f"{self.host}:{self.port}"


def normalize(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def parse_rule(text: str, key: str = CONFIG_KEY) -> Rule:
    """A pattern (``host``, ``host:port``, ``*.domain[:port]``, ``[v6]:port``); ConfigError naming `key` if it is none."""
    raw = text.strip()
    if not raw or "/" in raw or "://" in raw:
        raise ConfigError(
            f"{key}: {text!r} is not a host name pattern (host, host:port or *.domain); CIDRs for Kubernetes "
            "pods go in runtime.kubernetes.egress_allow"
        )
    host, port = raw, None
    if raw.startswith("["):  # [v6] or [v6]:port
        host, _, rest = raw[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif raw.count(":") == 1:
        host, port = raw.split(":")
    try:
        number = int(port) if port is not None else None
    except ValueError:
        raise ConfigError(f"{key}: the port of {text!r} is not a number") from None
    if number is not None and not 0 < number < 65536:
        raise ConfigError(f"{key}: the port of {text!r} is out of range")
    host = normalize(host)
    body = host[2:] if host.startswith("*.") else host
    if not body or "*" in body:
        raise ConfigError(f"{key}: {text!r}: a wildcard may only lead the name, as in *.example.com")
    return Rule(host, number)


class EgressPolicy:
    """Which requested names a sandbox may reach, and which of them may resolve to private addresses."""

    def __init__(self, allow: Sequence[str], private: Sequence[str] = ()) -> None:
        self.rules = [parse_rule(p) for p in allow]
        self.private = [parse_rule(p, PRIVATE_KEY) for p in private]
        for rule in self.private:
            if rule.host.startswith("*."):
                raise ConfigError(f"{PRIVATE_KEY}: {rule} is a wildcard; name each host whose private addresses a sandbox may reach")
            if not any(r.host == rule.host or r.matches(rule.host, rule.port or r.port or DEFAULT_PORTS[0]) for r in self.rules):
                raise ConfigError(f"{PRIVATE_KEY}: {rule} is not allowed by {CONFIG_KEY}; add it there too")

    def rule_for(self, host: str, port: int) -> Rule | None:
        return next((r for r in self.rules if r.matches(host, port)), None)

    def private_ok(self, host: str, port: int) -> bool:
        return any(r.matches(host, port) if r.port is not None else r.host == host for r in self.private)


def address_problem(address: str, private_ok: bool) -> str | None:
    """Why a sandbox may not connect to `address`, or None."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if is_metadata(ip) or ip.is_link_local:
        return f"{ip} is a link-local / cloud metadata address, never reachable from a sandbox"
    if ip.is_unspecified or ip.is_multicast:
        return f"{ip} is an unspecified or multicast address"
    if not ip.is_global and not private_ok:
        return f"{ip} is a loopback or private address; list the exact name in {PRIVATE_KEY} to allow it"
    return None


def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses, as this machine's resolver gives them (unique, in order)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def system_connect(address: str, port: int) -> socket.socket:
    return socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)


@dataclass(frozen=True)
class Decision:
    """One request through the egress proxy and what became of it."""

    rollout_id: str
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str | None = None

    @property
    def destination(self) -> str:
        return f"{self.host}:{self.port}"


class EgressError(Exception):
    """A request the proxy answers itself (status and a body saying what to change)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def sandbox_env(port: int) -> dict[str, str]:
    """The variables that send a sandbox's HTTP(S) clients through the egress proxy (model proxy direct)."""
    url = f"http://127.0.0.1:{port}"
    no_proxy = "127.0.0.1,localhost"
    return {"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url, "NO_PROXY": no_proxy, "no_proxy": no_proxy}


def sandbox_port(proxy_port: int | None) -> int:
    """The egress proxy's port inside a sandbox: not the model proxy's."""
    return SANDBOX_PORT + 1 if proxy_port == SANDBOX_PORT else SANDBOX_PORT


class EgressGate:
    """Serves connections from sandboxes as a forward proxy under one policy; counts decisions per rollout."""

    def __init__(self, policy: EgressPolicy, resolve: Resolver | None = None, connect: Connector | None = None) -> None:
        self.policy = policy
        self.resolve = resolve or system_resolve
        self.connect = connect or system_connect
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, dict[str, int]]] = {}  # rollout → destination → {"allowed"|"denied": n}

    def handler(self, rollout_id: str) -> Callable[[socket.socket], None]:
        """What a sandbox's egress port runs for each connection."""
        return lambda conn: self.handle(conn, rollout_id)

    def handle(self, conn: socket.socket, rollout_id: str) -> None:
        """Serve one client connection: CONNECT tunnel or one absolute-URI request; then close it."""
        method, host, port = "?", "?", 0
        try:
            head, rest = _read_head(conn)
            method, host, port, forward = _parse(head)
            up, address = self._open(host, port)
        except EgressError as exc:
            self._record(Decision(rollout_id, method, host, port, False, str(exc)))
            _answer(conn, exc.status, str(exc))
            return
        except OSError:
            conn.close()
            return
        self._record(Decision(rollout_id, method, host, port, True, "allowed", address))
        try:
            if forward is None:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up.sendall(forward)
            if rest:
                up.sendall(rest)
        except OSError:
            conn.close()
            up.close()
            return
        splice(conn, up)

    def _open(self, host: str, port: int) -> tuple[socket.socket, str]:
        """The checked connection to an allowed name, or EgressError saying why not (nothing opened then)."""
        if self.policy.rule_for(host, port) is None:
            raise EgressError(403, f"forgetui egress: {host}:{port} is not allowed; add \"{host}:{port}\" (or a pattern for it) to {CONFIG_KEY}")
        try:
            addresses = self.resolve(host, port)
        except OSError as exc:
            raise EgressError(502, f"forgetui egress: cannot resolve {host}: {exc}") from exc
        if not addresses:
            raise EgressError(502, f"forgetui egress: {host} has no address")
        private_ok = self.policy.private_ok(host, port)
        for address in addresses:
            if problem := address_problem(address, private_ok):
                raise EgressError(403, f"forgetui egress: {host} resolves to {problem}")
        error: OSError | None = None
        for address in addresses:
            try:
                return self.connect(address, port), address
            except OSError as exc:
                error = exc
        raise EgressError(502, f"forgetui egress: {host}:{port} does not answer ({error})")

    def _record(self, d: Decision) -> None:
        outcome = "allowed" if d.allowed else "denied"
        with self._lock:
            per = self._counts.setdefault(d.rollout_id, {}).setdefault(d.destination, {})
            per[outcome] = per.get(outcome, 0) + 1
        if d.allowed:
            log.info("egress %s: %s %s allowed (%s)", d.rollout_id, d.method, d.destination, d.address)
        else:
            log.warning("egress %s: %s %s denied: %s", d.rollout_id, d.method, d.destination, d.reason)

    def counts(self, rollout_id: str, *, pop: bool = False) -> dict[str, Any] | None:
        """``{"allowed": n, "denied": n, "destinations": {host:port: {...}}}`` for a rollout, or None if it made no request."""
        with self._lock:
            per = self._counts.pop(rollout_id, None) if pop else self._counts.get(rollout_id)
            if per is None:
                return None
            per = {dest: dict(c) for dest, c in per.items()}
        total = {k: sum(c.get(k, 0) for c in per.values()) for k in ("allowed", "denied")}
        return {**total, "destinations": per}


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """The request head (up to the blank line) and whatever body bytes came with it."""
    conn.settimeout(HEAD_TIMEOUT_S)
    buf = bytearray()
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > MAX_HEAD:
            raise EgressError(431, "forgetui egress: request head too large")
        data = conn.recv(65536)
        if not data:
            raise OSError("the client closed before sending a request")
        buf += data
    return bytes(buf[: end + 4]), bytes(buf[end + 4 :])


def _parse(head: bytes) -> tuple[str, str, int, bytes | None]:
    """(method, host, port, the head to send upstream or None for CONNECT) of a proxy request."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise EgressError(400, "forgetui egress: malformed request line")
    method, target, version = parts
    if method.upper() == "CONNECT":
        parts_ = urlsplit(f"//{target}")
        if not parts_.hostname or not parts_.port:
            raise EgressError(400, "forgetui egress: CONNECT needs host:port")
        return method, normalize(parts_.hostname), parts_.port, None
    url = urlsplit(target)
    if url.scheme.lower() != "http" or not url.hostname:
        raise EgressError(400, "forgetui egress: send http:// URLs as absolute URIs and https:// through CONNECT (set HTTP_PROXY/HTTPS_PROXY)")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    # Host is always the checked name (a client's own Host could pick another site behind a shared front)
    headers = [f"Host: {url.netloc.rpartition('@')[2]}"]
    headers += [h for h in lines[1:] if h and h.split(":", 1)[0].strip().lower() not in HOP_HEADERS | {"host"}]
    forward = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close", "", ""]).encode("latin-1")
    return method, normalize(url.hostname), url.port or 80, forward


def _answer(conn: socket.socket, status: int, reason: str) -> None:
    body = (reason + "\n").encode()
    phrase = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    try:
        conn.sendall(head.encode() + body)
    except OSError:
        pass
    finally:
        conn.close()
