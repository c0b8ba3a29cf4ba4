"""Kubernetes isolation on the API server stand-in (tests/k8s_apiserver.py): Pod Security, NetworkPolicy, cleanup.

* a namespace under Pod Security "restricted": a root pod is refused (403, with what to set), a restricted pod
  runs a real task in the default workdir (an emptyDir there, seeded from the image, writable by uid 1000);
* the run's NetworkPolicy, checked from the first pod: a stand-in that ignores it (as many clusters do) makes
  the run refuse, or run with a loud warning under ``require_network_policy = false``; one that enforces it
  (pods in their own network namespace, the policy's ports relayed) passes, and the pod really cannot reach
  what the policy forbids;
* the policy outlives the run's pods, replaces a stale one on ``--resume``, and owns the pods (deleting it
  removes them); ``gc --all`` removes this host's pods only.
"""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest

from core.errors import SandboxError
from core.runtime import labels as L
from core.runtime.base import Entry, SandboxFile
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.manifest import INSTALLATION, network_policy_manifest, policy_name
from core.runtime.k8s.runtime import IsolationRefused
from tests.k8s_apiserver import ApiServerStandIn
from tests.test_run_docker import rows
from tests.test_runtime_kubernetes import K8S_VERSION, NS, _kubeconfig, _live, _runtime, shell_run_config

pytestmark = pytest.mark.docker


class _Counting(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 200 and counts them (a /health for the proxy check, or a destination to keep out)."""

    hits: list[str]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def loopback_server() -> Iterator[Any]:
    """Starts HTTP servers on the host's loopback: ``make()`` → (port, the paths it was asked for)."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def make() -> tuple[int, list[str]]:
        handler = type("Handler", (_Counting,), {"hits": []})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1], handler.hits

    yield make
    for server in servers:
        server.shutdown()


@pytest.fixture(scope="module")
def seeded_image(docker_client, base_image) -> str:
    """A task image with files of its own in the default workdir, owned by root (a harbor-style task)."""
    from core.runtime.images import ensure_dockerfile_image

    return ensure_dockerfile_image(
        docker_client, "k8s-seeded-workdir", f"FROM {base_image}\nRUN mkdir -p /workspace && echo seeded > /workspace/seed.txt\n"
    )


def _root() -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("the stand-in enforces NetworkPolicies with listeners inside pods' network namespaces: it needs root")


# --- item 1: Pod Security "restricted" and the default workdir ---------------------------------------


async def test_a_restricted_namespace_refuses_root_pods_and_runs_restricted_ones_in_the_default_workdir(docker_client, seeded_image):
    with ApiServerStandIn(docker_client, namespace_security={NS: "restricted"}) as server:
        with pytest.raises(SandboxError, match=r'violates PodSecurity "restricted:latest".*runAsNonRoot != true.*set runtime.kubernetes.pod_security = "restricted"'):
            await _runtime(server).create(_live(seeded_image)).start()
        with pytest.raises(SandboxError, match=r"restricted volume types.*harness_mount = \"init\""):
            await _runtime(server, pod_security="restricted", harness_mount="image").create(
                _live(seeded_image, rollout_id="vol", volumes={"forgetui/react-tree:0": "/opt/forgetui"})
            ).start()
        assert not server.created  # refused at admission: no pod was made
        sb = _runtime(server, pod_security="restricted").create(_live(seeded_image, rollout_id="ok"))  # workdir: /workspace
        entry = "id -u; cat in.txt seed.txt; echo more >> seed.txt && echo appended; mkdir out && touch out/x && echo made; stat -c %u in.txt seed.txt"
        await sb.start(files=[SandboxFile("in.txt", b"data\n")], entry=Entry(["sh", "-c", entry], 20))
        res = await sb.wait_entry()
        # uid 1000 unpacked the task, reads what the image had there, and writes anywhere in the workdir
        assert (res.exit_code, res.stdout.split()) == (0, ["1000", "data", "seeded", "appended", "made", "1000", "1000"]), res.stderr
        assert await sb.get_file("seed.txt") == b"seeded\nmore\n"
        (pod,) = server.created
        assert pod["spec"]["securityContext"]["fsGroup"] == 1000
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["forgetui-workdir"]
        await sb.stop()


