"""One rollout's pod: start it, run commands and copy files over exec, delete it (gracefully)."""

from __future__ import annotations

import asyncio
import io
import logging
import math
import secrets
import shlex
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime.base import Entry, EntryByExec, ExecResult, SandboxFile, SandboxSpec, shell_command
from core.runtime.k8s import detached, diagnose, exec_ws, harness
from core.runtime.k8s.api import RETRY_STATUSES, Api, backoff_s, status_of
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.manifest import CONTAINER, in_registry
from core.runtime.k8s.startup import StartWatch, read_state

log = logging.getLogger(__name__)
T = TypeVar("T")

DEADLINE_GRACE_S = 10.0  # client-side deadline = the command's timeout + this
COPY_BASE_S = 60.0  # a copy's deadline: this + COPY_S_PER_MIB per MiB
COPY_S_PER_MIB = 2.0
EVENTS_EVERY_S = 5.0  # while a pod fits no node: how often its Events are read (the scheduler's reason, an autoscaler's answer)
GONE_EXIT = 137  # what a command killed with its pod reports
# Unpack N bytes of tar from stdin into a folder: `head -c` ends the input, so nothing waits for a stdin
# EOF (only the v5 protocol can send one, and GNU tar reads its input to the end). A command's own script
# travels the same way (core.runtime.k8s.detached): its argv, env and stdin go in the stream, not in the
# exec URL (API server audit logs record URLs).
UNPACK = 'mkdir -p "$2" && head -c "$1" | tar xf - -C "$2"'
FALLBACK_HOME = "/tmp/forgetui-home"  # $HOME for a uid whose own is missing or not writable


class PodGone(SandboxError):
    """The pod was deleted, evicted, killed or is past its deadline: nothing more will run in it."""


class StreamLost(SandboxError):
    """An exec's stream failed or ended without a status while the pod lives: what ran may still be running."""


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
    # a uid without a passwd entry in the image (pod_security = "restricted" on an image without the sandbox user)
    # has HOME=/, which it cannot write: harnesses keep state under $HOME, so it gets one of its own
    lines.append(f'if [ -z "${{HOME:-}}" ] || [ ! -w "$HOME" ]; then HOME={FALLBACK_HOME}; export HOME; mkdir -p "$HOME"; fi')
    lines.append(f"cd -- {q(workdir)} || exit $?")
    env_part = " ".join(q(f"{k}={v}") for k, v in env.items())
    lines.append(f"exec {'env ' + env_part + ' ' if env_part else ''}{shlex.join(C.timeout_wrap(argv, timeout_s))}")
    return "\n".join(lines) + "\n"


def copy_deadline_s(size: int) -> float:
    return COPY_BASE_S + COPY_S_PER_MIB * size / (1 << 20)


class PodHost(Protocol):
    """What a pod's sandbox asks of the runtime that made it (`KubernetesRuntime`, which imports this module)."""

    cfg: KubernetesConfig
    api: Api
    registry: str | None
    poll_interval_s: float

    def build_pod_manifest(self, spec: SandboxSpec, name: str | None = None) -> dict[str, Any]: ...

    def live_pods(self, run_id: str) -> int: ...

    def count_pod(self, run_id: str, delta: int) -> None: ...

    def warn_quota(self, run_id: str, message: str) -> None: ...

    async def prepare_run(self, spec: SandboxSpec) -> None: ...

    async def admit(self, spec: SandboxSpec) -> bool: ...

    def admitted(self, spec: SandboxSpec, ok: bool) -> None: ...

    async def check_pod(self, sandbox: KubernetesSandbox) -> None: ...


