"""One rollout's pod: start it, run commands and copy files over exec, delete it (gracefully)."""

from __future__ import annotations

import asyncio
import io
import math
import secrets
import shlex
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime.base import Entry, EntryByExec, ExecResult, SandboxFile, SandboxSpec, shell_command
from core.runtime.k8s import exec_ws, harness
from core.runtime.k8s.api import RETRY_STATUSES, backoff_s, status_of
from core.runtime.k8s.manifest import CONTAINER, in_registry
from core.runtime.k8s.startup import StartWatch, read_state

if TYPE_CHECKING:
    from core.runtime.k8s.runtime import KubernetesRuntime

DEADLINE_GRACE_S = 10.0  # client-side deadline = the command's timeout + this
COPY_BASE_S = 60.0  # a copy's deadline: this + COPY_S_PER_MIB per MiB
COPY_S_PER_MIB = 2.0
GONE_EXIT = 137  # what a command killed with its pod reports
# Unpack N bytes of tar from stdin into a folder: `head -c` ends the input, so nothing waits for a stdin
# EOF (only the v5 protocol can send one, and GNU tar reads its input to the end).
UNPACK = 'mkdir -p "$2" && head -c "$1" | tar xf - -C "$2"'
# The same, then run the unpacked script: a command's argv, env and stdin travel in the stream, not in
# the exec URL (API server audit logs record URLs).
UNPACK_AND_RUN = 'head -c "$1" | tar xf - -C / || exit 126; exec sh "$2" </dev/null'


def command_script(
    argv: list[str], workdir: str, env: dict[str, str], timeout_s: float, script: str, stdin_path: str | None, path_first: str | None = None
) -> str:
    """The shell script an exec runs: remove itself, take stdin, cd, set env, run under ``timeout --signal=KILL``.

    ``path_first``: a folder put in front of the container's PATH (the shared harness's commands). A pod's
    env could only replace the image's PATH; here the image's own PATH stays behind it, as on Docker.
    """
    q = shlex.quote
    lines = [f"rm -f -- {q(script)}"]
    if stdin_path:
        lines.append(f"exec 0<{q(stdin_path)}; rm -f -- {q(stdin_path)}")
    if path_first:
        lines.append(f'PATH={q(path_first)}${{PATH:+:$PATH}}; export PATH')
    lines.append(f"cd -- {q(workdir)} || exit $?")
    env_part = " ".join(q(f"{k}={v}") for k, v in env.items())
    lines.append(f"exec {'env ' + env_part + ' ' if env_part else ''}{shlex.join(C.timeout_wrap(argv, timeout_s))}")
    return "\n".join(lines) + "\n"


def copy_deadline_s(size: int) -> float:
    return COPY_BASE_S + COPY_S_PER_MIB * size / (1 << 20)