def test_a_toy_task_passes_under_restricted_pod_security_with_the_default_workdir(docker_client, base_image, tmp_path, monkeypatch):
    """A whole run in a restricted namespace whose policy is enforced: uid 1000, /workspace, the real toy task and verifier."""
    from core.run import execute_run

    _root()
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    with ApiServerStandIn(docker_client, namespace_security={NS: "restricted"}, enforce_network_policy=True) as server:
        command = "id -u; pwd; echo hi > hello.txt"
        cfg = shell_run_config(server, base_image, tmp_path, command, "runtime.kubernetes.pod_security=restricted", "run.max_retries=0")
        summary = asyncio.run(execute_run(cfg))
        assert (summary.passed, summary.infra_errors) == (1, 0), rows(summary.store, "SELECT status, error FROM rollouts")
        ((stdout,),) = rows(summary.store, "SELECT meta->>'stdout_tail' FROM rollouts")
        assert server.created[0]["spec"]["containers"][0]["workingDir"] == "/workspace"
        assert server.created[0]["spec"]["containers"][0]["securityContext"]["runAsUser"] == 1000
        assert stdout == "1000\n/workspace\n"  # without the workdir's emptyDir: bash: hello.txt: Permission denied


# --- item 2: is the NetworkPolicy enforced? ------------------------------------------------------------


