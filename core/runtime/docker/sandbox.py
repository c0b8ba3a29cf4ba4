"""A Docker sandbox: one rollout's container, driven through the docker SDK.

Each container runs under docker's init, with CPU, memory (no swap) and pid limits, all capabilities dropped except the few a root user needs to install packages and
own files, ``no-new-privileges``, never privileged, and no Docker socket mounted. Its first process is the
rollout's `Entry` (the harness) when there is one, then a keep-alive (``sleep``) for the verifier;
other commands run with ``exec``. Both run under ``timeout --signal=KILL`` (the whole process group
dies on timeout), plus a host-side deadline in case the engine stalls.

Why the entry is the container's own process: an engine exec is a runc process spawned inside
containerd and costs about as much CPU as a third of a container start. Files go in before the
container starts (one archive), the harness's output comes back over an attach stream, and the end
of the harness is a one-time marker written by a small ``sh`` wrapper. The marker is sent on the
container's stdin, so the harness cannot read it from the wrapper's command line and fake its end.

Reads of files (what verifiers do) go straight to the container's root filesystem on the host when
the engine is local and uses overlayfs, opened without following symlinks; otherwise, or when the
path is not a plain file, through the engine's archive API (which spawns a process per call).

Network (``SandboxSpec.network``):

* ``isolated`` (default): the container's network namespace has loopback only and no route; the
  proxy (``SandboxSpec.proxy``) answers at the same ``127.0.0.1:<port>`` through a forwarder
  container (see ``core.runtime.docker.network``), and nothing else on the host or beyond can be reached.
  Without ``proxy`` the sandbox has no network at all. With ``egress_allow`` a second loopback port
  serves the egress proxy (``core.runtime.docker.egress``: the named destinations only) and the sandbox's
  environment has ``HTTP_PROXY``/``HTTPS_PROXY`` (and lower-case) pointing at it, ``NO_PROXY`` for loopback.
* ``host`` (opt-in, logged as a warning): the container shares the host's network namespace, so
  it can reach every service the host can (live store endpoint, local databases, metadata).
* ``bridge``: Docker's bridge; the host is reachable as ``host.docker.internal`` (the bridge
  gateway), so is every host service listening on all addresses, and the internet. The proxy must
  listen on the gateway address (or 0.0.0.0), not only on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import posixpath
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime.base import Entry, ExecResult, SandboxFile, SandboxSpec, parse_memory, shell_command
from core.runtime.docker import egress as E
from core.runtime.docker import network as N
from core.runtime.docker.ports import SandboxPorts

log = logging.getLogger(__name__)

# Capabilities a root user in the sandbox keeps: enough for apt/npm/pip installs and file ownership.
KEEP_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
DEADLINE_GRACE_S = 10.0  # host-side deadline = timeout_s + this
LIFETIME_GRACE_S = 600  # the keep-alive outlives spec.timeout_s by this, then the container exits
# The entry wrapper: reads the exit marker from stdin (then closes it), runs the command in its
# folder, writes the marker on stderr and marker + exit code on stdout (the engine copies the two
# streams independently, so both must end before the output is complete), and keeps the container
# up for the verifier.
ENTRY_SCRIPT = (
    'IFS= read -r mark; exec 0</dev/null; life=$1; dir=$2; shift 2; '
    'if cd "$dir"; then "$@"; rc=$?; else rc=126; fi; '
    'printf "%s\\n" "$mark" >&2; printf "%s%d\\n" "$mark" "$rc"; exec sleep "$life"'
)
# Paths the engine mounts over the image (or that are not files at all): never read from the host.
ENGINE_MOUNTED = ("/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf")


def _docker() -> Any:
    import docker

    return docker


def _requests_errors() -> tuple[type[BaseException], ...]:
    """What the docker SDK's HTTP layer raises when the engine's socket does not answer."""
    import requests

    return (requests.exceptions.ConnectionError, requests.exceptions.Timeout)


class DockerSandbox:
    """One rollout's container."""

    def __init__(
        self,
        client: Any,
        spec: SandboxSpec,
        *,
        pull: bool = True,
        relay: N.HostRelay | None = None,
        netns_target: tuple[str, int] | None = None,
        on_netns_unusable: Any = None,
        netns: bool = False,
        egress: E.EgressGate | None = None,
    ) -> None:
        self._client = client
        self._pull = pull
        self.spec = spec
        self.name = C.sandbox_name(spec.run_id, spec.rollout_id)
        self._ports = SandboxPorts(  # isolated network: the proxy's and egress proxy's ports on its loopback
            client, spec, self.name, relay=relay, netns_target=netns_target, netns=netns,
            on_netns_unusable=on_netns_unusable, egress=egress,
        )
        self.egress_port = self._ports.egress_port
        self._container: Any = None
        self._stopped = False
        self._transcript: list[str] = []
        self._entry: Entry | None = None
        self._entry_mark = ""
        self._entry_started = 0.0
        self._attach: Any = None  # the entry's attach stream, until its marker arrives
        self._rootfs: str | None = None  # the container's root on this host, when files can be read there

    @property
    def id(self) -> str:
        return self._container.id if self._container is not None else self.name

    def _life(self) -> str:
        spec = self.spec
        return str(math.ceil(spec.timeout_s) + LIFETIME_GRACE_S) if spec.timeout_s and spec.timeout_s > 0 else "infinity"

    def run_kwargs(self, entry: Entry | None = None) -> dict[str, Any]:
        """The ``containers.run`` arguments for this spec (exposed for inspection and tests)."""
        spec = self.spec
        life = self._life()
        command = ["sleep", life]
        if entry is not None:
            argv = C.timeout_wrap(shell_command(entry.command), entry.timeout_s)
            if entry.env:
                argv = ["env", *(f"{k}={v}" for k, v in entry.env.items()), *argv]
            workdir = C.absolute(entry.workdir or spec.workdir, spec.workdir)
            command = ["sh", "-c", ENTRY_SCRIPT, "sh", life, workdir, *argv]
        mem = parse_memory(spec.memory)
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "command": command,
            "name": self.name,
            "detach": True,
            "init": True,
            "labels": spec.all_labels(),
            "environment": {**(E.sandbox_env(self.egress_port) if self.egress_port else {}), **spec.env},
            "working_dir": spec.workdir,
            "nano_cpus": int(spec.cpus * 1e9),
            "mem_limit": mem,
            "memswap_limit": mem,
            "pids_limit": spec.pids_limit,
            "privileged": False,
            "cap_drop": ["ALL"],
            "cap_add": list(KEEP_CAPS),
            "security_opt": ["no-new-privileges"],
            "network_mode": self._ports.network_mode(),
            "stdin_open": entry is not None,
            "tty": False,
        }
        if spec.network == "bridge":
            kwargs["extra_hosts"] = {"host.docker.internal": "host-gateway"}
        if spec.volumes:  # the shared harness: one volume for every task's sandbox, never writable from one
            kwargs["volumes"] = {name: {"bind": path, "mode": "ro"} for name, path in spec.volumes.items()}
        return kwargs

    def _ensure_image(self) -> None:
        docker = _docker()
        image = self.spec.image
        try:
            self._client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        if not self._pull:
            raise SandboxError(
                f"image {image!r} is not on this Docker engine: build it first (`forgetui images`) or pull it"
            )
        log.info("image %s is not local; pulling it", image)
        try:
            self._client.images.pull(image)
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"image {image!r} is not on this Docker engine and pulling it failed: build it first "
                f"(`forgetui images`), or check the name and your registry login ({exc.explanation or exc})"
            ) from exc

    def _start_blocking(self, files: Sequence[SandboxFile], entry: Entry | None) -> Any:
        docker = _docker()
        self._ports.start_forwarder(self._life(), self._ensure_image)
        try:
            kwargs = self.run_kwargs(entry)
            kwargs.pop("detach")
            try:  # the image is almost always there: look it up (and pull) only when create says it is not
                container = self._client.containers.create(**kwargs)
            except docker.errors.ImageNotFound:
                self._ensure_image()
                container = self._client.containers.create(**kwargs)
        except BaseException:
            self._ports.remove_forwarder()
            raise
        try:
            if files:  # into the created container: one archive, no exec
                archive = C.tar_files([(C.absolute(f.path, self.spec.workdir), f.data, f.mode) for f in files])
                if not self._client.api.put_archive(container.id, "/", archive):
                    raise SandboxError(f"copying {len(files)} file(s) into sandbox {self.name} failed")
            if entry is not None:
                self._entry_mark = f"\x1eforgetui-exit-{secrets.token_hex(16)}:"
                self._attach = self._client.api.attach_socket(
                    container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
                )
            container.start()
            self._rootfs = _host_rootfs(container)
            self._ports.open_in_namespace(container, self._rootfs)  # before the harness runs: it waits for the marker below
            if entry is not None:
                self._entry_started = time.monotonic()
                _send_all(self._attach, self._entry_mark.encode() + b"\n")
        except BaseException:
            self._close_attach()
            self._ports.close_listeners()
            container.remove(force=True)
            self._ports.remove_forwarder()
            raise
        return container

    async def start(self, files: Sequence[SandboxFile] = (), entry: Entry | None = None) -> None:
        if self._container is not None:
            return
        docker = _docker()
        try:
            self._container = await asyncio.to_thread(self._start_blocking, files, entry)
        except SandboxError:
            raise
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"could not start sandbox {self.name} from {self.spec.image!r}: {exc}"
            ) from exc
        except Exception as exc:  # requests ConnectionError etc.: the engine went away
            raise SandboxError(f"Docker engine unreachable while starting {self.name}: {exc}") from exc
        self._entry = entry
        log.debug("started sandbox %s (%s) from %s", self.name, self._container.short_id, self.spec.image)

    def _read_entry_blocking(self) -> tuple[int, bytes, bytes]:
        """Read the attach stream up to the entry's exit marker: (exit code, stdout, stderr)."""
        from docker.utils.socket import frames_iter

        mark = self._entry_mark.encode()
        out, err = bytearray(), bytearray()
        at, err_at = -1, -1
        try:
            for stream, data in frames_iter(self._attach, False):
                found = _append_find(err if stream == 2 else out, data, mark)
                if stream == 2:
                    err_at = err_at if err_at >= 0 else found
                else:
                    at = at if at >= 0 else found
                if at >= 0 and err_at >= 0 and out.find(b"\n", at) >= 0:
                    break
        except (OSError, ValueError) as exc:  # the socket broke, or was closed at the host-side deadline
            raise self._gone(exc) from exc
        finally:
            self._close_attach()
        end = out.find(b"\n", at) if at >= 0 else -1
        if end < 0:
            raise self._gone(RuntimeError("its first process ended before the harness reported an exit code"))
        return int(out[at + len(mark) : end] or b"-1"), bytes(out[:at]), bytes(err[:err_at] if err_at >= 0 else err)

    async def wait_entry(self) -> ExecResult:
        entry = self._entry
        if entry is None or self._attach is None:
            raise RuntimeError(f"sandbox {self.name} was started without an entry command")
        argv = shell_command(entry.command)
        try:
            code, out, err = await asyncio.wait_for(
                asyncio.to_thread(self._read_entry_blocking), entry.timeout_s + DEADLINE_GRACE_S
            )
        except TimeoutError:
            self._close_attach()
            return self._record(argv, ExecResult(-1, "", f"timed out after {entry.timeout_s:g}s (host-side deadline)", True))
        elapsed = time.monotonic() - self._entry_started
        if code != 0:
            await self._require_forwarder()
        return self._record(argv, self._result(code, out, err, entry.timeout_s, elapsed))

    async def _require_forwarder(self) -> None:
        """A failure with the way to the proxy gone (forwarder killed) is the sandbox's loss, not the harness's."""
        lost = await self._ports.forwarder_lost()
        if lost is not None:
            raise self._gone(RuntimeError(lost))

    def _close_attach(self) -> None:
        sock, self._attach = self._attach, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _require(self) -> Any:
        if self._container is None:
            raise SandboxError(f"sandbox {self.name} was not started (call start() first)")
        if self._stopped:
            raise SandboxError(f"sandbox {self.name} was stopped")
        return self._container

    def _gone(self, exc: Exception) -> SandboxError:
        return SandboxError(
            f"sandbox {self.name} is gone: its container was removed, stopped or killed outside forgetui "
            f"(out of memory, `docker kill`, engine restart?): {exc}"
        )

    def _exec_blocking(
        self, cmd: list[str], env: dict[str, str] | None, workdir: str
    ) -> tuple[int, bytes, bytes]:
        docker = _docker()
        api = self._client.api
        container = self._require()
        try:
            exec_id = api.exec_create(
                container.id, cmd, environment=env, workdir=workdir, stdout=True, stderr=True
            )
            out, err = api.exec_start(exec_id, demux=True)
            code = api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.NotFound as exc:
            raise self._gone(exc) from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409 or "is not running" in str(exc):
                raise self._gone(exc) from exc
            raise SandboxError(f"exec in sandbox {self.name} failed: {exc}") from exc
        except _requests_errors() as exc:  # the engine went away (restart, crash): an infrastructure error
            raise SandboxError(f"Docker engine unreachable during an exec in sandbox {self.name}: {exc}") from exc
        if code is None:  # the exec never finished: the container died under it
            raise self._gone(RuntimeError("exec ended without an exit code"))
        return int(code), out or b"", err or b""

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout_s: float,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        argv = shell_command(cmd)
        wd = workdir or self.spec.workdir
        if stdin is not None:
            path = f"/tmp/.forgetui-stdin-{secrets.token_hex(4)}"
            await self.put_file(path, stdin, 0o600)
            argv = ["sh", "-c", f'"$@" < {path}; rc=$?; rm -f {path}; exit $rc', "sh", *argv]
        wrapped = C.timeout_wrap(argv, timeout_s)
        started = time.monotonic()
        try:
            code, out, err = await asyncio.wait_for(
                asyncio.to_thread(self._exec_blocking, wrapped, env, wd), timeout_s + DEADLINE_GRACE_S
            )
        except TimeoutError:
            log.warning("exec in %s passed its host-side deadline; reporting a timeout", self.name)
            return self._record(argv, ExecResult(-1, "", f"timed out after {timeout_s:g}s (host-side deadline)", True))
        if code != 0:
            await self._require_forwarder()
        return self._record(argv, self._result(code, out, err, timeout_s, time.monotonic() - started))

    @staticmethod
    def _result(code: int, out: bytes, err: bytes, timeout_s: float, elapsed: float) -> ExecResult:
        timed_out = code in (124, 137) and elapsed >= math.ceil(timeout_s) - 0.5
        return ExecResult(code, out.decode(errors="replace"), err.decode(errors="replace"), timed_out)

    def _record(self, argv: list[str], result: ExecResult) -> ExecResult:
        self._transcript.append(C.transcript_entry(argv, result.exit_code, result.stdout, result.stderr, result.timed_out))
        return result

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = C.absolute(path, self.spec.workdir)
        await self._put_archive("/", C.tar_file(target, data, mode))

    async def put_dir(self, local_dir: Path | str, remote_dir: str) -> None:
        local = Path(local_dir)
        if not local.is_dir():
            raise FileNotFoundError(f"{local} is not a directory")
        target = C.absolute(remote_dir, self.spec.workdir)
        res = await self.exec(["mkdir", "-p", target], timeout_s=30)
        if res.exit_code != 0:
            raise SandboxError(f"cannot create {target} in sandbox {self.name}: {res.stderr.strip()}")
        await self._put_archive(target, await asyncio.to_thread(C.tar_dir, local))

    async def _put_archive(self, path: str, archive: bytes) -> None:
        docker = _docker()
        container = self._require()
        try:
            ok = await asyncio.to_thread(self._client.api.put_archive, container.id, path, archive)
        except docker.errors.NotFound as exc:
            raise self._gone(exc) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"copying files into sandbox {self.name} at {path} failed: {exc}") from exc
        if not ok:
            raise SandboxError(f"copying files into sandbox {self.name} at {path} failed")

    async def get_file(self, path: str) -> bytes:
        docker = _docker()
        container = self._require()
        target = C.absolute(path, self.spec.workdir)
        data = await self._read_on_host(target)
        if data is not None:
            return data

        def fetch() -> bytes:
            stream, _stat = self._client.api.get_archive(container.id, target)
            return b"".join(stream)

        try:
            archive = await asyncio.to_thread(fetch)
        except docker.errors.NotFound as exc:
            if await self._alive():
                raise FileNotFoundError(f"{target} does not exist in sandbox {self.name}") from exc
            raise self._gone(exc) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"reading {target} from sandbox {self.name} failed: {exc}") from exc
        return C.untar_file(archive, target)

    async def _read_on_host(self, target: str) -> bytes | None:
        """``target``'s bytes read through the host's mount of the container root, or None to ask the engine."""
        root = self._rootfs
        target = posixpath.normpath(target)
        if root is None or any(target == m or target.startswith(m + "/") for m in ENGINE_MOUNTED):
            return None
        try:
            return await asyncio.to_thread(C.read_beneath, root, target)
        except FileNotFoundError:
            if os.path.ismount(root):  # still mounted: the file is really missing
                raise FileNotFoundError(f"{target} does not exist in sandbox {self.name}") from None
            return None  # unmounted under us: the container stopped; the engine says how
        except OSError:
            return None

    async def _alive(self) -> bool:
        docker = _docker()
        try:
            await asyncio.to_thread(self._container.reload)
        except docker.errors.NotFound:
            return False
        return self._container.status == "running"

    async def logs(self) -> str:
        """A transcript of every exec (commands, exit codes, output).

        The container's own output is not fetched: its main process is forgetui's silent keep-alive,
        and asking the engine for it costs an API round trip per rollout.
        """
        return "\n\n".join(self._transcript)

    async def stop(self) -> None:
        if self._container is None or self._stopped:
            self._stopped = True
            return
        docker = _docker()
        self._stopped = True
        self._rootfs = None
        self._close_attach()
        self._ports.close_listeners()
        try:
            await asyncio.to_thread(self._container.remove, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise SandboxError(
                    f"could not remove sandbox {self.name}: {exc} (run `forgetui gc`)"
                ) from exc
        finally:  # after the sandbox: it lives in the forwarder's network namespace
            try:
                await asyncio.to_thread(self._ports.remove_forwarder)
            except docker.errors.APIError as exc:
                log.warning("could not remove the network forwarder of %s: %s (run `forgetui gc`)", self.name, exc)
        log.debug("removed sandbox %s", self.name)


def _append_find(buf: bytearray, data: bytes, mark: bytes) -> int:
    """Append ``data`` to ``buf``; where ``mark`` starts in ``buf`` (also across the seam), or -1."""
    start = max(0, len(buf) - len(mark))
    buf += data
    return buf.find(mark, start)


def _send_all(sock: Any, data: bytes) -> None:
    """Write to an attach socket (docker-py hands back a raw socket, or a SocketIO around one)."""
    raw = getattr(sock, "_sock", sock)
    raw.sendall(data)


def _host_rootfs(container: Any) -> str | None:
    """The running container's overlay root as mounted on this host, or None (remote or other engines, no access)."""
    graph = container.attrs.get("GraphDriver") or {}
    merged = (graph.get("Data") or {}).get("MergedDir")
    if not merged or not str(graph.get("Name", "")).startswith("overlay"):
        return None
    return merged if os.path.ismount(merged) else None
