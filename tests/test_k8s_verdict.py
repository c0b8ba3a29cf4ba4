"""The NetworkPolicy verdict through NAT, per node, with a late plugin; the run's first verdict before its other pods; DNS off.

Pure functions for the address arithmetic (a kind cluster's and a GKE-like cluster's addresses), the API
stand-in for the rest: its pods on this host, a policy enforced with a pod network namespace of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from core.errors import SandboxError
from core.runtime.k8s import checks
from core.runtime.k8s.checks import Probe
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.manifest import NO_RESOLVER, network_policy_manifest
from core.runtime.k8s.runtime import IsolationRefused
from tests.k8s_apiserver import ApiServerStandIn
from tests.test_runtime_kubernetes import NS, _live, _runtime

PROXY = "http://172.18.0.1:8400"


def _policy(**cfg):
    return network_policy_manifest("r", "ann", KubernetesConfig(**cfg), PROXY)


# --- the verdict's arithmetic ------------------------------------------------------------------------


def test_kind_with_its_node_network_allowed_is_not_refused_as_unenforced():
    """kind: ClusterIP 10.96.0.1 → endpoint 172.18.0.2:6443, nodes 172.18.0.x; 172.18.0.0/16 allowed."""
    policy = _policy(egress_allow=["172.18.0.0/16"])
    reached = [Probe("10.96.0.1", 443, "reached", apiserver=True), Probe("172.18.0.2", 6443, "reached"), Probe("172.18.0.3", 10250, "reached")]
    # the old verdict judged the ClusterIP alone: "not-enforced", a working policy refused
    assert checks.isolation_verdict(policy, reached, [("172.18.0.2", 6443)], node_ip="172.18.0.3") == (
        "covered", "10.96.0.1:443, 172.18.0.2:6443, 172.18.0.3:10250"
    )
    # endpoints unreadable (no RBAC in default): a wide allowed block may hold the endpoint, so the ClusterIP tells nothing
    assert checks.isolation_verdict(policy, reached[:1], None)[0] == "covered"


def test_a_ten_slash_eight_allowance_no_longer_hides_a_breach_or_passes_unchecked():
    """GKE-like: ClusterIP 10.96.0.1, the API server's endpoint 34.118.0.2:443 (outside 10/8), nodes 10.128.0.x."""
    policy = _policy(egress_allow=["10.0.0.0/8"])
    endpoints = [("34.118.0.2", 443)]
    probes = [Probe("10.96.0.1", 443, "reached", apiserver=True), Probe("34.118.0.2", 443, "reached"), Probe("10.128.0.5", 10250, "reached")]
    assert checks.isolation_verdict(policy, probes, endpoints, node_ip="10.128.0.5") == ("not-enforced", "34.118.0.2:443")
    closed = [Probe("10.96.0.1", 443, "unreachable", apiserver=True), Probe("34.118.0.2", 443, "unreachable"), Probe("10.128.0.5", 10250, "reached")]
    assert checks.isolation_verdict(policy, closed, endpoints, node_ip="10.128.0.5") == ("enforced", "34.118.0.2:443")
    # a closed kubelet alone proves nothing (a node firewall closes it too)
    assert checks.isolation_verdict(_policy(), [Probe("10.128.0.5", 10250, "unreachable")], [], node_ip="10.128.0.5")[0] == "unknown"
    assert checks.probe_args(KubernetesConfig(), "10.128.0.5", endpoints) == [checks.APISERVER, "0", "34.118.0.2", "443", "10.128.0.5", "10250"]
    assert checks.probe_args(KubernetesConfig(network_policy_probe=["@node:8080", "10.0.0.9:80"]), "10.128.0.5") == ["10.128.0.5", "8080", "10.0.0.9", "80"]


def test_dns_is_off_by_default_and_names_come_from_etc_hosts(monkeypatch):
    from core.runtime.k8s.runtime import KubernetesRuntime

    rt = KubernetesRuntime(namespace=NS, proxy_public_url="http://localhost:8400", proxy_cidr="127.0.0.1/32", hosts={"mirror.internal": "10.9.0.7"})
    rt._resolve_aliases()
    pod = rt.build_pod_manifest(_live("img"))["spec"]
    assert pod["dnsPolicy"] == "None" and pod["dnsConfig"] == {"nameservers": [NO_RESOLVER]}
    aliases = {n: a["ip"] for a in pod["hostAliases"] for n in a["hostnames"]}
    assert aliases["mirror.internal"] == "10.9.0.7" and aliases["localhost"] in ("127.0.0.1", "::1")
    egress = network_policy_manifest("r", "a", rt.cfg, rt.proxy_public_url)["spec"]["egress"]
    assert not [r for r in egress if any(p["port"] == 53 for p in r.get("ports", []))]  # and no DNS rule in the policy
    cluster = KubernetesRuntime(namespace=NS, proxy_public_url="http://10.0.0.5:8400", dns="always")
    cluster._resolve_aliases()
    assert "dnsPolicy" not in cluster.build_pod_manifest(_live("img"))["spec"]  # the cluster's resolver, as before
    unresolvable = KubernetesRuntime(namespace=NS, proxy_public_url="http://no-such-host.invalid:8400", proxy_cidr="10.0.0.5/32")
    with pytest.raises(SandboxError, match=r'does not resolve here .*runtime.kubernetes.hosts = \{"no-such-host.invalid" = "ADDRESS"\}.*dns = "always"'):
        unresolvable._resolve_aliases()


