"""The shared harness on Kubernetes: task images without the harness, which reaches each pod from its own image.

An init container copies the harness image's tree into an emptyDir mounted read-only (the default),
or an ``image`` volume of the harness tree image is mounted (``runtime.kubernetes.harness_mount =
"image"``). Manifests are validated against the official schemas; pods run on the API server
stand-in (tests/k8s_apiserver.py), whose init containers, emptyDirs and image volumes are real
containers and volumes on the local Docker engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest

from core.config import load_config
from core.errors import SandboxError
from core.harness import Endpoint, LaunchSpec
from core.registry import load_env
from core.runtime import harness_volume as HV
from core.runtime.images import ImageLayer
from core.runtime.k8s import harness as KH
from core.session.setup import RunImages, pick_runtime
from harnesses.react import AGENT_PATH, ReactHarness
from tests.k8s_apiserver import ApiServerStandIn
from tests.test_run_docker import rows
from tests.test_runtime_kubernetes import NS, _free_port, _kubeconfig, _live, _runtime, _spec

OLDEST_WITH_IMAGE_VOLUMES = "1.31.0"


class MountedReact(ReactHarness):
    """The built-in ReAct harness without its per-launch copy: it can only run from /opt/forgetui (the shared mount)."""

    def launch(self, task: Any, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        spec = super().launch(task, endpoint, workdir)
        return dataclasses.replace(spec, files={k: v for k, v in spec.files.items() if k != AGENT_PATH})


class UnreadableReact(MountedReact):
    """MountedReact whose install holds a file only root may read: a pod running as uid 1000 cannot copy it."""

    def image_layer(self) -> ImageLayer:
        layer = super().image_layer()
        return layer._replace(name="react-unreadable", dockerfile=layer.dockerfile + "RUN echo k > /opt/forgetui/key && chmod 600 /opt/forgetui/key\n")


def _tiny(marker: str, extra: str = "") -> ImageLayer:
    """A tiny harness as recipes make them: files under /opt/forgetui, its command linked into /usr/local/bin."""
    return ImageLayer(
        name="tiny-k8s-harness",
        dockerfile="COPY tiny.sh /opt/forgetui/tiny/tiny.sh\n"
        "RUN chmod 755 /opt/forgetui/tiny/tiny.sh && mkdir -p /usr/local/bin && ln -sf /opt/forgetui/tiny/tiny.sh /usr/local/bin/tiny" + extra + "\n",
        files={"tiny.sh": f"#!/bin/sh\necho {marker} \"$@\"\n"},
    )


def _k8s_config(*sets: str) -> Any:
    return load_config(None, ["runtime.kind=kubernetes", "env.name=toy", "harness.name=react", "proxy.public_url=http://10.0.0.1:8400", *sets])


# --- what a pod is (no cluster, no engine) ---------------------------------------------------------


@pytest.mark.parametrize("security", ["baseline", "restricted"])
def test_init_copy_pod_validates_and_carries_no_harness_in_the_task_image(security):
    config = _k8s_config("runtime.registry=registry.example/me", f"runtime.kubernetes.pod_security={security}")
    runtime = pick_runtime(config)
    react = ReactHarness()
    toy = load_env("toy")
    image = asyncio.run(RunImages(runtime, config, toy, react).for_task(toy.tasks()[0]))
    harness_tag = KH.harness_image(config.runtime.base_image, [react.image_layer()])
    # the toy env adds no layer: the task image is the bare base, the harness comes from its own image
    assert image.tag == config.runtime.base_image and image.volumes == {harness_tag: HV.MOUNT}
    manifest = runtime.build_pod_manifest(_spec(image=image.tag, env=dict(image.env), volumes=dict(image.volumes)))  # type: ignore[attr-defined]
    kubernetes_validate.validate(manifest, "1.30.0", strict=True)
    pod = manifest["spec"]
    # restricted (uid 1000): the workdir's emptyDir and its seeding init container first (tests/test_k8s_isolation.py)
    workdir = [{"name": "forgetui-workdir", "emptyDir": {}}] if security == "restricted" else []
    *seed, init = pod["initContainers"]
    (task,) = pod["containers"]
    assert [c["name"] for c in seed] == ["forgetui-workdir"] * len(workdir)
    assert init["name"] == KH.INIT_CONTAINER and init["image"] == f"registry.example/me/{harness_tag}"
    assert init["command"] == ["sh", "-c", KH.INIT_SCRIPT] and init["securityContext"] == task["securityContext"]
    assert init["resources"] == task["resources"]  # a namespace quota asks every container for them
    assert pod["volumes"] == [*workdir, {"name": "forgetui-harness", "emptyDir": {}}]
    assert init["volumeMounts"] == [{"name": "forgetui-harness", "mountPath": HV.FILL_AT}]
    assert task["volumeMounts"][len(workdir):] == [{"name": "forgetui-harness", "mountPath": HV.MOUNT, "readOnly": True}]
    assert "PATH" not in {e["name"] for e in task["env"]}  # a pod's PATH would replace the image's: the exec script prepends
    assert task["image"] == f"registry.example/me/{config.runtime.base_image}"

    config.runtime.shared_harness = False  # the old way: the harness baked into the task image, no init container
    baked = asyncio.run(RunImages(pick_runtime(config), config, toy, react).for_task(toy.tasks()[0]))
    assert baked.volumes == {} and baked.tag == harness_tag


def test_image_volume_pod_needs_kubernetes_1_31():
    config = _k8s_config("runtime.kubernetes.harness_mount=image", "runtime.kubernetes.image_pull_policy=Always")
    runtime = pick_runtime(config)
    layer = ReactHarness().image_layer()
    mounted = KH.mounted_image(config.runtime.base_image, [layer], None, "image")
    assert mounted == KH.tree_image(KH.harness_image(config.runtime.base_image, [layer])) and mounted.startswith("forgetui/react-tree:")
    manifest = runtime.build_pod_manifest(_spec(image=config.runtime.base_image, volumes={mounted: HV.MOUNT}))  # type: ignore[attr-defined]
    kubernetes_validate.validate(manifest, OLDEST_WITH_IMAGE_VOLUMES, strict=True)
    pod = manifest["spec"]
    assert "initContainers" not in pod
    assert pod["volumes"] == [{"name": "forgetui-harness", "image": {"reference": mounted, "pullPolicy": "Always"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "forgetui-harness", "mountPath": HV.MOUNT, "readOnly": True}]
    with pytest.raises(kubernetes_validate.ValidationError):  # why it is opt-in: older clusters reject the pod
        kubernetes_validate.validate(manifest, "1.30.0", strict=True)


# --- on the stand-in: real init containers, emptyDirs and image volumes --------------------------------


@pytest.fixture()
def standin(docker_client, base_image) -> Iterator[ApiServerStandIn]:
    with ApiServerStandIn(docker_client) as server:
        yield server


@pytest.fixture(scope="module")
def task_image(docker_client, base_image) -> str:
    """A task's own image, no harness in it, with its own PATH."""
    from core.runtime.images import ensure_dockerfile_image

    return ensure_dockerfile_image(docker_client, "k8s-shared-probe", f"FROM {base_image}\nENV PATH=/opt/task/bin:{HV.DEFAULT_PATH}\n")


