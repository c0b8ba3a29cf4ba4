"""The pod ``exec`` websocket: v5/v4 channel framing, stdin in frames, pings, and the exit status.

Written on websocket-client rather than ``kubernetes.stream.stream`` because that helper is wrong
for a multi-threaded runner: it swaps ``call_api`` on the shared ``ApiClient`` while it runs (other
threads' REST calls turn into websocket handshakes, and overlapping execs can leave the swap in
place), its connect has no timeout, it sends stdin as one frame, and its ``returncode`` raises
TypeError/KeyError on an empty or detail-less error channel. Protocol, as the API server speaks it:
every frame is binary, its first byte the channel (0 stdin, 1 stdout, 2 stderr, 3 error: a
``metav1.Status`` JSON sent once at the end, 4 resize); v5 adds ``255 <channel>`` to close a
channel (stdin EOF). Nothing here depends on closing stdin: callers send byte counts.
"""

from __future__ import annotations

import json
import selectors
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from core.errors import SandboxError

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255
FRAME_BYTES = 1 << 20  # stdin per frame; the API server refuses messages over 32 MiB


class ExecStreamError(SandboxError):
    """The exec connection failed or dropped; ``status`` is the handshake's HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ExecStatusError(SandboxError):
    """The error channel reported no exit code (InternalError, a Failure without details, garbage); empty: ExecStreamError."""


@dataclass
class ExecOutcome:
    """What came back: output, the raw error-channel message, and whether the server ended the stream."""

    stdout: bytes
    stderr: bytes
    status: bytes
    finished: bool
    protocol: str


def exec_url(configuration: Any, namespace: str, pod: str, container: str, command: list[str], stdin: bool) -> str:
    """The ``ws(s)://`` URL of ``pods/exec``, one ``command`` parameter per argv item."""
    base = configuration.host.rstrip("/")
    base = "wss" + base[5:] if base.startswith("https") else "ws" + base[4:] if base.startswith("http") else base
    query = [("command", arg) for arg in command]
    query += [("container", container), ("stdin", str(stdin).lower()), ("stdout", "true"), ("stderr", "true"), ("tty", "false")]
    return f"{base}/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/exec?{urlencode(query)}"


def _auth_headers(configuration: Any) -> list[str]:
    headers = []
    for setting in configuration.auth_settings().values():  # refreshes expiring tokens (exec plugins)
        if setting.get("in") == "header" and setting.get("value"):
            headers.append(f"{setting['key']}: {setting['value']}")
    return headers


def _ssl_options(configuration: Any, url: str) -> dict[str, Any]:
    if url.startswith("wss://") and configuration.verify_ssl:
        import certifi

        opts: dict[str, Any] = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": configuration.ssl_ca_cert or certifi.where()}
        if configuration.assert_hostname is not None:
            opts["check_hostname"] = configuration.assert_hostname
    else:
        opts = {"cert_reqs": ssl.CERT_NONE}
    if configuration.cert_file:
        opts["certfile"] = configuration.cert_file
    if configuration.key_file:
        opts["keyfile"] = configuration.key_file
    if getattr(configuration, "tls_server_name", None):
        opts["server_hostname"] = configuration.tls_server_name
    return opts


def connect(configuration: Any, url: str, timeout_s: float) -> Any:
    """An open exec websocket (v5 preferred, v4 accepted); raises ExecStreamError."""
    import websocket
    from kubernetes.stream.ws_client import websocket_proxycare

    options: dict[str, Any] = {"header": _auth_headers(configuration), "subprotocols": [V5, V4], "timeout": timeout_s}
    if configuration.proxy or configuration.proxy_headers:
        options = websocket_proxycare(options, configuration, url, None)
    ws = websocket.WebSocket(sslopt=_ssl_options(configuration, url), skip_utf8_validation=True)
    try:
        ws.connect(url, **options)
    except websocket.WebSocketBadStatusException as exc:
        body = exc.resp_body.decode(errors="replace") if isinstance(exc.resp_body, bytes) else str(exc.resp_body or "")
        raise ExecStreamError(f"exec refused: HTTP {exc.status_code} {_status_message(body)}", exc.status_code) from exc
    except (websocket.WebSocketException, OSError) as exc:
        raise ExecStreamError(f"exec connection failed: {type(exc).__name__}: {exc}") from exc
    return ws


