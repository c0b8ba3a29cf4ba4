"""Kubernetes failures that must say what happened, or not happen at all, on the API server stand-in.

* a pod that does not start says why: its Events (a FailedMount while ContainerCreating), its container's
  terminated reason and last log lines, and a known cause in words (an ``exec format error``: an image of
  another CPU architecture); an OOM-killed pod says OOMKilled;
* a command's exec stream cut mid-command (a load balancer reset, an API server restart) reattaches: the
  command runs once, its output arrives whole, and a whole rollout passes on its first attempt;
* execs past file descriptor 1024; an exec-plugin token refreshed by one thread at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import struct
import sys
from pathlib import Path

import pytest

from core.errors import SandboxError
from core.runtime.k8s import detached
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.runtime import KubernetesRuntime
from tests.k8s_apiserver import ApiServerStandIn
from tests.test_run_docker import rows
from tests.test_runtime_kubernetes import NS, _live, _runtime, shell_run_config

pytestmark = pytest.mark.docker


@pytest.fixture()
def standin(docker_client, base_image):
    with ApiServerStandIn(docker_client) as server:
        yield server


# --- item 5: diagnosis ---------------------------------------------------------------------------


async def test_a_pod_stuck_creating_says_why_from_its_events(standin, base_image):
    creating = {
        "phase": "Pending", "hostIP": "10.0.0.2", "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "sandbox", "image": base_image, "imageID": "", "ready": False, "restartCount": 0,
                               "state": {"waiting": {"reason": "ContainerCreating"}}}],
    }
    mount = 'MountVolume.SetUp failed for volume "certs" : secret "registry-ca" not found'
    standin.script_next_pod([(30, creating)], events=[("FailedMount", mount)])
    sb = _runtime(standin, start_timeout_s=1).create(_live(base_image))
    with pytest.raises(SandboxError, match=r"not Running after 1s \(still ContainerCreating\); events: .*Warning FailedMount: " + mount.replace("(", r"\(")):
        await sb.start()
    assert standin.requests("GET", f"/namespaces/{NS}/events$")[-1].query == [("fieldSelector", f"involvedObject.name={sb.name},involvedObject.kind=Pod")]


@pytest.fixture(scope="module")
def arm64_image(docker_client) -> str:
    """An image whose every binary (here: its only one, /bin/sh) is an AArch64 ELF: it cannot run on this amd64 engine."""
    import io
    import platform
    import tarfile

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs an x86-64 engine (the image's binary is AArch64)")
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian ELF
    elf = ident + struct.pack("<HHIQQQIHHHHHH", 2, 183, 1, 0x400000, 64, 0, 0, 64, 56, 0, 64, 0, 0)  # ET_EXEC, EM_AARCH64
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data, mode in (("Dockerfile", b"FROM scratch\nCOPY sh /bin/sh\n", 0o644), ("sh", elf, 0o755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    tag = "forgetui-test/k8s-arm64-only:1"
    docker_client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)
    yield tag
    docker_client.images.remove(tag, force=True)


async def test_an_image_of_another_architecture_says_so(standin, arm64_image):
    sb = _runtime(standin).create(_live(arm64_image))
    with pytest.raises(SandboxError) as info:
        await sb.start()
    text = str(info.value)
    assert "container sandbox Error (exit 1)" in text and "its logs: exec /bin/sh: exec format error" in text
    assert "another CPU architecture" in text and "--platform linux/amd64" in text  # what to do, not just "Failed"
    assert standin.requests("DELETE", f"/pods/{sb.name}$")


async def test_an_oom_killed_pod_says_so(standin, base_image):
    sb = _runtime(standin).create(_live(base_image))
    await sb.start()
    running = asyncio.create_task(sb.exec("sleep 60", timeout_s=120))
    await asyncio.sleep(1.0)
    await asyncio.to_thread(standin.kill_pod, NS, sb.name, "OOMKilled")
    with pytest.raises(SandboxError, match=r"is gone: .*container sandbox OOMKilled \(exit 137\)"):
        await asyncio.wait_for(running, 30)


def test_images_build_platform_is_checked(docker_client, base_image, tmp_path):
    """--platform builds for the nodes' platform; an image that would be of another platform is an error, not a push."""
    import subprocess

    from core.runtime import images

    arch = images.image_platform(docker_client, base_image)
    assert images.platform_matches(arch, "linux/amd64") and images.platform_matches("linux/arm64/v8", "linux/arm64")
    env = {**os.environ, "FORGETUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    (tmp_path / "run.toml").write_text("")
    cli = [sys.executable, "-m", "forgetui.cli", "images", "build", str(tmp_path / "run.toml"), "--set", "runtime.kind=kubernetes",
           "--set", f"runtime.base_image={json.dumps(base_image)}", "--set", "env.name=toy", "--set", "harness.name=react"]
    same = subprocess.run([*cli, "--platform", arch], capture_output=True, text=True, env=env, timeout=600)
    assert same.returncode == 0 and len(same.stdout.split()) == 2, same.stderr[-2000:]
    other = "linux/arm64" if not arch.endswith("arm64") else "linux/amd64"
    refused = subprocess.run([*cli, "--platform", other], capture_output=True, text=True, env=env, timeout=600)
    # the engine's builder quietly used the local base of this platform: caught before anything is pushed
    said = " ".join(refused.stderr.split())
    assert refused.returncode != 0 and f"is {arch}, not {other}" in said and "QEMU" in said


# --- item 7: a dropped exec stream reattaches ------------------------------------------------------------


async def test_a_command_whose_stream_is_cut_reattaches_and_runs_once(standin, base_image):
    rt = _runtime(standin)
    sb = rt.create(_live(base_image))
    await sb.start()
    standin.drop_exec(1.0)  # the next exec: its TCP connection aborted 1 s in, no status
    command = "echo start; echo run >> runs.txt; sleep 3; echo err >&2; echo end"
    res = await sb.exec(command, timeout_s=30)
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (0, "start\nend\n", "err\n", False)
    assert standin.dropped == [sb.name]
    polls = [r for r in standin.requests("GET", f"/pods/{sb.name}/exec$") if ("command", detached.POLL) in r.query]
    assert polls and dict(polls[0].query).get("stdin") == "false"
    assert (await sb.exec("cat runs.txt", timeout_s=10)).stdout == "run\n"  # it ran once
    # cut at once, before or while the upload arrives: launched again only if it never started
    standin.drop_exec(0.0)
    res = await sb.exec("echo again >> runs.txt; cat runs.txt", timeout_s=30, stdin=b"ignored")
    assert res.stdout == "run\nagain\n" and len(standin.dropped) == 2
    # a stream lost for longer than reattach_s is an infra error that says so
    short = _runtime(standin, reattach_s=2.0).create(_live(base_image, rollout_id="short"))
    await short.start()
    standin.drop_exec(0.3, times=1000)
    with pytest.raises(SandboxError, match=r"stream stayed lost for 2s"):
        await short.exec("sleep 20", timeout_s=60)
    standin.stop_dropping()
    await asyncio.gather(sb.stop(), short.stop())


def test_a_rollout_whose_harness_stream_is_cut_passes_on_its_first_attempt(standin, base_image, tmp_path, monkeypatch):
    """A whole run: the harness's exec stream is cut mid-rollout; the rollout reattaches instead of becoming an infra error."""
    from core.run import execute_run

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    command = "echo working; sleep 3; echo hi >> hello.txt; echo done"  # twice would fail the verifier
    cfg = shell_run_config(standin, base_image, tmp_path, command, "runtime.kubernetes.require_network_policy=false", "run.max_retries=2")
    standin.drop_exec(1.0, only=detached.LAUNCH)  # the first command launched in a pod: the harness (the toy task has no setup)
    summary = asyncio.run(execute_run(cfg))
    ((status, attempt, passed, stdout),) = rows(summary.store, "SELECT status, attempt, passed, meta->>'stdout_tail' FROM rollouts")
    assert (status, attempt, passed, summary.infra_errors) == ("done", 0, True, 0)
    assert stdout == "working\ndone\n" and len(standin.dropped) == 1


# --- item 9: file descriptors, token refresh -------------------------------------------------------------


async def test_execs_work_past_file_descriptor_1024(standin, base_image):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 1300:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    sb = _runtime(standin).create(_live(base_image))
    await sb.start()
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # every new socket now gets a number past 1024
    try:
        assert min(held[-50:]) > 1024
        res = await sb.exec("echo fine", timeout_s=20)  # select() raised "filedescriptor out of range" here
        assert res.stdout == "fine\n"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    await sb.stop()


PLUGIN = r"""#!{python}
import json, os, sys, time
log = sys.argv[1]
with open(log, "a") as f:
    f.write(f"start {{time.monotonic()}}\n")
time.sleep(0.3)
with open(log, "a") as f:
    f.write(f"end {{time.monotonic()}}\n")
# a token near its expiry (the client refreshes 5 minutes early): every use asks the plugin again
expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {{"token": "plugin-token", "expirationTimestamp": expiry}}}}))
"""


def _overlaps(log: Path) -> int:
    """The most plugin runs that were running at the same moment."""
    events = sorted((float(t), 1 if kind == "start" else -1) for kind, t in (line.split() for line in log.read_text().splitlines()))
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


async def test_exec_plugin_tokens_refresh_one_thread_at_a_time(standin, base_image, tmp_path):
    """An exec credential plugin (aws, gke-gcloud-auth-plugin, kubelogin) behind concurrent execs and REST calls."""
    plugin, log = tmp_path / "plugin.py", tmp_path / "plugin.log"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": standin.url}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "plugin"}}],
        "users": [{"name": "plugin", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin),
                                                        "args": [str(log)], "interactiveMode": "Never"}}}],
    }))
    cfg = KubernetesConfig(namespace=NS, kubeconfig=str(kubeconfig), require_network_policy=False, network_policy=False, request_timeout_s=30)
    rt = KubernetesRuntime(cfg, poll_interval_s=0.05)
    boxes = [rt.create(_live(base_image, rollout_id=f"t{i}")) for i in range(2)]
    await asyncio.gather(*(b.start() for b in boxes))
    log.write_text("")
    await asyncio.gather(
        *(b.exec(f"echo {i}", timeout_s=60) for i in range(4) for b in boxes),
        *(asyncio.to_thread(rt.core.list_namespaced_pod, NS) for _ in range(4)),
    )
    assert log.read_text().count("start") >= 8  # it was asked again and again...
    assert _overlaps(log) == 1  # ...never twice at once
    assert {r.authorization for r in standin.seen if r.path.endswith("/exec") or r.path.endswith("/pods")} == {"Bearer plugin-token"}
    await asyncio.gather(*(b.stop() for b in boxes))
