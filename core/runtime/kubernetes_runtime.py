"""Kubernetes sandboxes: one pod per rollout, driven through the official ``kubernetes`` client.

A pod runs a keep-alive (``sleep infinity``) with ``restartPolicy: Never``, an
``activeDeadlineSeconds`` backstop, CPU/memory requests = limits, no service-account token,
``allowPrivilegeEscalation: false``, not privileged, all capabilities dropped and the runtime's
default seccomp profile. Commands run over the pod ``exec`` websocket under
``timeout --signal=KILL`` (plus a client-side deadline); files travel as tar streams over exec
(so the image needs ``tar`` and ``sh``). Pods run on the cluster network: harnesses reach the
recording proxy at ``proxy_public_url`` (exported to the pod as ``FORGETUI_PROXY_URL``), so the
proxy must be reachable from the cluster (a Service, an ingress, or a node address).
``SandboxSpec.pids_limit`` has no per-pod field in Kubernetes (it is a kubelet setting) and
``SandboxSpec.network`` is ignored: pods always use the pod network.
"""

from __future__ import annotations

import asyncio
import io
import logging
import math
import secrets
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from core.errors import SandboxError
from core.runtime import _common as C
from core.runtime import labels as L
from core.runtime.base import (
    Entry,
    EntryByExec,
    ExecResult,
    SandboxFile,
    SandboxSpec,
    k8s_memory,
    shell_command,
)

log = logging.getLogger(__name__)

CONTAINER = "sandbox"
DEADLINE_GRACE_S = 10.0
LIFETIME_GRACE_S = 600
_PULL_FAILURES = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
}


def _cpu(cpus: float) -> str:
    milli = max(1, int(round(cpus * 1000)))
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


