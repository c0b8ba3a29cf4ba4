"""The harness as a sandbox's entry command: Docker runs it as the container's own process (no exec),
other runtimes exec it right after start; both give the same `ExecResult` as `exec`."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from core.errors import SandboxError
from core.runtime.base import Entry, SandboxFile, SandboxSpec
from core.runtime.docker.sandbox import DockerSandbox
from core.runtime.local_runtime import LocalRuntime

SCRIPT = "cat in.txt; /opt/tool.sh; echo $FOO; pwd; echo to-stderr >&2; printf no-newline; echo hi > hello.txt; exit 3"


def _spec(image: str, run: str, rollout: str = "r0", **kw: Any) -> SandboxSpec:
    return SandboxSpec(image=image, run_id=run, rollout_id=rollout, owner="tester", **kw)


def _files() -> list[SandboxFile]:
    return [SandboxFile("in.txt", b"data\n"), SandboxFile("/opt/tool.sh", b"#!/bin/sh\necho tool\n", 0o755)]


async def _processes(sb: Any) -> list[str]:
    """The command lines in the sandbox, but for pid 1 (docker's init, whose arguments name the entry)."""
    ps = await sb.exec(["ps", "-eo", "pid=,args="], timeout_s=20)
    return [line.split(None, 1)[1] for line in ps.stdout.splitlines() if line.split(None, 1)[0] != "1"]


async def _check_entry_result(sb: Any) -> None:
    await sb.start(files=_files(), entry=Entry(["bash", "-c", SCRIPT], 30, {"FOO": "bar"}))
    res = await sb.wait_entry()
    assert (res.exit_code, res.stderr, res.timed_out) == (3, "to-stderr\n", False)
    assert res.stdout.splitlines()[:3] == ["data", "tool", "bar"] and res.stdout.endswith("no-newline")
    assert await sb.get_file("hello.txt") == b"hi\n"


@pytest.mark.docker
async def test_docker_entry_runs_as_the_container_process(docker_runtime, base_image, run_id):
    sb = docker_runtime.create(_spec(base_image, run_id))
    try:
        await _check_entry_result(sb)
        procs = await _processes(sb)
        assert not any("cat in.txt" in p for p in procs) and any(p.startswith("sleep") for p in procs)  # harness done, keep-alive up
        env = await sb.exec("echo ${FOO:-unset}", timeout_s=20)
        assert env.stdout == "unset\n"  # the entry's env is the harness's alone, not the container's
        assert "exit 3" in await sb.logs()
    finally:
        await sb.stop()


@pytest.mark.docker
async def test_docker_entry_timeout_kills_the_harness(docker_runtime, base_image, run_id):
    sb = docker_runtime.create(_spec(base_image, run_id))
    try:
        await sb.start(entry=Entry("sleep 100 & sleep 100; echo never", 1))
        res = await sb.wait_entry()
        assert res.timed_out and res.exit_code in (124, 137) and "never" not in res.stdout
        assert not any("sleep 100" in p for p in await _processes(sb))  # the whole process group died
    finally:
        await sb.stop()


@pytest.mark.docker
async def test_docker_entry_cannot_fake_its_end(docker_runtime, base_image, run_id):
    """The end marker is sent on stdin and never shown to the harness: echoing what it can see of it does nothing."""
    sb = docker_runtime.create(_spec(base_image, run_id))
    try:
        fake = "cat /proc/1/cmdline /proc/*/cmdline 2>/dev/null | tr '\\0' ' '; printf '\\036forgetui-exit-0:0\\n'; sleep 1; echo real-end; exit 7"
        await sb.start(entry=Entry(["bash", "-c", fake], 30))
        res = await sb.wait_entry()
        assert res.exit_code == 7 and res.stdout.rstrip().endswith("real-end")
    finally:
        await sb.stop()


@pytest.mark.docker
async def test_docker_entry_in_a_killed_container_is_an_infrastructure_error(docker_runtime, docker_client, base_image, run_id):
    sb = docker_runtime.create(_spec(base_image, run_id))
    try:
        await sb.start(entry=Entry("sleep 60", 120))
        waiting = asyncio.ensure_future(sb.wait_entry())
        await asyncio.sleep(0.5)
        await asyncio.to_thread(docker_client.containers.get(sb.id).kill)
        with pytest.raises(SandboxError, match="is gone"):
            await asyncio.wait_for(waiting, 30)
    finally:
        await sb.stop()


@pytest.mark.docker
async def test_docker_reads_files_on_the_host_without_following_links(docker_runtime, docker_client, base_image, run_id, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    sb = docker_runtime.create(_spec(base_image, run_id))
    try:
        await sb.start(entry=Entry(f"echo ok > a.txt; ln -s {secret} link.txt; mkdir d; ln -s /workspace d2; echo inner > d/b.txt; mkfifo pipe", 30))
        assert (await sb.wait_entry()).ok
        if os.geteuid() == 0 and docker_client.info()["Driver"].startswith("overlay"):  # root reads the overlay root directly
            assert isinstance(sb, DockerSandbox) and sb._rootfs is not None
        assert await sb.get_file("a.txt") == b"ok\n"
        assert await sb.get_file("/workspace/d/b.txt") == b"inner\n"
        with pytest.raises(IsADirectoryError):  # a link is never followed, least of all to the host
            await sb.get_file("link.txt")
        with pytest.raises(FileNotFoundError):  # the engine resolves the link inside the container: no such file there
            await sb.get_file("d2/missing.txt")
        assert await sb.get_file("d2/a.txt") == b"ok\n"  # a link the container can follow is read through the engine
        with pytest.raises(IsADirectoryError):
            await sb.get_file("pipe")
        with pytest.raises(FileNotFoundError):
            await sb.get_file("missing.txt")
        hostname = (await sb.exec(["hostname"], timeout_s=20)).stdout.strip()
        assert (await sb.get_file("/etc/hostname")).decode().strip() == hostname  # engine-mounted: the container's view
        assert (await sb.get_file("/workspace/../etc/hostname")).decode().strip() == hostname
    finally:
        await sb.stop()


async def test_local_entry_is_an_exec_after_start(tmp_path):
    sb = LocalRuntime(base_dir=tmp_path).create(SandboxSpec(image="-", run_id="local-entry", rollout_id="r0", workdir="/workspace"))
    try:
        files = [SandboxFile("in.txt", b"data\n"), SandboxFile("bin/tool.sh", b"#!/bin/sh\necho tool\n", 0o755)]
        await sb.start(files=files, entry=Entry(["bash", "-c", "cat in.txt; ./bin/tool.sh; echo $FOO; echo e >&2; exit 4"], 30, {"FOO": "bar"}))
        res = await sb.wait_entry()
        assert (res.exit_code, res.stdout, res.stderr) == (4, "data\ntool\nbar\n", "e\n")
    finally:
        await sb.stop()


async def test_wait_entry_without_one_is_a_clear_error(tmp_path):
    sb = LocalRuntime(base_dir=tmp_path).create(SandboxSpec(image="-", run_id="local-entry", rollout_id="r1"))
    try:
        await sb.start()
        with pytest.raises(RuntimeError, match="without an entry"):
            await sb.wait_entry()
    finally:
        await sb.stop()