class KubernetesSandbox:
    """One rollout's pod."""

    def __init__(self, runtime: KubernetesRuntime, spec: SandboxSpec) -> None:
        self.runtime = runtime
        self.spec = spec
        self.name = C.sandbox_name(spec.run_id, spec.rollout_id)
        self.namespace = runtime.cfg.namespace
        self._started = False
        self._stopped = False
        self._transcript: list[str] = []
        self._entry = EntryByExec()

    @property
    def id(self) -> str:
        return self.name

    def _gone(self, detail: str) -> SandboxError:
        return SandboxError(
            f"sandbox {self.name} is gone: pod {self.namespace}/{self.name} was deleted, evicted, killed or "
            f"past its deadline outside forgetui ({detail})"
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, files: Sequence[SandboxFile] = (), entry: Entry | None = None) -> None:
        if self._started:
            return
        await self.runtime.prepare_run(self.spec)
        manifest = self.runtime.build_pod_manifest(self.spec, self.name)
        api = self.runtime.api
        await asyncio.to_thread(
            api.call, f"creating pod {self.namespace}/{self.name}", api.core.create_namespaced_pod, self.namespace, manifest, ok=(409,)
        )  # 409: an earlier try that timed out did create it (the name is ours alone)
        self._started = True
        try:
            await self._wait_running()
            await self.runtime.check_proxy(self)
        except BaseException:
            await self.stop()
            raise
        if files:  # one upload for all of them: each exec is a round trip through the API server
            archive = C.tar_files([(C.absolute(f.path, self.spec.workdir), f.data, f.mode) for f in files])
            await self._untar(archive, "/")
        await self._entry.begin(self, (), entry)

    async def _wait_running(self) -> None:
        watch = StartWatch(self.name, in_registry(self.spec.image, self.runtime.registry), self.runtime.cfg)
        api = self.runtime.api
        while True:
            pod = await asyncio.to_thread(api.call, f"reading pod {self.name}", api.core.read_namespaced_pod, self.name, self.namespace, ok=(404,))
            if pod is None:
                raise self._gone("deleted while starting")
            state = read_state(pod)
            try:
                if watch.check(state):
                    return
            except SandboxError as exc:
                if state.ended and state.container:  # an init container failed: what it said is the useful part
                    raise SandboxError(f"{exc}: {await self._container_log_tail(state.container)}") from exc
                raise
            await asyncio.sleep(self.runtime.poll_interval_s)

    async def _container_log_tail(self, container: str, chars: int = 1500) -> str:
        api = self.runtime.api
        try:
            text = await asyncio.to_thread(
                api.call, f"reading logs of {self.name}/{container}", api.core.read_namespaced_pod_log, self.name, self.namespace, container=container
            )
        except SandboxError as exc:
            return f"[its logs are unavailable: {exc}]"
        return (text or "").strip()[-chars:] or "[it logged nothing]"

    async def wait_entry(self) -> ExecResult:
        return await self._entry.wait()

    async def stop(self) -> None:
        """Delete the pod with its grace period (never a force delete: the kubelet must confirm the containers ended)."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        self._entry.cancel()
        api = self.runtime.api
        await asyncio.to_thread(
            api.call,
            f"deleting pod {self.namespace}/{self.name} (run `forgetui gc` to retry)",
            api.core.delete_namespaced_pod,
            self.name,
            self.namespace,
            grace_period_seconds=self.runtime.cfg.termination_grace_s,
            propagation_policy="Background",
            ok=(404,),
        )

    def _require(self) -> None:
        if not self._started:
            raise SandboxError(f"sandbox {self.name} was not started (call start() first)")
        if self._stopped:
            raise SandboxError(f"sandbox {self.name} was stopped")

    # -- exec -------------------------------------------------------------------------------

    def _alive_blocking(self) -> bool:
        try:
            pod = self.runtime.api.call(f"reading pod {self.name}", self.runtime.api.core.read_namespaced_pod, self.name, self.namespace)
        except SandboxError as exc:
            return status_of(exc.__cause__ or exc) != 404
        state = read_state(pod)
        return state.running and not state.deleting

    def _exec_blocking(
        self, command: list[str], stdin: bytes | None, deadline_s: float, moving_s: float | None = None
    ) -> tuple[int | None, bytes, bytes]:
        """(exit code, or None when ``deadline_s`` passed; stdout; stderr). A lost pod raises the "gone" SandboxError."""
        cfg = self.runtime.cfg
        url = exec_ws.exec_url(self.runtime.api.configuration, self.namespace, self.name, CONTAINER, command, stdin is not None)
        try:
            ws = self._connect_blocking(url)
            outcome = exec_ws.run(ws, stdin, deadline_s, ping_s=cfg.ping_interval_s, stall_s=cfg.request_timeout_s, moving_s=moving_s)
            if not outcome.finished:
                return None, outcome.stdout, outcome.stderr
            code = exec_ws.exit_code(outcome.status)
        except SandboxError as exc:
            if not self._alive_blocking():
                raise self._gone(str(exc)) from exc
            raise SandboxError(f"exec in pod {self.name} failed: {exc}") from exc
        if code == GONE_EXIT and not self._alive_blocking():
            raise self._gone("the command was killed with its pod")
        return code, outcome.stdout, outcome.stderr

    def _connect_blocking(self, url: str) -> Any:
        """The exec websocket; a refused or failed handshake (429/5xx, a dropped connection) started nothing, so it is retried."""
        cfg = self.runtime.cfg
        for attempt in range(cfg.api_retries + 1):
            try:
                return exec_ws.connect(self.runtime.api.configuration, url, cfg.request_timeout_s)
            except exec_ws.ExecStreamError as exc:
                if attempt >= cfg.api_retries or (exc.status is not None and exc.status not in RETRY_STATUSES):
                    raise
                time.sleep(backoff_s(attempt))
        raise AssertionError("unreachable")

    async def _run(
        self, command: list[str], stdin: bytes | None, deadline_s: float, moving_s: float | None = None
    ) -> tuple[int | None, bytes, bytes]:
        self._require()
        return await asyncio.to_thread(self._exec_blocking, command, stdin, deadline_s, moving_s)

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
        tag = secrets.token_hex(6)
        script = f"/tmp/.forgetui-exec-{tag}.sh"
        stdin_path = f"/tmp/.forgetui-stdin-{tag}" if stdin is not None else None
        path_first = harness.BIN if self.spec.volumes else None
        text = command_script(argv, workdir or self.spec.workdir, dict(env or {}), timeout_s, script, stdin_path, path_first)
        files = [(script.lstrip("/"), text.encode(), 0o600)]
        if stdin is not None and stdin_path:
            files.append((stdin_path.lstrip("/"), stdin, 0o600))
        archive = C.tar_files(files)
        command = ["sh", "-c", UNPACK_AND_RUN, "sh", str(len(archive)), script]
        started = time.monotonic()
        code, out, err = await self._run(command, archive, timeout_s + DEADLINE_GRACE_S + copy_deadline_s(len(archive)) - COPY_BASE_S)
        elapsed = time.monotonic() - started
        if code is None:
            result = ExecResult(-1, out.decode(errors="replace"), err.decode(errors="replace"), True)
        else:
            timed_out = code in (124, 137) and elapsed >= math.ceil(timeout_s) - 0.5
            result = ExecResult(code, out.decode(errors="replace"), err.decode(errors="replace"), timed_out)
        self._transcript.append(C.transcript_entry(argv, result.exit_code, result.stdout, result.stderr, result.timed_out))
        return result

    # -- files ------------------------------------------------------------------------------

    async def _untar(self, archive: bytes, target_dir: str) -> None:
        command = ["sh", "-c", UNPACK, "sh", str(len(archive)), target_dir]
        code, _out, err = await self._run(command, archive, copy_deadline_s(len(archive)))
        if code != 0:
            what = "timed out" if code is None else f"exit {code}"
            raise SandboxError(
                f"copying {len(archive)} bytes into pod {self.name} at {target_dir} failed ({what}): "
                f"{err.decode(errors='replace').strip()} (does the image have sh, head and tar?)"
            )

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = PurePosixPath(C.absolute(path, self.spec.workdir))
        await self._untar(C.tar_file(target.name, data, mode), str(target.parent))

    async def put_dir(self, local_dir: Path | str, remote_dir: str) -> None:
        local = Path(local_dir)
        if not local.is_dir():
            raise FileNotFoundError(f"{local} is not a directory")
        archive = await asyncio.to_thread(C.tar_dir, local)
        await self._untar(archive, C.absolute(remote_dir, self.spec.workdir))

    async def get_file(self, path: str) -> bytes:
        target = PurePosixPath(C.absolute(path, self.spec.workdir))
        command = ["sh", "-c", 'test -f "$1/$2" || exit 44; tar cf - -C "$1" "$2"', "sh", str(target.parent), target.name]
        # its size is unknown until it arrives: the deadline moves with the bytes (no byte for COPY_BASE_S ends it)
        code, out, err = await self._run(command, None, COPY_BASE_S, moving_s=COPY_BASE_S)
        if code is None:
            raise SandboxError(f"reading {target} from pod {self.name} timed out: no byte came for {COPY_BASE_S:.0f}s ({len(out)} bytes read)")
        if code == 44:
            raise FileNotFoundError(f"{target} does not exist in sandbox {self.name}")
        if code != 0:
            raise SandboxError(f"reading {target} from pod {self.name} failed (exit {code}): {err.decode(errors='replace')}")
        with tarfile.open(fileobj=io.BytesIO(out), mode="r:*") as tar:
            member = tar.extractfile(target.name)
            if member is None:
                raise IsADirectoryError(f"{target} is not a regular file")
            return member.read()

    async def logs(self) -> str:
        engine = ""
        if self._started and not self._stopped:
            api = self.runtime.api
            try:
                engine = await asyncio.to_thread(
                    api.call, f"reading logs of {self.name}", api.core.read_namespaced_pod_log, self.name, self.namespace, container=CONTAINER
                ) or ""
            except SandboxError:
                engine = "[pod logs unavailable]\n"
        return engine + "\n\n".join(self._transcript)


__all__ = ["KubernetesSandbox", "command_script"]
