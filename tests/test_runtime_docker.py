"""Docker sandboxes against a real engine (skipped with a reason when none answers)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.errors import SandboxError
from core.runtime import labels as L
from core.runtime.base import SandboxSpec
from core.runtime.docker.sandbox import DockerSandbox
from core.runtime.images import CA_PATH, ImageLayer, ensure_image, image_tag, list_images
from core.runtime.reaper import reap_orphans

pytestmark = pytest.mark.docker


def _spec(image: str, run: str, rollout: str = "r0", **kw: Any) -> SandboxSpec:
    return SandboxSpec(image=image, run_id=run, rollout_id=rollout, owner="tester", **kw)


async def test_roundtrip_exec_files_logs_stop(docker_runtime, docker_client, base_image, run_id, tmp_path):
    sb = docker_runtime.create(_spec(base_image, run_id, env={"GREETING": "hello"}))
    await sb.start()
    try:
        res = await sb.exec(["bash", "-c", "echo $GREETING; pwd; echo oops >&2; exit 3"], timeout_s=20)
        assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (
            3,
            "hello\n/workspace\n",
            "oops\n",
            False,
        )

        res = await sb.exec("echo $EXTRA from $(pwd)", timeout_s=20, env={"EXTRA": "x"}, workdir="/tmp")
        assert res.stdout == "x from /tmp\n" and res.ok

        await sb.put_file("notes/a.txt", b"alpha\n", mode=0o600)
        assert await sb.get_file("/workspace/notes/a.txt") == b"alpha\n"
        res = await sb.exec(["stat", "-c", "%a", "notes/a.txt"], timeout_s=20)
        assert res.stdout.strip() == "600"

        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "b.txt").write_text("beta")
        (tmp_path / "c.txt").write_text("gamma")
        await sb.put_dir(tmp_path, "/opt/task")
        res = await sb.exec("cat /opt/task/sub/b.txt /opt/task/c.txt", timeout_s=20)
        assert res.stdout == "betagamma"

        res = await sb.exec(
            ["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], timeout_s=20, stdin=b"abc"
        )
        assert res.stdout == "cba\n"

        with pytest.raises(FileNotFoundError):
            await sb.get_file("missing.txt")

        logs = await sb.logs()
        assert "echo $EXTRA from $(pwd)" in logs and "x from /tmp" in logs
    finally:
        await sb.stop()
    await sb.stop()  # idempotent
    import docker.errors

    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(sb.id)


async def test_exec_timeout_kills_the_process(docker_runtime, base_image, run_id):
    sb = docker_runtime.create(_spec(base_image, run_id))
    await sb.start()
    try:
        res = await sb.exec("sleep 100 & sleep 100; echo never", timeout_s=1)
        assert res.timed_out is True
        assert res.exit_code in (124, 137)
        assert "never" not in res.stdout
        ps = await sb.exec(["ps", "-eo", "args"], timeout_s=20)
        assert "sleep 100" not in ps.stdout
        assert (await sb.exec(["true"], timeout_s=20)).ok
    finally:
        await sb.stop()


async def test_limits_security_and_labels(docker_runtime, docker_client, base_image, run_id):
    spec = _spec(
        base_image, run_id, rollout="lim", cpus=0.5, memory="256m", pids_limit=64, labels={"env": "demo"}
    )
    sb = docker_runtime.create(spec)
    await sb.start()
    try:
        attrs = docker_client.api.inspect_container(sb.id)
        host = attrs["HostConfig"]
        assert host["Memory"] == 256 * 1024**2
        assert host["MemorySwap"] == 256 * 1024**2
        assert host["NanoCpus"] == 500_000_000
        assert host["PidsLimit"] == 64
        assert host["Privileged"] is False
        assert host["CapDrop"] == ["ALL"]
        assert "SYS_ADMIN" not in (host["CapAdd"] or [])
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["NetworkMode"] == "none"  # isolated by default; without a proxy to reach, no network at all
        assert not any("docker.sock" in m.get("Source", "") for m in attrs["Mounts"])
        labels = attrs["Config"]["Labels"]
        assert labels[L.RUN] == run_id and labels[L.ROLLOUT] == "lim" and labels[L.OWNER] == "tester"
        assert labels[L.MANAGED] == "true" and labels["env"] == "demo"
        # the limits are enforced inside: forking stops below the pids limit
        fork = (
            "import os, time\npids = []\ntry:\n    for _ in range(200):\n        p = os.fork()\n"
            "        if p == 0:\n            time.sleep(30); os._exit(0)\n        pids.append(p)\n"
            "except OSError:\n    pass\nprint(len(pids))\nfor p in pids:\n    os.kill(p, 9)\n"
        )
        res = await sb.exec(["python3", "-c", fork], timeout_s=30)
        assert res.ok and 0 < int(res.stdout) < 64
    finally:
        await sb.stop()


async def test_bridge_network_maps_host_gateway(docker_runtime, docker_client, base_image, run_id):
    sb = docker_runtime.create(_spec(base_image, run_id, network="bridge"))
    await sb.start()
    try:
        host = docker_client.api.inspect_container(sb.id)["HostConfig"]
        assert host["NetworkMode"] == "bridge"
        res = await sb.exec(["cat", "/etc/hosts"], timeout_s=20)
        assert "host.docker.internal" in res.stdout
    finally:
        await sb.stop()


async def test_container_killed_from_outside_raises_sandbox_error(
    docker_runtime, docker_client, base_image, run_id
):
    sb = docker_runtime.create(_spec(base_image, run_id))
    await sb.start()
    try:
        assert (await sb.exec(["true"], timeout_s=20)).ok
        docker_client.containers.get(sb.id).kill()
        with pytest.raises(SandboxError, match="is gone"):
            await sb.exec(["true"], timeout_s=20)
        docker_client.containers.get(sb.id).remove(force=True)
        with pytest.raises(SandboxError, match="is gone"):
            await sb.exec(["true"], timeout_s=20)
    finally:
        await sb.stop()


async def test_missing_image_is_an_actionable_error(docker_runtime, run_id):
    sb = docker_runtime.create(_spec("forgetui/does-not-exist:nope", run_id))
    with pytest.raises(SandboxError, match="not on this Docker engine"):
        await sb.start()


async def test_reap_removes_only_our_labelled_containers(docker_runtime, docker_client, base_image, run_id):
    other_run = run_id + "-other"
    ours = [docker_runtime.create(_spec(base_image, run_id, rollout=f"r{i}")) for i in range(2)]
    theirs = docker_runtime.create(_spec(base_image, other_run))
    await asyncio.gather(*(sb.start() for sb in [*ours, theirs]))
    # A container that is not forgetui's, even though it carries a look-alike run label.
    stranger = docker_client.containers.run(
        base_image, ["sleep", "300"], detach=True, labels={L.RUN: run_id}, network_mode="none"
    )
    try:
        assert await reap_orphans(docker_runtime, run_id=run_id) == 2
        import docker.errors

        for sb in ours:
            with pytest.raises(docker.errors.NotFound):
                docker_client.containers.get(sb.id)
        assert docker_client.containers.get(theirs.id).status == "running"
        assert docker_client.containers.get(stranger.id).status == "running"
        assert await docker_runtime.reap(run_id=run_id) == 0
        with pytest.raises(SandboxError, match="is gone"):
            await ours[0].exec(["true"], timeout_s=20)
    finally:
        stranger.remove(force=True)
        assert await docker_runtime.reap(run_id=other_run) == 1


async def test_reap_survives_a_container_removed_while_it_lists(docker_runtime, docker_client, base_image, run_id, monkeypatch):
    """Another run's removal in flight: a container listed, then gone before it could be inspected. The reap
    reads labels from the listing itself, so it never asks about one container (which then 404s) and stops."""
    import docker.errors

    sandboxes = [docker_runtime.create(_spec(base_image, run_id, rollout=f"r{i}")) for i in range(2)]
    await asyncio.gather(*(sb.start() for sb in sandboxes))

    def vanished(*args: Any, **kwargs: Any) -> Any:
        raise docker.errors.NotFound("No such container (removed meanwhile)")

    monkeypatch.setattr(docker_runtime.client.api, "inspect_container", vanished)
    assert await docker_runtime.reap(run_id=run_id) == 2
    monkeypatch.undo()
    assert docker_client.containers.list(all=True, filters={"label": f"{L.RUN}={run_id}"}) == []


def test_image_tag_is_a_stable_content_hash():
    layer = ImageLayer("env", "RUN echo hi > /hi\nCOPY a.txt /a.txt", {"a.txt": b"A"})
    tag = image_tag("forgetui/base:bookworm", [layer])
    assert tag == image_tag("forgetui/base:bookworm", [ImageLayer("env", layer.dockerfile, {"a.txt": "A"})])
    assert tag.startswith("forgetui/env:") and len(tag.split(":")[1]) == 12
    assert tag != image_tag("forgetui/base:other", [layer])
    assert tag != image_tag("forgetui/base:bookworm", [layer._replace(files={"a.txt": b"B"})])
    assert tag != image_tag("forgetui/base:bookworm", [layer], ca_bundle=b"cert")
    two = image_tag("forgetui/base:bookworm", [layer, ImageLayer("Codex CLI", "RUN true")])
    assert two.startswith("forgetui/env-codex-cli:")


def test_ensure_image_builds_once_and_bakes_in_ca(docker_client, base_image, tmp_path):
    marker = tmp_path.name  # unique per test run, so the tag is new
    layer = ImageLayer(
        f"t-{marker[-20:].lower()}",
        "COPY hello.sh /usr/local/bin/hello\nRUN hello > /built.txt",
        {"hello.sh": f"#!/bin/sh\necho built {marker}\n"},
    )
    ca = tmp_path / "bundle.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot-a-real-cert\n-----END CERTIFICATE-----\n")
    builds: list[Any] = []
    real_build = docker_client.api.build

    def counting_build(*args: Any, **kwargs: Any) -> Any:
        builds.append(kwargs.get("tag"))
        return real_build(*args, **kwargs)

    docker_client.api.build = counting_build
    try:
        tag = ensure_image(docker_client, base_image, [layer], ca_bundle=ca)
        assert tag == image_tag(base_image, [layer], ca.read_bytes())
        assert ensure_image(docker_client, base_image, [layer], ca_bundle=ca) == tag
        assert builds == [tag]
        out = docker_client.containers.run(
            tag, ["bash", "-c", f"cat /built.txt; echo $SSL_CERT_FILE $PIP_CERT; cat {CA_PATH}"], remove=True
        ).decode()
        assert out.startswith(f"built {marker}\n{CA_PATH} {CA_PATH}\n-----BEGIN CERTIFICATE-----")
        assert any(tag in row["tags"] for row in list_images(docker_client))
    finally:
        docker_client.api.build = real_build
        for t in builds:
            docker_client.images.remove(t, force=True)


def test_ensure_image_reports_build_failure(docker_client, base_image):
    layer = ImageLayer("broken", "RUN echo about-to-fail && exit 7")
    with pytest.raises(SandboxError, match="about-to-fail"):
        ensure_image(docker_client, base_image, [layer])


def test_docker_sandbox_spec_to_run_kwargs():
    sb = DockerSandbox(
        client=None, spec=_spec("img", "run", cpus=2, memory="1g", network="bridge", timeout_s=60)
    )
    kw = sb.run_kwargs()
    assert kw["command"] == ["sleep", "660"]
    assert kw["mem_limit"] == 1024**3 and kw["nano_cpus"] == 2_000_000_000
    assert kw["extra_hosts"] == {"host.docker.internal": "host-gateway"}
    assert kw["privileged"] is False and "volumes" not in kw
    assert sb.name.startswith("forgetui-run-r0-") and len(sb.name) <= 63


async def test_get_file_of_a_folder_is_not_a_file_inside_it(docker_runtime, base_image, run_id):
    from core.runtime.base import SandboxSpec

    sb = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="r-dir"))
    await sb.start()
    try:
        await sb.put_file("/workspace/d/inner.txt", b"secret")
        await sb.exec(["ln", "-s", "d/inner.txt", "/workspace/link.txt"], timeout_s=10)
        with pytest.raises(IsADirectoryError):
            await sb.get_file("/workspace/d")
        with pytest.raises(IsADirectoryError):  # symlinks are not followed by get_file
            await sb.get_file("/workspace/link.txt")
        assert await sb.get_file("/workspace/d/inner.txt") == b"secret"
    finally:
        await sb.stop()


async def test_reap_stopped_removes_exited_sandboxes_of_any_run_of_this_owner(docker_runtime, docker_client, base_image, run_id):
    """What `forgetui gc` and every run's start-up remove whatever run (or FORGETUI_HOME) made them: no run can use an exited sandbox."""
    running = docker_runtime.create(_spec(base_image, run_id, rollout="live"))
    exited = docker_runtime.create(_spec(base_image, run_id + "-elsewhere", rollout="dead"))
    someone_elses = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id + "-theirs", rollout_id="dead", owner="someone-else"))
    await asyncio.gather(running.start(), exited.start(), someone_elses.start())
    try:
        for sb in (exited, someone_elses):
            await asyncio.to_thread(docker_client.containers.get(sb.id).kill)
        assert await docker_runtime.reap(owner="tester", stopped=True) == 1
        import docker.errors

        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(exited.id)
        assert docker_client.containers.get(running.id).status == "running"
        assert docker_client.containers.get(someone_elses.id).status == "exited"
    finally:
        await someone_elses.stop()
        await docker_runtime.reap(run_id=run_id + "-elsewhere")
