"""Every harness's setup as uid 1000 (``pod_security = "restricted"``) in a real container: a user with a home,
harness state under paths that user owns.

Quick: the harness's real LaunchSpec (its config files and environment) goes into a restricted pod on the
API stand-in exactly as a rollout puts it there (one upload at start), in ``forgetui/base``; then every
file is the pod user's, every state folder its environment names is one that user can make and write,
and ``$HOME`` is a home it owns. Slow: the harness image built from its registry package, and the harness
binary itself started as uid 1000 with that environment (its first model call fails: nothing listens).
"""

from __future__ import annotations

import io
import shlex
from collections.abc import Iterator
from pathlib import PurePosixPath

import pytest

from core.env import Task
from core.errors import ConfigError
from core.harness import Endpoint, LaunchSpec
from core.registry import load_harness
from core.runtime.base import SandboxFile
from core.runtime.images import SANDBOX_HOME, SANDBOX_UID, ensure_image
from tests.k8s_apiserver import ApiServerStandIn
from tests.test_runtime_kubernetes import _live, _runtime

HARNESSES = ["claude-code", "codex", "gemini-cli", "mini-swe-agent", "openclaw", "opencode", "pi", "react", "zeroclaw"]
HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace")
DEAD = Endpoint(base_url="http://127.0.0.1:9/r/tok-restricted", token="tok-restricted", model="policy")  # discard port: nothing answers
WORKDIR = "/workspace"


@pytest.fixture(scope="module")
def standin(docker_client, base_image) -> Iterator[ApiServerStandIn]:
    with ApiServerStandIn(docker_client, namespace_security={"sandboxes": "restricted"}) as server:
        yield server


def _state_dirs(launch: LaunchSpec) -> list[str]:
    """The folders a launch keeps state in: its files' folders, and every absolute path its environment names."""
    dirs = {str(PurePosixPath(path).parent) for path in launch.files}
    dirs |= {v for k, v in launch.env.items() if v.startswith("/") and ":" not in v and k not in ("PATH",) and not v.endswith((".txt", ".json", ".toml"))}
    return sorted(dirs)


def _check_script(launch: LaunchSpec) -> str:
    """Prints ``uid home-owner`` then ``owner path`` for each launch file and ``ok|NO dir`` for each state folder."""
    lines = ['echo "$(id -u) $(stat -c %u "$HOME") $HOME"; touch "$HOME/.forgetui-probe" && echo home-writable']
    lines += [f"echo \"$(stat -c %u {shlex.quote(p)}) {p}\"" for p in sorted(launch.files)]
    for d in _state_dirs(launch):
        q = shlex.quote(d)
        lines.append(f'if mkdir -p {q} && touch {q}/.forgetui-probe && [ "$(stat -c %u {q})" = "$(id -u)" ]; then echo "ok {d}"; else echo "NO {d}"; fi')
    return "\n".join(lines)


@pytest.mark.parametrize("name", HARNESSES)
async def test_harness_setup_runs_as_uid_1000_with_a_home_and_state_it_owns(standin, base_image, name):
    launch = load_harness(name).launch(HELLO, DEAD, WORKDIR)
    rt = _runtime(standin, pod_security="restricted")
    sb = rt.create(_live(base_image, run_id=f"restricted-{name}"))
    files = [SandboxFile(path, data.encode() if isinstance(data, str) else data, 0o755) for path, data in launch.files.items()]
    await sb.start(files=files)  # the rollout's one upload: as uid 1000 (was: tar: root/.claude-forgetui/...: Cannot open: Permission denied)
    try:
        res = await sb.exec(["sh", "-c", _check_script(launch)], timeout_s=30, env=launch.env)
        assert res.exit_code == 0, res.stderr
        head, writable, *rest = res.stdout.splitlines()
        assert head.split() == [str(SANDBOX_UID), str(SANDBOX_UID), SANDBOX_HOME] and writable == "home-writable"
        owners = rest[: len(launch.files)]
        assert owners == [f"{SANDBOX_UID} {p}" for p in sorted(launch.files)]
        assert rest[len(launch.files):] == [f"ok {d}" for d in _state_dirs(launch)], res.stdout
    finally:
        await sb.stop()


async def test_an_image_without_the_user_still_gets_a_writable_home(standin, docker_client, base_image):
    """A task image without a passwd entry for uid 1000 (HOME=/): the exec script gives commands a home they can write."""
    tag = "forgetui-test/no-user:48"
    dockerfile = f"FROM {base_image}\nRUN sed -i '/^forgetui:/d' /etc/passwd /etc/group /etc/shadow && rm -rf {SANDBOX_HOME}\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, network_mode="none")
    try:
        sb = _runtime(standin, pod_security="restricted").create(_live(tag, run_id="restricted-no-user"))
        await sb.start()
        res = await sb.exec(["sh", "-c", 'id -un >/dev/null 2>&1 || echo nameless; echo "$HOME"; touch "$HOME/x" && echo writable'], timeout_s=20)
        assert res.stdout.split() == ["nameless", "/tmp/forgetui-home", "writable"], (res.stdout, res.stderr)
        await sb.stop()
    finally:
        docker_client.images.remove(tag, force=True)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", HARNESSES)
async def test_the_harness_binary_starts_as_uid_1000(standin, docker_client, base_image, name):
    """The harness image (installed from its registry package), its binary run as uid 1000 with the run's environment."""
    harness = load_harness(name)
    try:
        layer = harness.image_layer()
    except ConfigError as exc:  # zeroclaw: on no registry, a binary the user brings
        pytest.skip(f"{name}: {exc}")
    if layer is None:
        pytest.skip(f"{name} installs nothing (it runs from its launch files)")
    image = ensure_image(docker_client, base_image, [layer], None, network_mode="none")
    launch = harness.launch(HELLO, DEAD, WORKDIR)
    rt = _runtime(standin, pod_security="restricted")
    sb = rt.create(_live(image, run_id=f"restricted-bin-{name}"))
    files = [SandboxFile(path, data.encode() if isinstance(data, str) else data, 0o755) for path, data in launch.files.items()]
    await sb.start(files=files)
    try:
        res = await sb.exec(launch.command, timeout_s=90, env=launch.env, workdir=WORKDIR)
        text = (res.stdout + res.stderr).lower()
        for word in ("permission denied", "eacces", "read-only file system", "cannot open"):
            assert word not in text, f"{name} as uid 1000: {word!r} in its output:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        owners = await sb.exec(["sh", "-c", f"find {' '.join(map(shlex.quote, _state_dirs(launch)))} \"$HOME\" -xdev ! -user {SANDBOX_UID} 2>/dev/null | head"], timeout_s=30)
        assert owners.stdout.strip() == "", f"files {name} made that uid {SANDBOX_UID} does not own: {owners.stdout}"
        print(f"{name} as uid {SANDBOX_UID}: exit {res.exit_code}, timed out {res.timed_out}; stderr tail: {res.stderr.strip()[-200:]!r}")
    finally:
        await sb.stop()