async def test_an_unenforced_policy_refuses_the_run_unless_told_otherwise(standin_ignoring, base_image, loopback_server, caplog):
    """The stand-in ignores policies (as EKS without its policy agent, GKE Standard, k3s --disable-network-policy do)."""
    server = standin_ignoring
    proxy_port, health = loopback_server()
    forbidden_port, forbidden_hits = loopback_server()
    proxy = f"http://127.0.0.1:{proxy_port}"
    # the default probe: the API server's in-cluster address, which every pod reaches where nothing is enforced
    rt = _runtime(server, proxy_public_url=proxy, require_network_policy=True)
    first = rt.create(_live(base_image))
    api_port = server.url.rsplit(":", 1)[1]
    with pytest.raises(IsolationRefused, match=rf"NetworkPolicy {NS}/forgetui-run-k8s is not enforced on node standin-node: pod \S+ reached 127.0.0.1:{api_port}.*require_network_policy = false"):
        await first.start()
    assert health == ["/health"]  # the proxy answered first: this is about isolation, not reachability
    created = len(server.created)
    with pytest.raises(IsolationRefused):  # every later pod of the run: refused before it is created
        await rt.create(_live(base_image, rollout_id="second")).start()
    assert len(server.created) == created
    # a destination named in network_policy_probe (a server on the host's loopback, excluded by the policy)
    rt = _runtime(server, proxy_public_url=proxy, require_network_policy=True, network_policy_probe=[f"127.0.0.1:{forbidden_port}"])
    with pytest.raises(IsolationRefused, match=f"reached 127.0.0.1:{forbidden_port}"):
        await rt.create(_live(base_image, run_id="run-probe")).start()
    # opted out: it runs, loudly, and the pod does reach what the policy forbids
    caplog.set_level(logging.WARNING, logger="core.runtime.k8s.runtime")
    rt = _runtime(server, proxy_public_url=proxy, require_network_policy=False, network_policy_probe=[f"127.0.0.1:{forbidden_port}"])
    sb = rt.create(_live(base_image, run_id="run-anyway"))
    await sb.start()
    warned = [r for r in caplog.records if "NETWORK POLICY NOT ENFORCED" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING and f"127.0.0.1:{forbidden_port}" in warned[0].getMessage()
    before = len(forbidden_hits)
    res = await sb.exec(["python3", "-c", f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{forbidden_port}/x').status)"], timeout_s=20)
    assert res.stdout == "200\n" and len(forbidden_hits) == before + 1
    await sb.stop()


async def test_an_enforced_policy_passes_the_check_and_keeps_pods_in(base_image, docker_client, loopback_server, caplog):
    _root()
    proxy_port, health = loopback_server()
    forbidden_port, forbidden_hits = loopback_server()
    caplog.set_level(logging.INFO, logger="core.runtime.k8s.runtime")
    with ApiServerStandIn(docker_client, enforce_network_policy=True) as server:
        rt = _runtime(server, proxy_public_url=f"http://127.0.0.1:{proxy_port}", require_network_policy=True)
        sb = rt.create(_live(base_image))
        await sb.start()
        api_port = server.url.rsplit(":", 1)[1]
        assert f"is enforced on node standin-node: pod {sb.name} could not reach 127.0.0.1:{api_port}" in caplog.text
        reach = "import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3).close(); print('open')\nexcept OSError:\n    print('closed')"
        results = {}
        for name, port in (("proxy", proxy_port), ("forbidden", forbidden_port), ("api", int(api_port))):
            results[name] = (await sb.exec(["python3", "-c", reach, str(port)], timeout_s=20)).stdout.strip()
        assert results == {"proxy": "open", "forbidden": "closed", "api": "closed"}
        assert health == ["/health"] and forbidden_hits == []
        res = await sb.exec("cat /proc/net/route | wc -l", timeout_s=10)
        assert res.stdout.strip() == "1"  # a header, no route: nothing else is reachable by construction
        await sb.stop()


@pytest.fixture()
def standin_ignoring(docker_client, base_image) -> Iterator[ApiServerStandIn]:
    with ApiServerStandIn(docker_client) as server:
        yield server


# --- item 6: the policy's lifecycle, ownerReferences -------------------------------------------------


async def test_the_policy_is_replaced_on_resume_outlives_the_pods_and_owns_them(standin_ignoring, base_image):
    server = standin_ignoring
    rt = _runtime(server, egress_allow=["10.9.0.0/16"])
    # what a crashed run (or an older config) left under this run's name: other rules
    stale = network_policy_manifest("run-k8s", "ann", KubernetesConfig(namespace=NS, egress_allow=["0.0.0.0/0"]), None)
    made = await asyncio.to_thread(rt.api.net.create_namespaced_network_policy, NS, stale)
    sb = rt.create(_live(base_image))
    await sb.start()
    ((key, policy),) = server.policies.items()
    assert key == (NS, policy_name("run-k8s")) and policy["metadata"]["uid"] == made.metadata.uid
    assert policy["spec"]["egress"] == network_policy_manifest("run-k8s", "ann", rt.cfg, None)["spec"]["egress"]  # this run's rules now
    assert policy["metadata"]["resourceVersion"] == "2" and server.requests("PUT", "/networkpolicies/")
    pod = server.created[0]
    assert pod["metadata"]["ownerReferences"] == [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": policy_name("run-k8s"), "uid": made.metadata.uid}
    ]
    kubernetes_validate.validate({k: v for k, v in pod.items() if k != "status"}, K8S_VERSION, strict=False)
    # a command still running when the run ends: its pod's egress stays closed until the pod is gone
    running = asyncio.create_task(sb.exec("sleep 30", timeout_s=60))
    await asyncio.sleep(1.0)
    assert await rt.reap(run_id="run-k8s") == 1
    assert server.policy_deletions == [(policy_name("run-k8s"), [])]  # deleted after the kubelet confirmed the pod's end
    with pytest.raises(SandboxError, match="is gone"):
        await running
    # a namespace-level cleanup deletes the policy: the garbage collector takes the pods it owns
    again = rt.create(_live(base_image, rollout_id="again"))
    await again.start()
    assert server.created[-1]["metadata"]["ownerReferences"][0]["uid"] == server.policies[key]["metadata"]["uid"]
    await asyncio.to_thread(rt.api.net.delete_namespaced_network_policy, policy_name("run-k8s"), NS)
    for _ in range(100):
        if (NS, again.name) not in server.pods:
            break
        await asyncio.sleep(0.1)
    assert (NS, again.name) not in server.pods and not server.requests("DELETE", f"/pods/{again.name}$")


# --- item 8: gc --all is this installation's (issue 48: not the host name) ----------------------------------


def test_gc_all_removes_this_installations_pods_not_another_installations_under_the_same_login(standin_ignoring, base_image, tmp_path, monkeypatch, capsys):
    from forgetui.cli import main

    server = standin_ignoring
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    rt = _runtime(server)
    mine = rt.create(_live(base_image, run_id="live-here", owner=L.default_owner()))
    asyncio.run(mine.start())
    # a live run of the same login on another CI host, sharing the namespace
    theirs = rt.build_pod_manifest(_live(base_image, run_id="live-there", owner=L.default_owner()), "forgetui-other-host-pod")
    theirs["metadata"]["labels"][INSTALLATION] = "0123456789abcdef0123"  # same host name, another FORGETUI_HOME
    asyncio.run(asyncio.to_thread(rt.core.create_namespaced_pod, NS, theirs))
    config = tmp_path / "run.toml"
    config.write_text(f'[runtime]\nkind = "kubernetes"\n[runtime.kubernetes]\nkubeconfig = "{_kubeconfig(tmp_path, server)}"\nnamespace = "{NS}"\n')
    assert main(["gc", "--runtime", "kubernetes", "--all", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == "1"
    assert server.requests("DELETE", f"/pods/{mine.name}$") and not server.requests("DELETE", "/pods/forgetui-other-host-pod$")
    listing = server.requests("GET", f"/namespaces/{NS}/pods$")[-1]
    assert f"{INSTALLATION}=" in dict(listing.query)["labelSelector"]


def test_installation_id_is_kept_in_forgetui_home_not_taken_from_the_host_name(tmp_path, monkeypatch):
    from core.runtime.k8s.manifest import installation_id, object_labels

    monkeypatch.setattr("socket.gethostname", lambda: "vm")  # cloned VMs share such names
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "a"))
    first = installation_id()
    assert first == installation_id() == (tmp_path / "a" / "installation-id").read_text().strip()
    assert object_labels()[INSTALLATION] == first
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "b"))  # a second FORGETUI_HOME on the same host
    second = installation_id()
    assert second != first and "vm" not in (first, second)
    (tmp_path / "b" / "installation-id").write_text("not an id\n")  # damaged: replaced, not used as a label
    assert installation_id() not in ("not an id", second) and len(installation_id()) == 20