class KubernetesRuntime:
    """Sandboxes as pods in one namespace."""

    name = "kubernetes"

    def __init__(
        self,
        namespace: str = "default",
        kubeconfig: str | Path | None = None,
        *,
        context: str | None = None,
        in_cluster: bool | None = None,
        image_pull_policy: str = "IfNotPresent",
        proxy_public_url: str | None = None,
        run_as_non_root: bool = False,
        run_as_user: int | None = None,
        service_account: str | None = None,
        node_selector: dict[str, str] | None = None,
        image_pull_secrets: list[str] | None = None,
        add_capabilities: tuple[str, ...] = (),
        start_timeout_s: float = 300.0,
        poll_interval_s: float = 1.0,
        api_client: Any = None,
    ) -> None:
        self.namespace = namespace
        self.kubeconfig = str(kubeconfig) if kubeconfig else None
        self.context = context
        self.in_cluster = in_cluster
        self.image_pull_policy = image_pull_policy
        self.proxy_public_url = proxy_public_url
        self.run_as_non_root = run_as_non_root
        self.run_as_user = run_as_user
        self.service_account = service_account
        self.node_selector = dict(node_selector or {})
        self.image_pull_secrets = list(image_pull_secrets or [])
        self.add_capabilities = tuple(add_capabilities)
        self.start_timeout_s = start_timeout_s
        self.poll_interval_s = poll_interval_s
        self._api_client = api_client
        self._core: Any = None

    # -- client -----------------------------------------------------------------------------

    @property
    def core(self) -> Any:
        """A ``CoreV1Api`` for the configured cluster (kubeconfig, or in-cluster service account)."""
        if self._core is None:
            from kubernetes import client, config

            api_client = self._api_client
            if api_client is None:
                try:
                    use_in_cluster = self.in_cluster
                    if use_in_cluster is None:
                        use_in_cluster = self.kubeconfig is None and _in_cluster_env()
                    if use_in_cluster:
                        cfg = client.Configuration()
                        config.load_incluster_config(client_configuration=cfg)
                    else:
                        cfg = client.Configuration()
                        config.load_kube_config(
                            config_file=self.kubeconfig, context=self.context, client_configuration=cfg
                        )
                except config.ConfigException as exc:
                    raise SandboxError(
                        f"cannot configure the Kubernetes client ({exc}); pass a kubeconfig path, set KUBECONFIG, "
                        "or run inside the cluster"
                    ) from exc
                api_client = client.ApiClient(cfg)
                self._api_client = api_client
            self._core = client.CoreV1Api(api_client)
        return self._core

    def available(self) -> bool:
        try:
            self.core.list_namespaced_pod(self.namespace, limit=1, _request_timeout=5)
            return True
        except Exception:
            return False

    # -- manifests --------------------------------------------------------------------------

    def build_pod_manifest(self, spec: SandboxSpec, name: str | None = None) -> dict[str, Any]:
        """The Pod object for ``spec`` (a plain dict, valid against the Kubernetes schema)."""
        name = name or C.sandbox_name(spec.run_id, spec.rollout_id)
        raw_labels = spec.all_labels()
        labels = {k: L.k8s_value(v) for k, v in raw_labels.items()}
        env = dict(spec.env)
        if self.proxy_public_url:
            env.setdefault("FORGETUI_PROXY_URL", self.proxy_public_url)
        container_sc: dict[str, Any] = {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {
                "drop": ["ALL"],
                **({"add": list(self.add_capabilities)} if self.add_capabilities else {}),
            },
        }
        if self.run_as_non_root:
            container_sc["runAsNonRoot"] = True
        if self.run_as_user is not None:
            container_sc["runAsUser"] = self.run_as_user
        resources = {"cpu": _cpu(spec.cpus), "memory": k8s_memory(spec.memory)}
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": CONTAINER,
                    "image": spec.image,
                    "imagePullPolicy": self.image_pull_policy,
                    "command": ["sleep", "infinity"],
                    "workingDir": spec.workdir,
                    "env": [{"name": k, "value": str(v)} for k, v in env.items()],
                    "resources": {"requests": dict(resources), "limits": dict(resources)},
                    "securityContext": container_sc,
                    "stdin": False,
                    "tty": False,
                }
            ],
        }
        if spec.timeout_s and spec.timeout_s > 0:
            pod_spec["activeDeadlineSeconds"] = math.ceil(spec.timeout_s) + LIFETIME_GRACE_S
        if self.run_as_non_root:
            pod_spec["securityContext"]["runAsNonRoot"] = True
        if self.service_account:
            pod_spec["serviceAccountName"] = self.service_account
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": s} for s in self.image_pull_secrets]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {
                    f"{k}-raw": v for k, v in raw_labels.items() if k in (L.RUN, L.ROLLOUT, L.OWNER)
                },
            },
            "spec": pod_spec,
        }

    def create(self, spec: SandboxSpec) -> KubernetesSandbox:
        return KubernetesSandbox(self, spec)

    async def reap(self, run_id: str | None = None, owner: str | None = None, *, stopped: bool = False) -> int:
        sel = {k: L.k8s_value(v) for k, v in L.selector(run_id, owner).items()}
        from kubernetes.client.exceptions import ApiException

        try:
            pods = await asyncio.to_thread(
                self.core.list_namespaced_pod, self.namespace, label_selector=L.k8s_selector(sel)
            )
        except ApiException as exc:
            raise SandboxError(
                f"cannot list pods in namespace {self.namespace}: {exc.status} {exc.reason}"
            ) from exc
        removed = 0
        for pod in pods.items:
            if not L.matches(pod.metadata.labels, sel):  # belt and braces: never touch what is not ours
                continue
            if stopped and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed")):
                continue
            try:
                await asyncio.to_thread(
                    self.core.delete_namespaced_pod, pod.metadata.name, self.namespace, grace_period_seconds=0
                )
                removed += 1
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("could not delete pod %s: %s %s", pod.metadata.name, exc.status, exc.reason)
        if removed:
            log.info("reaped %d forgetui pod(s) in %s (%s)", removed, self.namespace, sel)
        return removed


def _in_cluster_env() -> bool:
    import os

    return (
        bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    )


