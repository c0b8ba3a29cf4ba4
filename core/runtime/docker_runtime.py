"""Docker sandboxes: one container per rollout, driven through the docker SDK.

Each container runs a keep-alive (``sleep``) under docker's init, with CPU, memory (no swap) and
pid limits, all capabilities dropped except the few a root user needs to install packages and
own files, ``no-new-privileges``, never privileged, and no Docker socket mounted. Commands run
with ``exec`` under ``timeout --signal=KILL`` (the whole process group dies on timeout), plus a
host-side deadline in case the engine stalls.

Network trade-off (``SandboxSpec.network``):

* ``host`` (default): the container shares the host's network namespace, so the recording proxy
  is reachable at ``127.0.0.1:<port>`` and nothing else needs configuring. The sandbox is not
  isolated from the host's network: it can reach every service the host can.
* ``bridge``: the container gets its own network namespace on Docker's bridge; the host is
  reachable as ``host.docker.internal`` (mapped to the bridge gateway). Isolated, but the proxy
  must listen on the gateway address (or 0.0.0.0), not only on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from pathlib import Path
from typing import Any

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime import labels as L
from core.runtime.base import ExecResult, SandboxSpec, parse_memory, shell_command

log = logging.getLogger(__name__)

# Capabilities a root user in the sandbox keeps: enough for apt/npm/pip installs and file ownership.
KEEP_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
DEADLINE_GRACE_S = 10.0  # host-side deadline = timeout_s + this
LIFETIME_GRACE_S = 600  # the keep-alive outlives spec.timeout_s by this, then the container exits


def _docker() -> Any:
    import docker

    return docker


class DockerSandbox:
    """One rollout's container."""

    def __init__(self, client: Any, spec: SandboxSpec, *, pull: bool = True) -> None:
        self._client = client
        self._pull = pull
        self.spec = spec
        self.name = C.sandbox_name(spec.run_id, spec.rollout_id)
        self._container: Any = None
        self._stopped = False
        self._transcript: list[str] = []

    @property
    def id(self) -> str:
        return self._container.id if self._container is not None else self.name

    def run_kwargs(self) -> dict[str, Any]:
        """The ``containers.run`` arguments for this spec (exposed for inspection and tests)."""
        spec = self.spec
        lifetime = ["sleep", "infinity"]
        if spec.timeout_s and spec.timeout_s > 0:
            lifetime = ["sleep", str(math.ceil(spec.timeout_s) + LIFETIME_GRACE_S)]
        mem = parse_memory(spec.memory)
        kwargs: dict[str, Any] = {
            "image": spec.image,
            "command": lifetime,
            "name": self.name,
            "detach": True,
            "init": True,
            "labels": spec.all_labels(),
            "environment": dict(spec.env),
            "working_dir": spec.workdir,
            "nano_cpus": int(spec.cpus * 1e9),
            "mem_limit": mem,
            "memswap_limit": mem,
            "pids_limit": spec.pids_limit,
            "privileged": False,
            "cap_drop": ["ALL"],
            "cap_add": list(KEEP_CAPS),
            "security_opt": ["no-new-privileges"],
            "network_mode": spec.network,
            "stdin_open": False,
            "tty": False,
        }
        if spec.network == "bridge":
            kwargs["extra_hosts"] = {"host.docker.internal": "host-gateway"}
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

    def _start_blocking(self) -> Any:
        docker = _docker()
        kwargs = self.run_kwargs()
        kwargs.pop("detach")
        try:  # the image is almost always there: look it up (and pull) only when create says it is not
            container = self._client.containers.create(**kwargs)
        except docker.errors.ImageNotFound:
            self._ensure_image()
            container = self._client.containers.create(**kwargs)
        try:
            container.start()
        except BaseException:
            container.remove(force=True)
            raise
        return container

    async def start(self) -> None:
        if self._container is not None:
            return
        docker = _docker()
        try:
            self._container = await asyncio.to_thread(self._start_blocking)
        except SandboxError:
            raise
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"could not start sandbox {self.name} from {self.spec.image!r}: {exc}"
            ) from exc
        except Exception as exc:  # requests ConnectionError etc.: the engine went away
            raise SandboxError(f"Docker engine unreachable while starting {self.name}: {exc}") from exc
        log.debug("started sandbox %s (%s) from %s", self.name, self._container.short_id, self.spec.image)

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
            result = ExecResult(-1, "", f"timed out after {timeout_s:g}s (host-side deadline)", True)
            self._transcript.append(C.transcript_entry(argv, -1, "", result.stderr, True))
            return result
        elapsed = time.monotonic() - started
        timed_out = code in (124, 137) and elapsed >= math.ceil(timeout_s) - 0.5
        result = ExecResult(code, out.decode(errors="replace"), err.decode(errors="replace"), timed_out)
        self._transcript.append(C.transcript_entry(argv, code, result.stdout, result.stderr, timed_out))
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
        try:
            await asyncio.to_thread(self._container.remove, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise SandboxError(
                    f"could not remove sandbox {self.name}: {exc} (run `forgetui gc`)"
                ) from exc
        log.debug("removed sandbox %s", self.name)


class DockerRuntime:
    """Sandboxes as local Docker containers (``docker.from_env()`` unless a client is given)."""

    name = "docker"

    def __init__(self, client: Any = None, *, pull: bool = True) -> None:
        self._client = client
        self.pull = pull  # pull a missing image from its registry before failing

    @property
    def client(self) -> Any:
        if self._client is None:
            docker = _docker()
            try:
                self._client = docker.from_env()
            except docker.errors.DockerException as exc:
                raise SandboxError(
                    f"cannot reach a Docker engine ({exc}); start one (`sudo dockerd`, or .ci/docker-up.sh) "
                    "or set DOCKER_HOST"
                ) from exc
        return self._client

    def available(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:
            return False

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        return DockerSandbox(self.client, spec, pull=self.pull)

    async def reap(self, run_id: str | None = None, owner: str | None = None) -> int:
        sel = L.selector(run_id, owner)
        filters = {"label": [f"{k}={v}" for k, v in sel.items()]}
        docker = _docker()
        containers = await asyncio.to_thread(self.client.containers.list, all=True, filters=filters)
        removed = 0
        for container in containers:
            if not L.matches(container.labels, sel):
                continue
            try:
                await asyncio.to_thread(container.remove, force=True)
                removed += 1
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                log.warning("could not remove container %s: %s", container.name, exc)
        if removed:
            log.info("reaped %d forgetui container(s) (%s)", removed, sel)
        return removed