@pytest.fixture()
def tiny_images(docker_client, base_image):
    """Builds a tiny harness for a mode; removes what it built afterwards."""
    built: list[str] = []

    def make(mode: str, extra: str = "") -> tuple[str, str]:
        marker = f"tiny-{uuid.uuid4().hex[:8]}"
        built.extend(KH.build(docker_client, base_image, [_tiny(marker, extra)], None, mode))  # type: ignore[arg-type]
        built.append(KH.harness_image(base_image, [_tiny(marker, extra)]))
        return built[-2], marker

    yield make
    for tag in reversed(built):
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:  # noqa: BLE001 - removed already
            pass


@pytest.mark.parametrize(("mode", "uid"), [("init", None), ("init", 1000), ("image", None)])
async def test_a_task_image_without_the_harness_runs_it_from_the_read_only_mount(standin, task_image, tiny_images, mode, uid):
    """uid 1000 (as pod_security = "restricted" runs): the init container copies as that user, into the world-writable emptyDir."""
    mounted, marker = tiny_images(mode)
    rt = _runtime(standin, harness_mount=mode, run_as_user=uid)
    sb = rt.create(_live(task_image, volumes={mounted: HV.MOUNT}, workdir="/tmp"))
    await sb.start()
    try:
        # the harness's commands first, then the task image's own PATH (its ENV PATH kept, as on Docker)
        assert (await sb.exec(["sh", "-c", 'echo "$PATH"'], timeout_s=20)).stdout == f"{HV.BIN}:/opt/task/bin:{HV.DEFAULT_PATH}\n"
        # the command, from the mount, on PATH (a list, as harnesses launch: `bash -l` would reset PATH from /etc/profile)
        assert (await sb.exec(["tiny", "hello"], timeout_s=20)).stdout == f"{marker} hello\n"
        res = await sb.exec(["sh", "-c", "readlink /opt/forgetui/bin/tiny; touch /opt/forgetui/x; echo $?"], timeout_s=20)
        assert res.stdout.splitlines() == ["/opt/forgetui/tiny/tiny.sh", "1"] and "Read-only file system" in res.stderr
        assert (await sb.exec("test -e /usr/local/bin/tiny", timeout_s=20)).exit_code == 1  # the task image has no harness
    finally:
        await sb.stop()
    (created,) = standin.created
    if mode == "init":
        (init,) = created["spec"]["initContainers"]
        assert init["image"] == mounted and created["spec"]["volumes"][0]["emptyDir"] == {}
    else:
        assert "initContainers" not in created["spec"] and created["spec"]["volumes"][0]["image"]["reference"] == mounted