# --- on the stand-in ----------------------------------------------------------------------------------


def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the stand-in enforces NetworkPolicies with listeners inside pods' network namespaces: it needs root")


@pytest.fixture()
def loopback_proxy():
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


async def test_a_policy_applied_late_passes_after_a_retry_and_a_breach_that_stays_is_refused(docker_client, base_image, loopback_proxy, caplog):
    _root()
    caplog.set_level(logging.INFO, logger="core.runtime.k8s.runtime")
    with ApiServerStandIn(docker_client, enforce_network_policy=True, policy_delay_s=3.0) as server:
        rt = _runtime(server, proxy_public_url=loopback_proxy, require_network_policy=True, policy_settle_s=15)
        sb = rt.create(_live(base_image))
        await sb.start()
        assert "trying again (the plugin may apply it late)" in caplog.text and "is enforced on node standin-node" in caplog.text
        await sb.stop()
        rt = _runtime(server, proxy_public_url=loopback_proxy, require_network_policy=True, policy_settle_s=0)
        with pytest.raises(IsolationRefused, match="is not enforced on node standin-node"):
            await rt.create(_live(base_image, run_id="run-impatient")).start()


async def test_every_node_the_run_uses_is_checked_once(docker_client, base_image, loopback_proxy):
    _root()
    with ApiServerStandIn(docker_client, enforce_network_policy=True, nodes=("node-a", "node-b")) as server:
        rt = _runtime(server, proxy_public_url=loopback_proxy, require_network_policy=True)
        sandboxes = [rt.create(_live(base_image, rollout_id=f"r{i}")) for i in range(3)]
        for sb in sandboxes:
            await sb.start()
        probed = [sb.node for sb in sandboxes if any(("command", checks.PROBE) in r.query for r in server.requests("GET", f"/pods/{sb.name}/exec$"))]
        assert [sb.node for sb in sandboxes] == ["node-a", "node-b", "node-a"] and probed == ["node-a", "node-b"]
        for sb in sandboxes:
            await sb.stop()


async def test_no_other_pod_is_created_before_the_first_pods_verdict(docker_client, base_image, loopback_proxy):
    with ApiServerStandIn(docker_client) as server:  # ignores policies: the verdict refuses the run
        rt = _runtime(server, proxy_public_url=loopback_proxy, require_network_policy=True)
        starts = [rt.create(_live(base_image, rollout_id=f"r{i}")).start() for i in range(4)]
        results = await asyncio.gather(*starts, return_exceptions=True)
        assert all(isinstance(r, IsolationRefused) for r in results), results
        assert len(server.requests("POST", "/pods$")) == 1  # the other three were never created


async def test_an_allowance_covering_every_probe_is_refused_under_require(docker_client, base_image, loopback_proxy):
    """egress_allow holds the API server's address and endpoints: the old verdict said "unknown" and ran with a warning."""
    with ApiServerStandIn(docker_client) as server:
        rt = _runtime(server, proxy_public_url=loopback_proxy, require_network_policy=True, egress_allow=["127.0.0.0/8"])
        with pytest.raises(IsolationRefused, match=r"cannot check that NetworkPolicy .* is enforced.*may allow \(egress_allow, after NAT\).*network_policy_probe"):
            await rt.create(_live(base_image)).start()


async def test_proxy_host_name_reaches_pods_through_etc_hosts(docker_client, base_image, loopback_proxy):
    port = loopback_proxy.rsplit(":", 1)[1]
    with ApiServerStandIn(docker_client) as server:
        rt = _runtime(server, proxy_public_url=f"http://forgetui-proxy.test:{port}", proxy_cidr="127.0.0.1/32", hosts={"forgetui-proxy.test": "127.0.0.1"})
        sb = rt.create(_live(base_image))
        await sb.start()  # its proxy check resolved the name from /etc/hosts
        res = await sb.exec(["sh", "-c", "getent hosts forgetui-proxy.test; getent hosts example.com || echo no-resolver"], timeout_s=20)
        assert res.stdout.splitlines()[0].split() == ["127.0.0.1", "forgetui-proxy.test"]
        assert server.created[0]["spec"]["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["forgetui-proxy.test"]}]
        await sb.stop()
