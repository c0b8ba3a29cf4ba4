"""Kubernetes sandboxes at the API boundary: a kmock API server, schema-validated manifests.

The exec websocket itself is not emulated: `kubernetes.stream.stream` is replaced by a stand-in
that runs the requested argv as a local process (the pod's workdir is a temp folder), so the
command construction, stdin/stdout/stderr handling, exit codes, timeouts and tar file transfer are
tested for real; the websocket framing (client library code) is not.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from typing import Any

import kmock
import kubernetes_validate
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from core.errors import SandboxError
from core.runtime import labels as L
from core.runtime.base import Entry, SandboxFile, SandboxSpec
from core.runtime.kubernetes_runtime import KubernetesRuntime
from core.runtime.reaper import reap_orphans

K8S_VERSION = "1.30.0"
PODS = kmock.resource("v1/pods")


def _spec(**kw: Any) -> SandboxSpec:
    base = {
        "image": "registry.example/forgetui/env:abc",
        "run_id": "run/1",
        "rollout_id": "r 7",
        "owner": "ann",
    }
    return SandboxSpec(**{**base, **kw})


@pytest.fixture()
def runtime(kmock: kmock.KubernetesEmulator) -> KubernetesRuntime:
    cfg = client.Configuration(host=str(kmock.url).rstrip("/"))
    return KubernetesRuntime(
        "sandboxes", api_client=client.ApiClient(cfg), poll_interval_s=0.05, start_timeout_s=20
    )


def _requests(km: kmock.KubernetesEmulator) -> list[tuple[str, str]]:
    return [
        (str(r.method).split(".")[-1], r.url.path if hasattr(r.url, "path") else str(r.url)) for r in list(km)
    ]


async def _set_phase_when_created(km: kmock.KubernetesEmulator, status: dict[str, Any]) -> None:
    while True:
        for (resource, _ns, _name), obj in list(km.objects.items()):
            if resource == PODS and not obj.deleted:
                obj.patch({"status": status})
                return
        await asyncio.sleep(0.02)


def test_manifest_is_valid_and_locked_down():
    rt = KubernetesRuntime(
        "sandboxes", proxy_public_url="http://proxy.forgetui:8000", run_as_non_root=True, run_as_user=1000
    )
    spec = _spec(cpus=1.5, memory="2g", env={"A": "1"}, labels={"team": "x"}, timeout_s=900)
    manifest = rt.build_pod_manifest(spec)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    meta, pod = manifest["metadata"], manifest["spec"]
    assert meta["namespace"] == "sandboxes"
    assert meta["labels"] == {
        L.MANAGED: "true",
        L.RUN: "run_1",
        L.ROLLOUT: "r_7",
        L.OWNER: "ann",
        "team": "x",
    }
    assert meta["annotations"][f"{L.RUN}-raw"] == "run/1"
    assert pod["restartPolicy"] == "Never" and pod["activeDeadlineSeconds"] == 1500
    assert pod["automountServiceAccountToken"] is False
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["sleep", "infinity"]
    assert ctr["resources"]["limits"] == {"cpu": "1500m", "memory": "2Gi"} == ctr["resources"]["requests"]
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000
    assert {"name": "FORGETUI_PROXY_URL", "value": "http://proxy.forgetui:8000"} in ctr["env"]
    assert {"name": "A", "value": "1"} in ctr["env"]


def test_manifest_variants_validate():
    for kw in ({}, {"cpus": 2, "memory": "512m", "timeout_s": 0}, {"memory": "1024"}):
        rt = KubernetesRuntime(
            "ns", node_selector={"pool": "cpu"}, image_pull_secrets=["regcred"], service_account="sb"
        )
        manifest = rt.build_pod_manifest(_spec(**kw))
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    broken = KubernetesRuntime("ns").build_pod_manifest(_spec())
    broken["spec"]["containers"][0]["securityContext"]["privileged"] = "no"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


async def test_start_waits_for_running_then_stop_deletes(kmock, runtime):
    sb = runtime.create(_spec())
    setter = asyncio.create_task(_set_phase_when_created(kmock, {"phase": "Running"}))
    await sb.start()
    await setter
    (key,) = [k for k in kmock.objects if k[0] == PODS]
    stored = kmock.objects[key]
    assert key[1:] == ("sandboxes", sb.name)
    assert (
        stored["metadata"]["labels"][L.RUN] == "run_1" and stored["metadata"]["labels"][L.MANAGED] == "true"
    )
    assert stored["spec"]["containers"][0]["image"] == "registry.example/forgetui/env:abc"
    await sb.stop()
    await sb.stop()  # idempotent: no second DELETE
    calls = _requests(kmock)
    assert calls[0] == ("POST", "/api/v1/namespaces/sandboxes/pods")
    assert set(calls[1:-1]) == {("GET", f"/api/v1/namespaces/sandboxes/pods/{sb.name}")}
    assert calls[-1] == ("DELETE", f"/api/v1/namespaces/sandboxes/pods/{sb.name}")
    assert list(kmock)[-1].params.get("gracePeriodSeconds") == "0"
    assert stored.deleted


async def test_image_pull_failure_is_reported_and_pod_removed(kmock, runtime):
    sb = runtime.create(_spec())
    status = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "sandbox",
                "image": "x",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull access denied"}},
            }
        ],
    }
    setter = asyncio.create_task(_set_phase_when_created(kmock, status))
    with pytest.raises(SandboxError, match="ImagePullBackOff.*pull access denied"):
        await sb.start()
    await setter
    assert _requests(kmock)[-1] == ("DELETE", f"/api/v1/namespaces/sandboxes/pods/{sb.name}")


async def test_reap_deletes_only_our_pods_of_that_run(kmock, runtime):
    core = runtime.core

    def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }

    ours = L.sandbox_labels("run-a", "r", "ann")
    for name, labels in [
        ("a1", ours),
        ("a2", {**ours, L.ROLLOUT: "r2"}),
        ("b1", L.sandbox_labels("run-b", "r", "ann")),
        ("stranger", {L.RUN: "run-a"}),
    ]:
        await asyncio.to_thread(core.create_namespaced_pod, "sandboxes", pod(name, labels))
    assert await reap_orphans(runtime, run_id="run-a") == 2
    listing = [r for r in list(kmock) if str(r.method).endswith("GET") and r.url.path.endswith("/pods")]
    assert listing[-1].params["labelSelector"] == f"{L.MANAGED}=true,{L.RUN}=run-a"
    left = {k[2] for k, obj in kmock.objects.items() if not obj.deleted}
    assert left == {"b1", "stranger"}


# --- exec, at the API boundary --------------------------------------------------------------


class LocalExec:
    """Stands in for the exec websocket (``WSClient``): runs the argv as a local process."""

    def __init__(self, argv: list[str], stdin: bool) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._buf = {1: bytearray(), 2: bytearray()}
        self._lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._pump, args=(ch, f), daemon=True)
            for ch, f in ((1, self.proc.stdout), (2, self.proc.stderr))
        ]
        for t in self._readers:
            t.start()
        if not stdin:
            self.proc.stdin.close()

    def _pump(self, ch: int, f: Any) -> None:
        for chunk in iter(lambda: f.read1(65536), b""):
            with self._lock:
                self._buf[ch] += chunk

    def _take(self, ch: int) -> bytes:
        with self._lock:
            data, self._buf[ch] = bytes(self._buf[ch]), bytearray()
        return data

    def write_stdin(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_channel(self, channel: int) -> None:
        assert channel == 0
        self.proc.stdin.close()

    def is_open(self) -> bool:
        if self.proc.poll() is None:
            return True
        for t in self._readers:
            t.join()
        return False

    def update(self, timeout: float = 0) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def read_stdout(self, timeout: float = 0) -> bytes:
        return self._take(1)

    def read_stderr(self, timeout: float = 0) -> bytes:
        return self._take(2)

    @property
    def returncode(self) -> int | None:
        code = self.proc.returncode  # the API reports a death by signal N as exit code 128 + N
        return 128 - code if code is not None and code < 0 else code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture()
def local_exec(monkeypatch, runtime) -> list[dict[str, Any]]:
    """Route pod exec to local processes; returns the recorded exec calls."""
    calls: list[dict[str, Any]] = []

    def fake_stream(fn: Any, name: str, namespace: str, **kw: Any) -> LocalExec:
        calls.append({"fn": fn, "name": name, "namespace": namespace, **kw})
        if kw.get("gone"):
            raise ApiException(status=0, reason="Handshake status 404 Not Found")
        return LocalExec(kw["command"], kw["stdin"])

    import kubernetes.stream

    monkeypatch.setattr(kubernetes.stream, "stream", fake_stream)
    return calls


async def _running(kmock, runtime, **kw):
    sb = runtime.create(_spec(**kw))
    setter = asyncio.create_task(_set_phase_when_created(kmock, {"phase": "Running"}))
    await sb.start()
    await setter
    return sb


async def test_exec_files_and_timeout_over_the_exec_api(kmock, runtime, local_exec, tmp_path):
    sb = await _running(kmock, runtime, workdir=str(tmp_path))
    res = await sb.exec(
        ["sh", "-c", "echo $GREETING; pwd; echo err >&2; exit 5"], timeout_s=10, env={"GREETING": "hi"}
    )
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (5, f"hi\n{tmp_path}\n", "err\n", False)
    call = local_exec[0]
    assert call["fn"] == runtime.core.connect_get_namespaced_pod_exec
    assert (call["name"], call["namespace"], call["container"]) == (sb.name, "sandboxes", "sandbox")
    assert call["binary"] is True and call["tty"] is False and call["stdin"] is False
    assert call["command"][-8:-5] == ["timeout", "--signal=KILL", "10s"]

    await sb.put_file("sub/data.bin", bytes(range(256)) * 10, mode=0o640)
    assert (tmp_path / "sub" / "data.bin").read_bytes() == bytes(range(256)) * 10
    assert oct((tmp_path / "sub" / "data.bin").stat().st_mode & 0o777) == "0o640"
    put_call = local_exec[-1]
    assert put_call["stdin"] is True and "tar xf -" in put_call["command"][2]
    assert await sb.get_file(str(tmp_path / "sub" / "data.bin")) == bytes(range(256)) * 10
    with pytest.raises(FileNotFoundError):
        await sb.get_file("nope.txt")

    src = tmp_path / "src"
    (src / "deep").mkdir(parents=True)
    (src / "deep" / "f.txt").write_text("F")
    await sb.put_dir(src, "copied")
    assert (tmp_path / "copied" / "deep" / "f.txt").read_text() == "F"

    res = await sb.exec(
        ["python3", "-c", "import sys; print(sys.stdin.read().upper())"], timeout_s=10, stdin=b"abc"
    )
    assert res.stdout == "ABC\n"

    res = await sb.exec("sleep 30; echo never", timeout_s=1)
    assert res.timed_out and res.exit_code in (124, 137) and "never" not in res.stdout
    assert "echo never" in await sb.logs()
    await sb.stop()


async def test_exec_on_a_deleted_pod_raises_gone(kmock, runtime, local_exec, monkeypatch):
    sb = await _running(kmock, runtime)
    await asyncio.to_thread(runtime.core.delete_namespaced_pod, sb.name, "sandboxes")
    import kubernetes.stream

    real = kubernetes.stream.stream
    monkeypatch.setattr(
        kubernetes.stream, "stream", lambda fn, name, ns, **kw: real(fn, name, ns, gone=True, **kw)
    )
    with pytest.raises(SandboxError, match="is gone"):
        await sb.exec(["true"], timeout_s=5)
    await sb.stop()  # the pod is already gone: stop still succeeds


async def test_start_with_files_and_entry_puts_then_execs(kmock, runtime, local_exec, tmp_path):
    """Pods have no pre-start copy: the files go in over exec once the pod runs, then the entry is an exec."""
    sb = runtime.create(_spec(workdir=str(tmp_path)))
    setter = asyncio.create_task(_set_phase_when_created(kmock, {"phase": "Running"}))
    files = [SandboxFile("in.txt", b"data\n"), SandboxFile("bin/tool.sh", b"#!/bin/sh\necho tool\n", 0o755)]
    await sb.start(files=files, entry=Entry(["sh", "-c", "cat in.txt; ./bin/tool.sh; echo $FOO; exit 2"], 10, {"FOO": "bar"}))
    await setter
    res = await sb.wait_entry()
    assert (res.exit_code, res.stdout, res.timed_out) == (2, "data\ntool\nbar\n", False)
    assert [("tar xf -" in " ".join(c["command"])) for c in local_exec] == [True, True, False]  # two copies, then the entry
    assert local_exec[-1]["command"][-3:] == ["sh", "-c", "cat in.txt; ./bin/tool.sh; echo $FOO; exit 2"]
    await sb.stop()


async def test_reap_stopped_deletes_only_finished_pods(kmock, runtime):
    core = runtime.core
    for name, phase in [("done", "Succeeded"), ("broken", "Failed"), ("live", "Running"), ("starting", "Pending")]:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": L.sandbox_labels("run-x", name, "ann")}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        await asyncio.to_thread(core.create_namespaced_pod, "sandboxes", body)
        kmock.objects[PODS, "sandboxes", name]["status"] = {"phase": phase}
    assert await runtime.reap(owner="ann", stopped=True) == 2
    left = {k[2] for k, obj in kmock.objects.items() if not obj.deleted}
    assert left == {"live", "starting"}