async def test_a_failed_init_container_is_a_sandbox_error_naming_it(standin, base_image, tiny_images):
    """A harness file only root may read, copied by a pod running as uid 1000: cp fails, the pod fails, the error says why."""
    mounted, _ = tiny_images("init", " && echo secret > /opt/forgetui/tiny/key && chmod 600 /opt/forgetui/tiny/key")
    rt = _runtime(standin, run_as_user=1000)
    sb = rt.create(_live(base_image, volumes={mounted: HV.MOUNT}, workdir="/tmp"))
    with pytest.raises(SandboxError, match=r"init container forgetui-harness failed \(exit 1, Error\).*Permission denied") as info:
        await sb.start()
    assert "/opt/forgetui/./tiny/key" in str(info.value) or "tiny/key" in str(info.value)
    assert standin.requests("DELETE", f"/pods/{sb.name}$")  # removed, as every failed start is
    assert standin.requests("GET", f"/pods/{sb.name}/log$")[-1].query == [("container", KH.INIT_CONTAINER)]


async def test_a_harness_image_nobody_pushed_is_a_pull_error_naming_the_init_container(standin, base_image):
    rt = _runtime(standin, pull_retry_s=0.5)
    sb = rt.create(_live(base_image, volumes={"forgetui/never-pushed:0": HV.MOUNT}))
    with pytest.raises(SandboxError, match=r"cannot pull image 'forgetui/never-pushed:0' \(init container forgetui-harness\).*--push"):
        await sb.start()


def _run_config(standin: ApiServerStandIn, base_image: str, tmp_path: Any, harness: str, *sets: str) -> Any:
    port = _free_port()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [
        {"tool": "shell", "command": "touch /opt/forgetui/react_agent.py || echo CANNOT-WRITE; ls /opt/forgetui; echo hi > hello.txt"},
        {"text": "done"},
    ]}))
    return load_config(None, [
        "runtime.kind=kubernetes", f"runtime.kubernetes.kubeconfig={json.dumps(str(_kubeconfig(tmp_path, standin)))}",
        f"runtime.kubernetes.namespace={NS}", f"runtime.base_image={json.dumps(base_image)}", f'policy.backend="scripted:{script}"',
        "env.name=toy", 'env.tasks=["hello"]', f'harness.name="tests.test_k8s_shared_harness:{harness}"', "run.max_retries=0",
        f"proxy.port={port}", f"proxy.public_url={json.dumps(f'http://127.0.0.1:{port}')}",
        "runtime.kubernetes.require_network_policy=false", *sets,  # the stand-in ignores policies (tests/test_k8s_isolation.py)
    ])


def test_a_run_whose_init_container_fails_records_an_infra_error_naming_it(standin, base_image, tmp_path, monkeypatch):
    from core.run import execute_run
    from core.runtime.images import ensure_image

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    cfg = _run_config(standin, base_image, tmp_path, "UnreadableReact", "runtime.kubernetes.run_as_user=1000")
    tag = ensure_image(standin.docker, base_image, [UnreadableReact().image_layer()])
    try:
        summary = asyncio.run(execute_run(cfg))
    finally:
        standin.docker.images.remove(tag, force=True)
    assert (summary.passed, summary.infra_errors) == (0, 1), summary
    ((status, error),) = rows(summary.store, "SELECT status, error FROM rollouts")
    assert status == "infra_error" and "init container forgetui-harness failed (exit 1, Error)" in error and "Permission denied" in error
    assert not rows(summary.store, "SELECT * FROM calls")  # the harness never started