def _status_message(body: str) -> str:
    try:
        return str(json.loads(body).get("message", body))[:500]
    except ValueError:
        return body[:500]


def _readable(ws: Any, waiting: selectors.BaseSelector, timeout_s: float) -> bool:
    """Whether a frame can be read within ``timeout_s`` (a selector: ``select()`` fails on descriptors past 1024)."""
    sock = ws.sock
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    return bool(waiting.select(max(0.0, timeout_s)))


def run(ws: Any, stdin: bytes | None, deadline_s: float, *, ping_s: float, stall_s: float, moving_s: float | None = None) -> ExecOutcome:
    """Send ``stdin`` in frames, read until the server closes or ``deadline_s`` passes (finished=False).

    A connection that answers nothing, pings included, for ``ping_s + stall_s`` raises ExecStreamError.
    With ``moving_s`` the deadline moves to at least that long after each stdout frame: a download of
    unknown size ends only when its bytes stop coming, not at a fixed time.
    """
    import websocket

    protocol = ws.subprotocol or V4
    out, err, status = bytearray(), bytearray(), bytearray()
    end = time.monotonic() + deadline_s
    waiting = selectors.DefaultSelector()
    try:
        waiting.register(ws.sock, selectors.EVENT_READ)
        if stdin:
            for i in range(0, len(stdin), FRAME_BYTES):
                ws.send_binary(bytes([STDIN]) + stdin[i : i + FRAME_BYTES])
        if stdin is not None and protocol == V5:
            ws.send_binary(bytes([CLOSE, STDIN]))
        heard = pinged = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= end:
                return ExecOutcome(bytes(out), bytes(err), bytes(status), False, protocol)
            if now - heard > ping_s + stall_s:
                raise ExecStreamError(f"the API server sent nothing, not even a pong, for {now - heard:.0f}s")
            if now - max(heard, pinged) >= ping_s:
                ws.ping()
                pinged = now
            if not _readable(ws, waiting, min(end - now, ping_s, 1.0)):
                continue
            opcode, frame = ws.recv_data_frame(True)
            heard = time.monotonic()
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                return ExecOutcome(bytes(out), bytes(err), bytes(status), True, protocol)
            if opcode not in (websocket.ABNF.OPCODE_BINARY, websocket.ABNF.OPCODE_TEXT) or not frame.data:
                continue
            data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
            channel, payload = data[0], data[1:]
            if channel == STDOUT:
                out += payload
                if moving_s is not None:
                    end = max(end, heard + moving_s)
            elif channel == STDERR:
                err += payload
            elif channel == ERROR:
                status += payload
    except websocket.WebSocketConnectionClosedException:
        # a close without a close frame: the stream ended; the status (if any) says how
        return ExecOutcome(bytes(out), bytes(err), bytes(status), True, protocol)
    except (websocket.WebSocketException, OSError) as exc:
        raise ExecStreamError(f"exec connection dropped: {type(exc).__name__}: {exc}") from exc
    finally:
        waiting.close()
        try:
            ws.close(timeout=1)
        except Exception:  # noqa: BLE001 - closing a dead socket
            pass


def exit_code(status: bytes) -> int:
    """The command's exit code from the error channel's ``metav1.Status``; ExecStatusError when it has none."""
    text = status.decode(errors="replace").strip()
    if not text:  # the stream was cut (a load balancer, an API server restart) or the pod went: the caller asks which
        raise ExecStreamError("exec ended without an exit status (its stream was cut, or the pod was deleted, evicted or hit its deadline)")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ExecStatusError(f"exec ended with an unreadable status: {text[:200]!r}") from exc
    if not isinstance(obj, dict):
        raise ExecStatusError(f"exec ended with an unreadable status: {text[:200]!r}")
    if obj.get("status") == "Success":
        return 0
    causes = (obj.get("details") or {}).get("causes") or []
    if obj.get("reason") == "NonZeroExitCode":
        for cause in causes:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message", ""))
                except ValueError:
                    break
    raise ExecStatusError(f"exec failed: {obj.get('reason') or obj.get('status') or 'unknown'}: {obj.get('message', '')}".strip())


__all__ = ["ExecOutcome", "ExecStatusError", "ExecStreamError", "connect", "exec_url", "exit_code", "run"]