class KubernetesSandbox:
    """One rollout's pod."""

    def __init__(self, runtime: PodHost, spec: SandboxSpec) -> None:
        self.runtime = runtime
        self.spec = spec
        self.name = C.sandbox_name(spec.run_id, spec.rollout_id)
        self.namespace = runtime.cfg.namespace
        self._started = False
        self._stopped = False
        self._transcript: list[str] = []
        self._entry = EntryByExec()
        self._finished_dirs: list[str] = []  # detached commands' folders, removed by the next launch
        self.node: str | None = None  # the node it runs on, and that node's address (once Running)
        self.host_ip: str | None = None

    @property
    def id(self) -> str:
        return self.name

    def _gone(self, detail: str, pod: Any = None) -> PodGone:
        """The "gone" error (blocking); with the pod's last state (``pod``), what ended it: an eviction, an OOM kill,
        the deadline, or its own process failing (then with its last log lines: an ``exec format error``, say)."""
        why = read_state(pod).ended if pod is not None else None
        text = f"{detail}{'; ' + why if why else ''}"
        if why and "container " + CONTAINER in why and not pod.metadata.deletion_timestamp:
            text += f"; its logs: {self._log_tail_blocking(CONTAINER)}"
        hint = diagnose.hint_for(text)
        return PodGone(
            f"sandbox {self.name} is gone: pod {self.namespace}/{self.name} was deleted, evicted, killed or "
            f"past its deadline outside forgetui, or its own process ended ({text}){'; ' + hint if hint else ''}"
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, files: Sequence[SandboxFile] = (), entry: Entry | None = None) -> None:
        if self._started:
            return
        await self.runtime.prepare_run(self.spec)
        first = await self.runtime.admit(self.spec)  # the run's first pod has its verdict before any other is created
        try:
            await self._create()
            self._started = True
            try:
                await self._wait_running()
                await self.runtime.check_pod(self)
            except BaseException:
                await self.stop()
                raise
        except BaseException:
            if first:
                self.runtime.admitted(self.spec, ok=False)
            raise
        if first:
            self.runtime.admitted(self.spec, ok=True)
        if files:  # one upload for all of them: each exec is a round trip through the API server
            archive = C.tar_files([(C.absolute(f.path, self.spec.workdir), f.data, f.mode) for f in files])
            await self._untar(archive, "/")
        await self._entry.begin(self, (), entry)

    async def _create(self) -> None:
        """Create the pod; a refusal for an exceeded ResourceQuota waits for quota (another pod's end), up to ``quota_wait_s``."""
        manifest = self.runtime.build_pod_manifest(self.spec, self.name)
        api, cfg = self.runtime.api, self.runtime.cfg
        give_up = time.monotonic() + cfg.quota_wait_s
        attempt = 0
        while True:
            try:
                await asyncio.to_thread(
                    api.call, f"creating pod {self.namespace}/{self.name}", api.core.create_namespaced_pod, self.namespace, manifest, ok=(409,)
                )  # 409: an earlier try that timed out did create it (the name is ours alone)
                self.runtime.count_pod(self.spec.run_id, 1)
                return
            except SandboxError as exc:
                if not _over_quota(exc):
                    raise _admission_hint(exc, cfg.pod_security) from exc
                live = self.runtime.live_pods(self.spec.run_id)
                advice = (
                    f"{live} pod(s) of this run are live: lower run.concurrency to {max(1, live)} (or raise the quota) to "
                    "stop waiting" if live else "no pod of this run is live: other workloads hold the quota; raise it or free some"
                )
                if time.monotonic() >= give_up:
                    raise SandboxError(f"{exc}: still over the namespace's ResourceQuota after {cfg.quota_wait_s:g}s; {advice}") from exc
                self.runtime.warn_quota(self.spec.run_id, f"{exc}: waiting up to {cfg.quota_wait_s:g}s for quota; {advice}")
                await asyncio.sleep(min(backoff_s(attempt) * 2, 15.0, max(0.1, give_up - time.monotonic())))
                attempt += 1

    async def _wait_running(self) -> None:
        watch = StartWatch(self.name, in_registry(self.spec.image, self.runtime.registry), self.runtime.cfg)
        api = self.runtime.api
        events_read = 0.0
        while True:
            pod = await asyncio.to_thread(api.call, f"reading pod {self.name}", api.core.read_namespaced_pod, self.name, self.namespace, ok=(404,))
            if pod is None:
                raise self._gone("deleted while starting")
            state = read_state(pod)
            if not state.scheduled and state.message and time.monotonic() - events_read >= EVENTS_EVERY_S:
                # the scheduler's reason at once, and whether a cluster autoscaler is adding a node for it
                events = await asyncio.to_thread(diagnose.events_text, api, self.namespace, self.name)
                watch.autoscaling = "TriggeredScaleUp" in events and "NotTriggerScaleUp" not in events
                if not events_read:
                    log.warning("pod %s fits no node yet: %s%s", self.name, state.message, f" (events: {events})" if events else "")
                events_read = time.monotonic()
            try:
                if watch.check(state):
                    self.node = pod.spec.node_name if pod.spec else None
                    self.host_ip = pod.status.host_ip if pod.status else None
                    return
            except SandboxError as exc:
                raise SandboxError(await self._diagnosis(str(exc), state)) from exc
            await asyncio.sleep(self.runtime.poll_interval_s)

    async def _diagnosis(self, error: str, state: Any) -> str:
        """``error`` with what explains it: the failed container's last log lines, the pod's Events, a known cause."""
        parts = [error]
        if state.ended:  # a failed init container or main container: what it said is the useful part
            parts.append(f"its logs: {await self._container_log_tail(state.container or CONTAINER)}")
        events = await asyncio.to_thread(diagnose.events_text, self.runtime.api, self.namespace, self.name)
        if events:
            parts.append(f"events: {events}")
        hint = diagnose.hint_for(" ".join(parts))
        return "; ".join(parts) + (f"; {hint}" if hint else "")

    async def _container_log_tail(self, container: str) -> str:
        return await asyncio.to_thread(self._log_tail_blocking, container)

    def _log_tail_blocking(self, container: str, chars: int = 1500) -> str:
        api = self.runtime.api
        try:
            text = api.call(f"reading logs of {self.name}/{container}", api.core.read_namespaced_pod_log, self.name, self.namespace, container=container)
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
        self.runtime.count_pod(self.spec.run_id, -1)
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

    def _pod_blocking(self) -> tuple[bool, Any]:
        """(alive, the pod as last read or None): a pod the API cannot answer about counts as alive."""
        try:
            pod = self.runtime.api.call(f"reading pod {self.name}", self.runtime.api.core.read_namespaced_pod, self.name, self.namespace)
        except SandboxError as exc:
            return status_of(exc.__cause__ or exc) != 404, None
        state = read_state(pod)
        return state.running and not state.deleting, pod

    def _alive_blocking(self) -> bool:
        return self._pod_blocking()[0]

    def _exec_blocking(
        self, command: list[str], stdin: bytes | None, deadline_s: float, moving_s: float | None = None
    ) -> tuple[int | None, bytes, bytes]:
        """(exit code, or None when ``deadline_s`` passed; stdout; stderr).

        A lost pod raises PodGone; a stream that failed or ended without a status while the pod lives raises
        StreamLost (what it ran may still run); an error status from the server, a SandboxError.
        """
        cfg = self.runtime.cfg
        url = exec_ws.exec_url(self.runtime.api.configuration, self.namespace, self.name, CONTAINER, command, stdin is not None)
        try:
            ws = self._connect_blocking(url)
            outcome = exec_ws.run(ws, stdin, deadline_s, ping_s=cfg.ping_interval_s, stall_s=cfg.request_timeout_s, moving_s=moving_s)
            if not outcome.finished:
                return None, outcome.stdout, outcome.stderr
            code = exec_ws.exit_code(outcome.status)
        except SandboxError as exc:
            alive, pod = self._pod_blocking()
            if not alive:
                raise self._gone(str(exc), pod) from exc
            if isinstance(exc, exec_ws.ExecStreamError) and exc.status in (401, 403):  # a refusal is final: nothing to reattach
                raise SandboxError(
                    f"exec in pod {self.name} was refused ({exc}): this identity may not create/get pods/exec in "
                    f"{self.namespace}: grant it (examples/kubernetes-rbac.yaml)"
                ) from exc
            lost = StreamLost if isinstance(exc, exec_ws.ExecStreamError) else SandboxError
            raise lost(f"exec in pod {self.name} failed: {exc}") from exc
        if code == GONE_EXIT:
            alive, pod = self._pod_blocking()
            if not alive:
                raise self._gone("the command was killed with its pod", pod)
        if code in (126, 127) and diagnose.EXEC_FORMAT in outcome.stderr.decode(errors="replace").lower():
            # the image cannot run its own `sh`: nothing forgetui runs there will (its main process failed the same way)
            alive, pod = self._pod_blocking()
            detail = f"{command[0]} in pod {self.name} cannot run: {outcome.stderr.decode(errors='replace').strip()[-300:]}"
            raise self._gone(detail, pod) if not alive else SandboxError(f"{detail}; {diagnose.EXEC_FORMAT_HINT}")
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

    def _reattaching(self, what: str, step: Callable[[], T]) -> T:
        """``step()``, tried again while its stream is lost and the pod lives, for up to ``reattach_s`` (then a SandboxError)."""
        give_up = time.monotonic() + self.runtime.cfg.reattach_s
        attempt = 0
        while True:
            try:
                return step()
            except StreamLost as exc:
                if time.monotonic() >= give_up:
                    raise SandboxError(f"{what}: its stream stayed lost for {self.runtime.cfg.reattach_s:g}s: {exc}") from exc
                delay = min(backoff_s(attempt), max(0.0, give_up - time.monotonic()))
                log.info("%s: %s; reattaching in %.1fs", what, exc, delay)
                time.sleep(delay)
                attempt += 1

    async def _run(
        self, command: list[str], stdin: bytes | None, deadline_s: float, moving_s: float | None = None
    ) -> tuple[int | None, bytes, bytes]:
        self._require()
        return await asyncio.to_thread(self._exec_blocking, command, stdin, deadline_s, moving_s)

    async def _run_again_if_lost(
        self, what: str, command: list[str], stdin: bytes | None, deadline_s: float, moving_s: float | None = None
    ) -> tuple[int | None, bytes, bytes]:
        """``_run`` for commands that may run twice (a copy in or out): a lost stream runs them again."""
        self._require()
        return await asyncio.to_thread(self._reattaching, what, lambda: self._exec_blocking(command, stdin, deadline_s, moving_s))

    def _detached_blocking(self, run_dir: str, script: str, stdin: bytes | None, timeout_s: float) -> tuple[int | None, bytes, bytes]:
        """Run ``script`` detached in the pod from ``run_dir`` (core.runtime.k8s.detached).

        (exit code, or None when the deadline passed; stdout; stderr). A lost stream is reattached: the next
        poll reads on from the bytes already received, for up to ``reattach_s`` without an answer.
        """
        files = [(f"{run_dir}/{detached.SCRIPT}", script.encode(), 0o600)]
        if stdin is not None:
            files.append((f"{run_dir}/{detached.STDIN}", stdin, 0o600))
        archive = C.tar_files(files)
        finished, self._finished_dirs = self._finished_dirs, []
        upload_s = copy_deadline_s(len(archive)) - COPY_BASE_S
        deadline = time.monotonic() + timeout_s + DEADLINE_GRACE_S + upload_s
        what = f"a command in pod {self.name}"
        out, err = bytearray(), bytearray()

        def launch() -> detached.Report:
            command = ["sh", "-c", detached.LAUNCH, "sh", str(len(archive)), run_dir, str(detached.WINDOW_S), *finished]
            code, o, e = self._exec_blocking(command, archive, detached.WINDOW_S + DEADLINE_GRACE_S + upload_s)
            if code is None:
                raise StreamLost(f"its launch sent nothing for {detached.WINDOW_S + DEADLINE_GRACE_S + upload_s:g}s")
            if code != 0:
                raise SandboxError(
                    f"starting {what} failed (exit {code}): {e.decode(errors='replace').strip()[-500:]} "
                    "(does the image have sh, head, tail, sleep and tar?)"
                )
            return detached.parse(o, e)

        def poll() -> detached.Report | None:
            command = ["sh", "-c", detached.POLL, "sh", run_dir, str(len(out)), str(len(err)), str(detached.WINDOW_S)]
            code, o, e = self._exec_blocking(command, None, detached.WINDOW_S + DEADLINE_GRACE_S)
            if code is None:
                raise StreamLost(f"a poll sent nothing for {detached.WINDOW_S + DEADLINE_GRACE_S:g}s")
            if code == detached.NO_FOLDER:
                return None
            if code == detached.NOT_STARTED:  # unpacked a moment ago by a launch whose stream was cut: it starts now
                raise StreamLost(f"{run_dir} has no pid yet")
            if code == detached.VANISHED:
                raise SandboxError(f"{what} was killed without an exit code ({run_dir})")
            if code != 0:
                raise SandboxError(f"polling {what} failed (exit {code}): {e.decode(errors='replace').strip()[-500:]}")
            return detached.parse(o, e)

        launched = False  # True once the launch answered or a poll found its folder
        step, heard, attempt = launch, time.monotonic(), 0
        while True:
            try:
                report = step()
            except StreamLost as exc:  # the command (or its launch) may still be running: the next poll says
                if time.monotonic() - heard >= self.runtime.cfg.reattach_s:
                    raise SandboxError(f"{what}: its stream stayed lost for {self.runtime.cfg.reattach_s:g}s: {exc}") from exc
                delay = backoff_s(attempt)
                log.info("%s: %s; reattaching in %.1fs", what, exc, delay)
                time.sleep(delay)
                step, attempt = poll, attempt + 1
                continue
            heard, attempt = time.monotonic(), 0
            if report is None:  # no folder: the launch never got as far as unpacking it
                if launched:
                    raise SandboxError(f"{what} lost its folder {run_dir} (was /tmp cleaned?)")
                step = launch
                continue
            launched = True
            out += report.stdout
            err += report.stderr
            if report.code is not None:
                self._finished_dirs.append(run_dir)  # removed by the next launch
                return report.code, bytes(out), bytes(err)
            if time.monotonic() >= deadline:
                return None, bytes(out), bytes(err)
            step = poll

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout_s: float,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``cmd`` detached in the pod: a dropped exec stream reattaches (core.runtime.k8s.detached)."""
        self._require()
        argv = shell_command(cmd)
        run_dir = detached.folder(secrets.token_hex(6))
        stdin_path = f"{run_dir}/{detached.STDIN}" if stdin is not None else None
        path_first = harness.BIN if self.spec.volumes else None
        script = command_script(argv, workdir or self.spec.workdir, dict(env or {}), timeout_s, f"{run_dir}/{detached.SCRIPT}", stdin_path, path_first)
        started = time.monotonic()
        code, out, err = await asyncio.to_thread(self._detached_blocking, run_dir, script, stdin, timeout_s)
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
        code, _out, err = await self._run_again_if_lost(f"copying into pod {self.name}", command, archive, copy_deadline_s(len(archive)))
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
        code, out, err = await self._run_again_if_lost(f"reading {target} from pod {self.name}", command, None, COPY_BASE_S, moving_s=COPY_BASE_S)
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


def _over_quota(exc: SandboxError) -> bool:
    """A pod creation refused by a ResourceQuota (403 ``exceeded quota``): it may fit once another pod ends."""
    return status_of(exc.__cause__ or exc) == 403 and "exceeded quota" in str(exc)


def _admission_hint(exc: SandboxError, pod_security: str) -> SandboxError:
    """A pod creation refused by Pod Security admission, with what to change; other errors as they are."""
    text = str(exc)
    if status_of(exc.__cause__ or exc) != 403 or "violates PodSecurity" not in text:
        return exc
    if "restricted volume types" in text:
        hint = "an image volume is not on your cluster's restricted list of volume types: set runtime.kubernetes.harness_mount = \"init\""
    elif pod_security != "restricted" and '"restricted' in text:
        hint = "the namespace enforces the restricted level: set runtime.kubernetes.pod_security = \"restricted\" (uid 1000, no capabilities)"
    else:
        hint = "the namespace's pod-security.kubernetes.io/enforce level refuses this pod: see runtime.kubernetes.pod_security"
    return SandboxError(f"{text}: {hint}")


__all__ = ["KubernetesSandbox", "PodGone", "StreamLost", "command_script"]