@pytest.mark.parametrize("mode", ["init", "image"])
def test_a_react_run_mounts_the_harness_into_task_pods(standin, base_image, tmp_path, monkeypatch, mode):
    """A whole run (kubeconfig, proxy, scripted policy): ReAct runs from the shared mount, cannot write it, and passes."""
    from core.run import execute_run

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    cfg = _run_config(standin, base_image, tmp_path, "MountedReact", f"runtime.kubernetes.harness_mount={mode}")
    layers = [MountedReact().image_layer()]
    (mounted,) = KH.build(standin.docker, base_image, layers, None, mode)  # `forgetui images build` did this (and a push)
    assert mounted == KH.mounted_image(base_image, layers, None, mode)
    summary = asyncio.run(execute_run(cfg))
    assert (summary.passed, summary.infra_errors) == (1, 0), summary
    ((digest, volume),) = rows(summary.store, "SELECT image_digest, meta->>'harness_volume' FROM rollouts")
    assert digest == base_image and volume == mounted  # ran in the bare base image, the harness from its own image
    ((tool_result,),) = rows(summary.store, "SELECT request::VARCHAR FROM calls_full ORDER BY started_at DESC LIMIT 1")
    assert "CANNOT-WRITE" in tool_result and "Read-only file system" in tool_result and "react_agent.py" in tool_result
    (pod,) = standin.created
    assert pod["spec"]["containers"][0]["image"] == base_image
    if mode == "init":
        assert [c["image"] for c in pod["spec"]["initContainers"]] == [mounted]
    else:
        assert pod["spec"]["volumes"][0]["image"]["reference"] == mounted and "initContainers" not in pod["spec"]


def test_harbor_tasks_with_their_own_images_share_one_harness_on_kubernetes(standin, base_image, tmp_path, monkeypatch):
    """Two tasks, each its own Dockerfile: `images build` makes each task image (no harness) and one harness image; pods mount it."""
    from core.run import execute_run
    from core.runtime import make_runtime
    from envs.harbor import HarborEnv
    from tests.test_shared_harness import _harbor_task

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    suite = tmp_path / "suite"
    for i in range(2):
        _harbor_task(suite, f"k8s-probe-{i}", f"FROM {base_image}\nWORKDIR /app\nENV WHICH={i}\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"tool": "shell", "command": "echo hi > hello.txt"}, {"text": "done"}]}))
    port = _free_port()
    cfg = load_config(None, [
        "env.name=harbor", f"env.path={json.dumps(str(suite))}", 'harness.name="tests.test_k8s_shared_harness:MountedReact"',
        f'policy.backend="scripted:{script}"', "runtime.kind=kubernetes", f"runtime.base_image={json.dumps(base_image)}",
        f"runtime.kubernetes.kubeconfig={json.dumps(str(_kubeconfig(tmp_path, standin)))}", f"runtime.kubernetes.namespace={NS}",
        "run.max_retries=0", "run.concurrency=2", f"proxy.port={port}", f"proxy.public_url={json.dumps(f'http://127.0.0.1:{port}')}",
        "runtime.kubernetes.require_network_policy=false",
    ])
    env, react = HarborEnv(path=str(suite)), MountedReact()
    built = RunImages(make_runtime("docker"), cfg, env, react).k8s_build_blocking(env.tasks())  # what `images build` pushes
    harness_tag = KH.harness_image(base_image, [react.image_layer()])
    own = [RunImages(pick_runtime(cfg), cfg, env, react)._task_base(t) for t in env.tasks()]
    assert built == [*own, harness_tag] and base_image not in built  # every task brings its own: the bare base is not needed
    summary = asyncio.run(execute_run(cfg))
    assert (summary.passed, summary.infra_errors) == (2, 0), summary
    recorded = rows(summary.store, "SELECT image_digest, meta->>'harness_volume' FROM rollouts ORDER BY task_id")
    assert recorded == [(tag, harness_tag) for tag in own]  # each ran in its own image, the harness from the shared one
    assert sorted(p["spec"]["containers"][0]["image"] for p in standin.created) == sorted(own)
    assert {p["spec"]["initContainers"][0]["image"] for p in standin.created} == {harness_tag}


def test_a_ca_bundle_names_the_same_task_image_on_kubernetes_as_images_build_makes(tmp_path):
    """With runtime.ca_bundle and no env layer, pods pulled the bare base while `images build` made (and pushed) base + CA."""
    from core.runtime.images import image_tag

    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n")
    config = _k8s_config(f"runtime.ca_bundle={json.dumps(str(ca))}")
    toy, react = load_env("toy"), ReactHarness()
    image = asyncio.run(RunImages(pick_runtime(config), config, toy, react).for_task(toy.tasks()[0]))
    assert image.tag == image_tag(config.runtime.base_image, [], ca.read_bytes()) != config.runtime.base_image
    assert image.volumes == {KH.harness_image(config.runtime.base_image, [react.image_layer()], ca.read_bytes()): HV.MOUNT}