class KubernetesSandbox:
    """One rollout's pod."""

    def __init__(self, runtime: KubernetesRuntime, spec: SandboxSpec) -> None:
        self.runtime = runtime
        self.spec = spec
        self.name = C.sandbox_name(spec.run_id, spec.rollout_id)
        self.namespace = runtime.namespace
        self._started = False
        self._stopped = False
        self._transcript: list[str] = []
        self._entry = EntryByExec()

    @property
    def id(self) -> str:
        return self.name

    def _gone(self, detail: str) -> SandboxError:
        return SandboxError(
            f"sandbox {self.name} is gone: pod {self.namespace}/{self.name} was deleted, evicted or "
            f"failed outside forgetui ({detail})"
        )

    async def start(self, files: Sequence[SandboxFile] = (), entry: Entry | None = None) -> None:
        if not self._started:
            await self._create_pod()
            await self._entry.begin(self, files, entry)

    async def wait_entry(self) -> ExecResult:
        return await self._entry.wait()

    async def _create_pod(self) -> None:
        from kubernetes.client.exceptions import ApiException

        manifest = self.runtime.build_pod_manifest(self.spec, self.name)
        core = self.runtime.core
        try:
            await asyncio.to_thread(core.create_namespaced_pod, self.namespace, manifest)
        except ApiException as exc:
            raise SandboxError(
                f"could not create pod {self.namespace}/{self.name}: {exc.status} {exc.reason} {exc.body or ''}".strip()
            ) from exc
        except Exception as exc:
            raise SandboxError(f"Kubernetes API unreachable while creating {self.name}: {exc}") from exc
        self._started = True
        try:
            await self._wait_running()
        except BaseException:
            await self.stop()
            raise

    async def _wait_running(self) -> None:
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + self.runtime.start_timeout_s
        phase = "unknown"
        while True:
            try:
                pod = await asyncio.to_thread(
                    self.runtime.core.read_namespaced_pod, self.name, self.namespace
                )
            except ApiException as exc:
                if exc.status == 404:
                    raise self._gone("deleted while starting") from exc
                raise SandboxError(f"cannot read pod {self.name}: {exc.status} {exc.reason}") from exc
            status = pod.status
            phase = (status.phase if status else None) or "Pending"
            if phase == "Running":
                return
            if phase in ("Failed", "Succeeded"):
                raise SandboxError(
                    f"pod {self.name} ended while starting (phase {phase}: {getattr(status, 'reason', '')})"
                )
            for cs in (status.container_statuses or []) if status else []:
                waiting = cs.state.waiting if cs.state else None
                if waiting is not None and waiting.reason in _PULL_FAILURES:
                    raise SandboxError(
                        f"pod {self.name} cannot start image {self.spec.image!r}: {waiting.reason}: "
                        f"{waiting.message or ''} (is the image pushed to a registry the cluster can pull from? "
                        "`forgetui images --push REGISTRY`)"
                    )
            if time.monotonic() >= deadline:
                raise SandboxError(
                    f"pod {self.name} was not Running after {self.runtime.start_timeout_s:g}s (phase {phase}); "
                    "check `kubectl describe pod` for scheduling or image-pull problems"
                )
            await asyncio.sleep(self.runtime.poll_interval_s)

    def _require(self) -> None:
        if not self._started:
            raise SandboxError(f"sandbox {self.name} was not started (call start() first)")
        if self._stopped:
            raise SandboxError(f"sandbox {self.name} was stopped")

    def _alive_blocking(self) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            pod = self.runtime.core.read_namespaced_pod(self.name, self.namespace)
        except ApiException:
            return False
        return bool(pod.status and pod.status.phase == "Running" and not pod.metadata.deletion_timestamp)

    def _stream_blocking(
        self, command: list[str], stdin: bytes | None, deadline_s: float
    ) -> tuple[int | None, bytes, bytes]:
        """Run ``command`` over the exec websocket; returns (exit code or None on deadline, stdout, stderr)."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import stream

        core = self.runtime.core
        try:
            resp = stream(
                core.connect_get_namespaced_pod_exec,
                self.name,
                self.namespace,
                command=command,
                container=CONTAINER,
                stdin=stdin is not None,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == 404 or "404" in str(exc.reason) or not self._alive_blocking():
                raise self._gone(f"exec: {exc.reason}") from exc
            raise SandboxError(f"exec in pod {self.name} failed: {exc.status} {exc.reason}") from exc
        out, err = io.BytesIO(), io.BytesIO()
        try:
            if stdin is not None:
                resp.write_stdin(stdin)
                resp.close_channel(0)
            end = time.monotonic() + deadline_s
            while resp.is_open() and time.monotonic() < end:
                resp.update(timeout=min(1.0, max(0.0, end - time.monotonic())))
                out.write(resp.read_stdout(timeout=0) or b"")
                err.write(resp.read_stderr(timeout=0) or b"")
            out.write(resp.read_stdout(timeout=0) or b"")
            err.write(resp.read_stderr(timeout=0) or b"")
            if resp.is_open():
                return None, out.getvalue(), err.getvalue()
            code = resp.returncode
        finally:
            resp.close()
        return int(code if code is not None else -1), out.getvalue(), err.getvalue()

    async def _run(
        self, command: list[str], stdin: bytes | None, deadline_s: float
    ) -> tuple[int | None, bytes, bytes]:
        self._require()
        return await asyncio.to_thread(self._stream_blocking, command, stdin, deadline_s)

    def exec_command(
        self, cmd: list[str] | str, timeout_s: float, env: dict[str, str] | None, workdir: str | None
    ) -> list[str]:
        """The argv sent to the pod: cd to the workdir, set env, run under ``timeout --signal=KILL``."""
        argv = shell_command(cmd)
        env_args = [f"{k}={v}" for k, v in (env or {}).items()]
        inner = ["env", *env_args, *argv] if env_args else argv
        wd = workdir or self.spec.workdir
        return ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", wd, *C.timeout_wrap(inner, timeout_s)]

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
        if stdin is not None:
            path = f"/tmp/.forgetui-stdin-{secrets.token_hex(4)}"
            await self.put_file(path, stdin, 0o600)
            argv = ["sh", "-c", f'"$@" < {path}; rc=$?; rm -f {path}; exit $rc', "sh", *argv]
        command = self.exec_command(argv, timeout_s, env, workdir)
        started = time.monotonic()
        code, out, err = await self._run(command, None, timeout_s + DEADLINE_GRACE_S)
        elapsed = time.monotonic() - started
        if code is None:
            result = ExecResult(-1, out.decode(errors="replace"), err.decode(errors="replace"), True)
        else:
            timed_out = code in (124, 137) and elapsed >= math.ceil(timeout_s) - 0.5
            result = ExecResult(code, out.decode(errors="replace"), err.decode(errors="replace"), timed_out)
        self._transcript.append(
            C.transcript_entry(argv, result.exit_code, result.stdout, result.stderr, result.timed_out)
        )
        return result

    async def _untar(self, archive: bytes, target_dir: str) -> None:
        command = ["sh", "-c", 'mkdir -p "$1" && tar xf - -C "$1"', "sh", target_dir]
        code, _out, err = await self._run(command, archive, 120.0)
        if code != 0:
            raise SandboxError(
                f"copying files into pod {self.name} at {target_dir} failed (exit {code}): "
                f"{err.decode(errors='replace').strip()} (does the image have sh and tar?)"
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
        command = [
            "sh",
            "-c",
            'test -f "$1/$2" || exit 44; tar cf - -C "$1" "$2"',
            "sh",
            str(target.parent),
            target.name,
        ]
        code, out, err = await self._run(command, None, 120.0)
        if code == 44:
            raise FileNotFoundError(f"{target} does not exist in sandbox {self.name}")
        if code != 0:
            raise SandboxError(
                f"reading {target} from pod {self.name} failed (exit {code}): {err.decode(errors='replace')}"
            )
        with tarfile.open(fileobj=io.BytesIO(out), mode="r:*") as tar:
            member = tar.extractfile(target.name)
            if member is None:
                raise IsADirectoryError(f"{target} is not a regular file")
            return member.read()

    async def logs(self) -> str:
        from kubernetes.client.exceptions import ApiException

        engine = ""
        if self._started and not self._stopped:
            try:
                engine = await asyncio.to_thread(
                    self.runtime.core.read_namespaced_pod_log, self.name, self.namespace, container=CONTAINER
                )
            except ApiException:
                engine = "[pod logs unavailable]\n"
        return (engine or "") + "\n\n".join(self._transcript)

    async def stop(self) -> None:
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        self._entry.cancel()
        from kubernetes.client.exceptions import ApiException

        try:
            await asyncio.to_thread(
                self.runtime.core.delete_namespaced_pod, self.name, self.namespace, grace_period_seconds=0
            )
        except ApiException as exc:
            if exc.status != 404:
                raise SandboxError(
                    f"could not delete pod {self.namespace}/{self.name}: {exc.status} {exc.reason} (run `forgetui gc`)"
                ) from exc


__all__ = ["KubernetesRuntime", "KubernetesSandbox"]
