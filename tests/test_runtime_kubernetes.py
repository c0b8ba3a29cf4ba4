"""Kubernetes sandboxes against an API server stand-in whose pods are real containers (tests/k8s_apiserver.py).

The official client's REST calls and our exec websocket (v4 and v5 framing, the error channel's
Status, stdin in frames) meet a server on loopback that runs each pod on the local Docker engine with
its securityContext applied; manifests are validated against the official schemas. What this cannot
show (scheduling, NetworkPolicy enforcement, a registry pull, auth) is in the README's table.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import ipaddress
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes_validate
import pytest
from kubernetes import client

from core.config import RunConfig
from core.errors import ConfigError, SandboxError
from core.runtime import labels as L
from core.runtime import make_runtime
from core.runtime.base import Entry, SandboxFile, SandboxSpec
from core.runtime.cloud_metadata import METADATA_ADDRESSES
from core.runtime.docker.sandbox import KEEP_CAPS
from core.runtime.k8s import checks, detached, exec_ws
from core.runtime.k8s.api import backoff_s
from core.runtime.k8s.config import KubernetesConfig
from core.runtime.k8s.manifest import (
    INSTALLATION,
    KEEP_ALIVE,
    MANAGED_BY,
    allowed_block,
    dns_rules,
    installation_id,
    network_policy_manifest,
)
from core.runtime.k8s.runtime import KubernetesRuntime
from core.runtime.k8s.sandbox import UNPACK
from core.runtime.k8s.startup import PodState, StartWatch
from tests.k8s_apiserver import V4, V5, ApiServerStandIn

K8S_VERSION = "1.30.0"
NS = "sandboxes"


def _spec(**kw: Any) -> SandboxSpec:
    base = {"image": "registry.example/forgetui/env:abc", "run_id": "run/1", "rollout_id": "r 7", "owner": "ann"}
    return SandboxSpec(**{**base, **kw})


# --- manifests and config (no cluster, no engine) -------------------------------------------


def test_manifest_is_valid_and_locked_down():
    rt = KubernetesRuntime(namespace=NS, proxy_public_url="http://10.0.0.5:8400")
    spec = _spec(cpus=1.5, memory="2g", env={"A": "1"}, labels={"team": "x"}, timeout_s=900)
    manifest = rt.build_pod_manifest(spec)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    meta, pod = manifest["metadata"], manifest["spec"]
    assert meta["namespace"] == NS
    assert meta["labels"] == {
        L.MANAGED: "true", L.RUN: "run_1", L.ROLLOUT: "r_7", L.OWNER: "ann", "team": "x",
        MANAGED_BY: "forgetui", INSTALLATION: installation_id(),  # a namespace-wide cleanup, and `gc --all` of this host, find it
    }
    assert meta["annotations"][f"{L.RUN}-raw"] == "run/1"
    assert pod["restartPolicy"] == "Never" and pod["activeDeadlineSeconds"] == 1500
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["terminationGracePeriodSeconds"] == 5  # never 0: no force deletes
    (ctr,) = pod["containers"]
    assert ctr["resources"]["limits"] == {"cpu": "1500m", "memory": "2Gi", "ephemeral-storage": "10Gi"}
    # a small scratch request: a 10Gi request would fit one pod on a typical 20 GiB node, and leave the rest Unschedulable
    assert ctr["resources"]["requests"] == {"cpu": "1500m", "memory": "2Gi", "ephemeral-storage": "1Gi"}
    assert ctr["command"] == ["sh", "-c", KEEP_ALIVE] and "volumes" not in pod  # root: the workdir the runtime makes is writable
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    # root keeps Docker's set, as the docker runtime does: the same task scores the same on both
    assert sc["capabilities"] == {"drop": ["ALL"], "add": list(KEEP_CAPS)} and "runAsUser" not in sc
    assert {"name": "FORGETUI_PROXY_URL", "value": "http://10.0.0.5:8400"} in ctr["env"]


def test_restricted_and_other_pod_options_validate(caplog):
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}}
    cfg = KubernetesConfig(
        namespace="ns", pod_security="restricted", node_selector={"pool": "cpu"}, image_pull_secrets=["regcred"],
        service_account="sb", tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        add_capabilities=["NET_BIND_SERVICE", "SYS_ADMIN"], ephemeral_storage=None, ephemeral_storage_request="2Gi",
        cpu_request=0.25, memory_request="512Mi", runtime_class_name="gvisor", priority_class_name="rollouts",
        affinity=affinity, annotations={"team.example/cost-center": "rl"},
    )
    manifest = KubernetesRuntime(cfg).build_pod_manifest(_spec(image="task:1"))
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    pod = manifest["spec"]
    sc = pod["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}  # all "restricted" allows
    assert 'SYS_ADMIN not added: pod_security = "restricted" allows NET_BIND_SERVICE only' in caplog.text  # said, not silent
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000 and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert (pod["runtimeClassName"], pod["priorityClassName"], pod["affinity"]) == ("gvisor", "rollouts", affinity)
    assert manifest["metadata"]["annotations"]["team.example/cost-center"] == "rl"
    resources = pod["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "250m", "memory": "512Mi", "ephemeral-storage": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    # uid 1000 cannot create /workspace (the container runtime makes it as root, 0755): an emptyDir there, seeded
    # with what the image has at the workdir by an init container of the task image, the pod's group owning it
    (seed,) = pod["initContainers"]
    assert pod["volumes"] == [{"name": "forgetui-workdir", "emptyDir": {}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "forgetui-workdir", "mountPath": "/workspace"}]
    assert seed["image"] == "task:1" and seed["command"][-1] == "/workspace" and seed["securityContext"] == sc
    assert pod["securityContext"]["fsGroup"] == 1000
    with pytest.raises(ConfigError, match="cpu_request .* over runtime.cpus"):
        KubernetesRuntime(cfg).build_pod_manifest(_spec(cpus=0.1))
    broken = KubernetesRuntime(namespace="ns").build_pod_manifest(_spec())
    broken["spec"]["containers"][0]["securityContext"]["privileged"] = "no"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_network_policy_lets_pods_reach_the_proxy_only():
    by_ip = network_policy_manifest("run/1", "ann", KubernetesConfig(namespace=NS), "http://172.18.0.1:8400")
    kubernetes_validate.validate(by_ip, K8S_VERSION, strict=True)
    spec = by_ip["spec"]
    assert spec["podSelector"] == {"matchLabels": {L.MANAGED: "true", L.RUN: "run_1"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    assert spec["egress"] == [{"to": [{"ipBlock": {"cidr": "172.18.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 8400}]}]
    assert by_ip["metadata"]["labels"][MANAGED_BY] == "forgetui" and by_ip["metadata"]["labels"][INSTALLATION] == installation_id()
    in_cluster = KubernetesConfig(namespace=NS, proxy_pod_labels={"app": "forgetui-proxy"}, proxy_namespace="forgetui", dns="auto")
    assert network_policy_manifest("r", "ann", in_cluster.model_copy(update={"dns": "never"}), "http://forgetui-proxy.forgetui.svc:8400")["spec"]["egress"][1:] == []
    by_name = network_policy_manifest("r", "ann", in_cluster, "http://forgetui-proxy.forgetui.svc:8400")
    kubernetes_validate.validate(by_name, K8S_VERSION, strict=True)
    proxy_rule, *dns = by_name["spec"]["egress"]
    assert proxy_rule["to"][0]["podSelector"] == {"matchLabels": {"app": "forgetui-proxy"}}
    assert proxy_rule["to"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "forgetui"}}
    assert dns == dns_rules(in_cluster)  # a name needs a resolver: CoreDNS, NodeLocal DNSCache, OpenShift's (on 5353)
    peers = [peer for rule in dns for peer in rule["to"]]
    assert {"ipBlock": {"cidr": "169.254.20.10/32"}} in peers
    assert any(p.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": "openshift-dns"} for p in peers)
    assert {"protocol": "UDP", "port": 5353} in dns[1]["ports"] and {"protocol": "UDP", "port": 53} in dns[0]["ports"]
    with pytest.raises(ConfigError, match="proxy_pod_labels"):
        network_policy_manifest("r", "ann", KubernetesConfig(), "http://proxy.example:8400")
    # dns = "auto" (the old default): pods reaching a mirror by CIDR usually name it, so DNS comes with egress_allow
    mirror = KubernetesConfig(namespace=NS, egress_allow=["10.9.0.0/16"], dns_cidrs=["10.0.0.2/32"], dns="auto")
    rules = network_policy_manifest("r", "ann", mirror, "http://172.18.0.1:8400")["spec"]["egress"]
    assert rules[1:] == [*dns_rules(mirror), {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}]
    assert {"ipBlock": {"cidr": "10.0.0.2/32"}} in rules[1]["to"]
    assert len(network_policy_manifest("r", "ann", KubernetesConfig(dns="always"), "http://172.18.0.1:8400")["spec"]["egress"]) == 3
    assert len(network_policy_manifest("r", "ann", mirror.model_copy(update={"dns": "never"}), "http://172.18.0.1:8400")["spec"]["egress"]) == 2
    assert network_policy_manifest("r", "ann", KubernetesConfig(egress_allow=["10.9.0.0/16"]), "http://172.18.0.1:8400")["spec"]["egress"][1:] == [
        {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}
    ]  # the default (dns = "never"): no resolver, whatever else is allowed
    # an allowed CIDR never opens link-local (whole, as on Docker) or a cloud metadata address, not even "everything"
    wide = network_policy_manifest("r", "ann", KubernetesConfig(namespace=NS, egress_allow=["0.0.0.0/0", "::/0", "10.0.0.0/8"]), "http://172.18.0.1:8400")
    kubernetes_validate.validate(wide, K8S_VERSION, strict=True)
    blocks = [rule["to"][0]["ipBlock"] for rule in wide["spec"]["egress"] if "ports" not in rule]
    v4 = [a + "/32" for a in METADATA_ADDRESSES if ":" not in a and not a.startswith("169.254.")]
    v6 = [a + "/128" for a in METADATA_ADDRESSES if ":" in a]
    assert blocks == [{"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", *v4]}, {"cidr": "::/0", "except": ["fe80::/10", *v6]}, {"cidr": "10.0.0.0/8"}]
    assert checks.allowed_by(wide, "169.254.169.252", 80) is False and checks.allowed_by(wide, "169.254.169.253", 53) is False
    assert checks.allowed_by(wide, "8.8.8.8", 53) is True
    with pytest.raises(ValueError, match="169.254.0.0/16 is link-local, which no sandbox may reach"):
        KubernetesConfig(egress_allow=["169.254.0.0/16"])
    with pytest.raises(ValueError, match="link-local"):
        KubernetesConfig(egress_allow=["169.254.169.253/32"])


def test_one_list_of_metadata_addresses_closes_them_on_docker_and_kubernetes():
    """The Docker egress proxy refuses, and the NetworkPolicy carves out, the same addresses (Azure's, Alibaba's, GCP's IPv6 too)."""
    from core.runtime.docker import egress

    assert {"fd20:ce::254", "100.100.100.200", "168.63.129.16", "169.254.170.23", "169.254.169.254", "fd00:ec2::254"} <= set(METADATA_ADDRESSES)
    carved = {x for cidr in ("0.0.0.0/0", "::/0") for x in allowed_block(cidr)["except"]}
    for address in METADATA_ADDRESSES:
        assert "metadata" in (egress.address_problem(address, private_ok=True) or ""), address
        ip = ipaddress.ip_address(address)  # each one carved out, alone or inside link-local (carved out whole)
        assert any(ip in ipaddress.ip_network(block) for block in carved), address


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("egress_allow", ["pypi.org"], "is not a CIDR"),
        ("egress_allow", "10.0.0.0/8,mirror.corp", "'mirror.corp' is not a CIDR"),
        ("dns_cidrs", ["resolver"], "is not a CIDR"),
        ("proxy_cidr", "proxy.example", "is not a CIDR"),
        ("network_policy_probe", ["10.0.0.1"], "is not host:port"),
        ("ephemeral_storage_request", "20Gi", "over the limit"),
        ("ephemeral_storage", "lots", "not a Kubernetes quantity"),
    ],
)
def test_bad_kubernetes_options_are_config_errors_when_the_config_loads(key, value, message):
    """Not a plain ValueError at the first pod: `forgetui run` stops before anything starts, naming the key."""
    from core.config import load_config

    with pytest.raises(ConfigError, match=f"{key}.*{message}"):
        load_config(None, ["runtime.kind=kubernetes", f"runtime.kubernetes.{key}={json.dumps(value)}"])
    assert load_config(None, ['runtime.kubernetes.egress_allow="10.0.0.0/8, 192.168.5.0/24"']).runtime.kubernetes.egress_allow == ["10.0.0.0/8", "192.168.5.0/24"]


def test_config_section_and_legacy_keys():
    config = RunConfig.model_validate({"runtime": {"kind": "kubernetes", "kubernetes": {"namespace": "a", "context": "kind-x"}}})
    assert config.runtime.kubernetes.namespace == "a" and config.runtime.kubernetes.context == "kind-x"
    legacy = RunConfig.model_validate({"runtime": {"kind": "kubernetes", "namespace": "old", "image_pull_policy": "Never"}})
    assert legacy.runtime.kubernetes.namespace == "old" and legacy.runtime.kubernetes.image_pull_policy == "Never"
    with pytest.raises(ConfigError, match=r"runtime.kubernetes.namespace"):
        RunConfig.model_validate({"runtime": {"namespace": "x", "kubernetes": {"namespace": "y"}}})
    rt = make_runtime("kubernetes", config=legacy.runtime.kubernetes, proxy_public_url="http://10.0.0.1:1/")
    assert rt.namespace == "old" and rt.proxy_public_url == "http://10.0.0.1:1"


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"metadata": {}, "status": "Success"}, 0),
        ({"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": "42"}]}}, 42),
        ("", "without an exit status"),
        ({"status": "Failure", "reason": "InternalError", "message": "error executing command: container not running"}, "InternalError"),
        ({"status": "Failure", "reason": "NonZeroExitCode", "message": "no details"}, "NonZeroExitCode"),
        ("<html>bad gateway</html>", "unreadable"),
        ([1, 2], "unreadable"),
    ],
)
def test_exit_status_from_the_error_channel(status, expected):
    raw = status.encode() if isinstance(status, str) else json.dumps(status).encode()
    if isinstance(expected, int):
        assert exec_ws.exit_code(raw) == expected
    else:
        with pytest.raises(SandboxError, match=expected):  # a sandbox (infra) error, never TypeError/KeyError
            exec_ws.exit_code(raw)


def test_start_watch_tolerates_a_first_pull_error_and_names_unschedulable():
    cfg = KubernetesConfig(schedule_timeout_s=10, pull_retry_s=5, start_timeout_s=100)
    watch = StartWatch("p", "img", cfg)
    t0 = watch.created
    assert not watch.check(PodState(False, False, False, message="Unschedulable: 0/3 nodes: Insufficient cpu"), t0 + 9)
    with pytest.raises(SandboxError, match="Insufficient cpu"):
        watch.check(PodState(False, False, False, message="Unschedulable: 0/3 nodes: Insufficient cpu"), t0 + 11)
    watch = StartWatch("p", "img", cfg)
    assert not watch.check(PodState(False, True, False, waiting="ErrImagePull"), t0 + 1)
    assert not watch.check(PodState(False, True, False), t0 + 3)  # pulled after all
    assert watch.check(PodState(True, True, False), t0 + 4)
    watch = StartWatch("p", "img", cfg)
    watch.check(PodState(False, True, False, waiting="ImagePullBackOff"), t0 + 1)
    with pytest.raises(SandboxError, match="forgetui images build CONFIG --push"):
        watch.check(PodState(False, True, False, waiting="ImagePullBackOff"), t0 + 7)


def test_backoff_grows_and_honours_retry_after():
    class Throttled(Exception):
        headers = {"Retry-After": "7"}

    assert backoff_s(0) <= 0.5 < backoff_s(4) <= 8
    assert backoff_s(0, Throttled()) == 7


# --- against the stand-in: real client, real websocket, real containers ------------------------


@pytest.fixture()
def standin(docker_client, base_image) -> Iterator[ApiServerStandIn]:
    with ApiServerStandIn(docker_client) as server:
        yield server


@pytest.fixture()
def enforcing_standin(docker_client, base_image) -> Iterator[ApiServerStandIn]:
    """A stand-in whose pods a NetworkPolicy isolates (their own network namespace, the policy's loopback ports relayed)."""
    if os.geteuid() != 0:
        pytest.skip("the stand-in enforces NetworkPolicies with listeners inside pods' network namespaces: it needs root")
    with ApiServerStandIn(docker_client, enforce_network_policy=True) as server:
        yield server


def _runtime(server: ApiServerStandIn, **kw: Any) -> KubernetesRuntime:
    api_client = client.ApiClient(client.Configuration(host=server.url))
    kw.setdefault("request_timeout_s", 10)
    kw.setdefault("require_network_policy", False)  # the stand-in ignores policies unless it enforces them (the isolation tests)
    kw.setdefault("policy_settle_s", 1.0)  # the stand-in applies a policy when the pod starts: a breach is not going away
    return KubernetesRuntime(namespace=NS, api_client=api_client, poll_interval_s=0.05, **kw)


def _live(spec_image: str, **kw: Any) -> SandboxSpec:
    return _spec(image=spec_image, run_id=kw.pop("run_id", "run-k8s"), **kw)


@pytest.mark.parametrize("protocol", [V5, V4])
async def test_exec_and_files_over_the_exec_websocket(docker_client, base_image, protocol):
    with ApiServerStandIn(docker_client, protocols=(protocol,)) as server:
        rt = _runtime(server)
        sb = rt.create(_live(base_image))
        await sb.start()
        res = await sb.exec(["sh", "-c", 'echo "$TOKEN"; pwd; echo err >&2; exit 5'], timeout_s=10, env={"TOKEN": "s3cret-token"})
        assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (5, "s3cret-token\n/workspace\n", "err\n", False)
        assert (await sb.exec(["true"], timeout_s=10)).exit_code == 0
        urls = [q for r in server.requests("GET", "/exec$") for q in r.query]
        assert urls and not any("s3cret" in v for _, v in urls)  # env and argv travel in the stream, not the URL

        await sb.put_file("sub/data.bin", bytes(range(256)) * 10, mode=0o640)
        assert await sb.get_file("/workspace/sub/data.bin") == bytes(range(256)) * 10
        assert (await sb.exec("stat -c %a sub/data.bin", timeout_s=10)).stdout == "640\n"
        with pytest.raises(FileNotFoundError):
            await sb.get_file("nope.txt")
        res = await sb.exec(["python3", "-c", "import sys; print(sys.stdin.read().upper())"], timeout_s=10, stdin=b"abc")
        assert res.stdout == "ABC\n"
        res = await sb.exec("sleep 30; echo never", timeout_s=1)
        assert res.timed_out and res.exit_code in (124, 137) and "never" not in res.stdout
        assert "echo never" in await sb.logs()
        # stdin is closed (255 0) only where the protocol has it, and nothing waits for it
        assert server.stdin_closed == ([V5] * len(server.stdin_closed)) and bool(server.stdin_closed) == (protocol == V5)
        await sb.stop()
        (delete,) = server.requests("DELETE", "/pods/")
        assert dict(delete.query)["gracePeriodSeconds"] == "5"  # graceful, never a force delete


@pytest.mark.parametrize("protocol", [V5, V4])
def test_the_official_client_speaks_to_the_standin(docker_client, base_image, protocol):
    """The stand-in's exec protocol is the one the official client's ws_client expects (its returncode parses our Status)."""
    from kubernetes.stream import stream, ws_client

    if protocol == V5 and not hasattr(ws_client, "V5_CHANNEL_PROTOCOL"):
        pytest.skip("the official client before 31.0 asks for v4 only")  # ours speaks both (test_exec_and_files_over_the_exec_websocket)
    with ApiServerStandIn(docker_client, protocols=(protocol,)) as server:
        rt = _runtime(server)
        sb = rt.create(_live(base_image))
        asyncio.run(sb.start())
        resp = stream(
            rt.core.connect_get_namespaced_pod_exec, sb.name, NS, command=["sh", "-c", "echo out; echo err >&2; exit 3"],
            stdin=False, stdout=True, stderr=True, tty=False, binary=True, _preload_content=False,
        )
        resp.run_forever(timeout=20)
        assert getattr(resp, "subprotocol", protocol) == protocol  # (30.x sends the header itself and keeps no subprotocol)
        assert (resp.read_stdout(), resp.read_stderr(), resp.returncode) == (b"out\n", b"err\n", 3)
        asyncio.run(sb.stop())


async def test_threads_share_the_client_while_execs_run(standin, base_image):
    """Execs have their own connections: REST calls from other threads during them keep working."""
    rt = _runtime(standin)
    boxes = [rt.create(_live(base_image, rollout_id=f"r{i}")) for i in range(2)]
    await asyncio.gather(*(b.start() for b in boxes))

    def reads() -> int:
        return sum(len(rt.core.list_namespaced_pod(NS).items) + bool(rt.core.read_namespaced_pod(boxes[0].name, NS)) for _ in range(10))

    execs = [b.exec(["sh", "-c", f"sleep 0.{i % 4}; echo {i}"], timeout_s=20) for i in range(8) for b in boxes]
    results, counts = await asyncio.gather(asyncio.gather(*execs), asyncio.gather(*(asyncio.to_thread(reads) for _ in range(4))))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8) for _ in boxes]
    assert counts == [30, 30, 30, 30]
    assert await rt.reap(run_id="run-k8s") == 2  # the client is intact afterwards


async def test_capabilities_match_the_docker_runtime(standin, base_image, docker_runtime, run_id):
    rt = _runtime(standin)
    pod = rt.create(_live(base_image))
    await pod.start()
    caps = "grep CapEff /proc/self/status"
    pod_caps = (await pod.exec(caps, timeout_s=10)).stdout
    container = docker_runtime.create(SandboxSpec(image=base_image, run_id=run_id, rollout_id="caps", network="host"))
    await container.start()
    assert pod_caps == (await container.exec(caps, timeout_s=10)).stdout != ""
    await container.stop()
    res = await pod.exec("touch f && chown 65534:65534 f && stat -c %u f && cat /proc/self/status | grep NoNewPrivs", timeout_s=10)
    assert res.exit_code == 0 and res.stdout.split() == ["65534", "NoNewPrivs:", "1"]  # tar can restore owners; no setuid gains
    user = _runtime(standin, run_as_user=1000).create(_live(base_image, rollout_id="uid", workdir="/tmp"))
    await user.start()
    await user.put_file("/tmp/mine.txt", b"x")
    res = await user.exec("id -u; stat -c %u /tmp/mine.txt; grep CapEff /proc/self/status", timeout_s=10)
    assert res.stdout.split()[:2] == ["1000", "1000"] and res.stdout.split()[3] == "0000000000000000"
    await asyncio.gather(pod.stop(), user.stop())


async def test_a_copy_over_32_mib_travels_in_frames_without_stdin_eof(docker_client, base_image):
    data = os.urandom(40 << 20)
    with ApiServerStandIn(docker_client, protocols=(V4,)) as server:  # v4: stdin can never be closed
        sb = _runtime(server).create(_live(base_image))
        await sb.start()
        await sb.put_file("big.bin", data)
        assert max(server.stdin_frames) <= exec_ws.FRAME_BYTES + 1 and len(server.stdin_frames) >= 40
        res = await sb.exec("sha256sum big.bin", timeout_s=60)
        assert res.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        assert hashlib.sha256(await sb.get_file("big.bin")).hexdigest() == hashlib.sha256(data).hexdigest()
        await sb.stop()


async def test_a_download_deadline_moves_with_its_bytes(standin, base_image):
    """Output that keeps coming outlives the first deadline; the same exec without a moving deadline is cut at it."""
    sb = _runtime(standin).create(_live(base_image))
    await sb.start()
    trickle = ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo chunk-$i; sleep 0.1; done"]
    code, out, _ = await sb._run(trickle, None, 0.3, moving_s=5.0)
    assert code == 0 and out.decode().split()[-1] == "chunk-12"
    code, out, _ = await sb._run(trickle, None, 0.3)
    assert code is None and b"chunk-12" not in out  # a fixed deadline: cut while the bytes still came
    await sb.stop()


async def test_a_pod_killed_mid_exec_is_a_sandbox_error(standin, base_image):
    rt = _runtime(standin)
    sb = rt.create(_live(base_image))
    await sb.start()
    running = asyncio.create_task(sb.exec("echo started; sleep 60", timeout_s=120))
    await asyncio.sleep(1.0)
    await asyncio.to_thread(standin.kill_pod, NS, sb.name)
    with pytest.raises(SandboxError, match="is gone"):
        await asyncio.wait_for(running, 30)
    with pytest.raises(SandboxError, match="is gone"):
        await sb.exec(["true"], timeout_s=5)
    standin.exec_status = {"status": "Failure", "reason": "InternalError", "message": "kubelet lost"}
    live = rt.create(_live(base_image, rollout_id="alive"))
    await live.start()
    with pytest.raises(SandboxError, match="exec in pod .* failed: exec failed: InternalError: kubelet lost"):
        await live.exec(["true"], timeout_s=5)
    assert await rt.reap(stopped=True) == 1  # the killed (Failed) pod only


async def test_unschedulable_is_reported_and_the_pod_removed(standin, base_image):
    unschedulable = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}],
    }
    standin.script_next_pod([(30, unschedulable)])
    sb = _runtime(standin, schedule_timeout_s=1).create(_live(base_image))
    with pytest.raises(SandboxError, match="not scheduled within 1s .*Insufficient cpu"):
        await sb.start()
    assert standin.requests("DELETE", f"/pods/{sb.name}$")


async def test_image_pull_errors_transient_then_fatal(standin, base_image):
    pull = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}], "hostIP": "10.0.0.2",
            "containerStatuses": [{"name": "sandbox", "image": base_image, "imageID": "", "ready": False, "restartCount": 0,
                                   "state": {"waiting": {"reason": "ErrImagePull", "message": "i/o timeout"}}}]}
    standin.script_next_pod([(0.5, pull)])
    rt = _runtime(standin, pull_retry_s=1.5)
    first = rt.create(_live(base_image))
    await first.start()  # one ErrImagePull is not the end
    assert (await first.exec("echo up", timeout_s=10)).stdout == "up\n"
    missing = rt.create(_live("forgetui/never-built:0", rollout_id="missing"))
    with pytest.raises(SandboxError, match=r"cannot pull image 'forgetui/never-built:0' \((ImagePullBackOff|ErrImagePull).*forgetui images build CONFIG --push"):
        await missing.start()
    assert standin.requests("DELETE", f"/pods/{missing.name}$")
    root = _runtime(standin, run_as_non_root=True).create(_live(base_image, rollout_id="nonroot"))
    with pytest.raises(SandboxError, match="CreateContainerConfigError.*run_as_user") as info:
        await root.start()
    assert "pull" not in str(info.value)


async def test_api_retries_429_5xx_and_timeouts(standin, base_image):
    standin.fail("POST", f"/namespaces/{NS}/pods$", 429, retry_after=0.2)
    standin.fail("POST", f"/namespaces/{NS}/pods$", 503)
    standin.stall("GET", f"/namespaces/{NS}/pods/forgetui-", 3.0)  # longer than the request timeout
    rt = _runtime(standin, request_timeout_s=1)
    sb = rt.create(_live(base_image))
    await sb.start()
    assert len(standin.requests("POST", f"/namespaces/{NS}/pods$")) == 3
    assert (await sb.exec("echo ok", timeout_s=10)).stdout == "ok\n"
    # a create that timed out but happened: the retry's 409 is ours, and the start goes on
    standin.stall("POST", f"/namespaces/{NS}/pods$", 2.0)
    again = rt.create(_live(base_image, rollout_id="late"))
    await again.start()
    assert (await again.exec("echo ok", timeout_s=10)).stdout == "ok\n"
    standin.fail("GET", "/exec$", 429)  # the exec handshake too: nothing ran, so it is tried again
    standin.fail("GET", "/exec$", 503)
    before = len(standin.requests("GET", "/exec$"))
    assert (await sb.exec("echo once >> runs.txt; cat runs.txt", timeout_s=10)).stdout == "once\n"
    assert len(standin.requests("GET", "/exec$")) == before + 3
    standin.fail("DELETE", "/pods/", 500, times=2)
    await asyncio.gather(sb.stop(), again.stop())
    assert not [k for k, p in standin.pods.items() if not p.obj["metadata"].get("deletionTimestamp")]
    standin.fail("GET", f"/namespaces/{NS}/pods$", 403)
    with pytest.raises(SandboxError, match="listing pods .* 403"):
        await rt.reap(run_id="run-k8s")


class _Health(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).hits.append(self.path)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def test_proxy_reachability_is_checked_from_the_first_pod(standin, base_image):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rt = _runtime(standin, proxy_public_url=f"http://127.0.0.1:{server.server_address[1]}")
        boxes = [rt.create(_live(base_image, rollout_id=f"r{i}")) for i in range(2)]
        for b in boxes:
            await b.start()
        assert _Health.hits == ["/health"]  # once per runtime
        (policy,) = standin.policies.values()
        assert policy["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "127.0.0.1/32"}}]
        await asyncio.gather(*(b.stop() for b in boxes))
        await rt.reap(run_id="run-k8s")
        assert not standin.policies  # the run's policy goes with its pods
    finally:
        server.shutdown()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    rt = _runtime(standin, proxy_public_url=f"http://127.0.0.1:{closed}")
    sb = rt.create(_live(base_image, rollout_id="noproxy"))
    with pytest.raises(SandboxError, match=f"cannot reach the recording proxy at http://127.0.0.1:{closed}"):
        await sb.start()
    assert standin.requests("DELETE", f"/pods/{sb.name}$")


async def test_start_with_files_and_entry_then_reap_only_ours(standin, base_image):
    rt = _runtime(standin)
    sb = rt.create(_live(base_image))
    files = [SandboxFile("in.txt", b"data\n"), SandboxFile("bin/tool.sh", b"#!/bin/sh\necho tool\n", 0o755)]
    await sb.start(files=files, entry=Entry(["sh", "-c", "cat in.txt; ./bin/tool.sh; echo $FOO; exit 2"], 10, {"FOO": "bar"}))
    res = await sb.wait_entry()
    assert (res.exit_code, res.stdout, res.timed_out) == (2, "data\ntool\nbar\n", False)
    scripts = [r.query[2][1] for r in standin.requests("GET", f"/pods/{sb.name}/exec$")]  # sh -c SCRIPT ...
    assert scripts == [checks.PROBE, UNPACK, detached.LAUNCH]  # the first pod's probe, both files in one upload, the entry
    other = rt.create(_live(base_image, run_id="run-other"))
    await other.start()
    stranger = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranger", "labels": {L.RUN: "run-k8s"}},
                "spec": {"containers": [{"name": "c", "image": base_image, "command": ["sleep", "60"]}]}}
    await asyncio.to_thread(rt.core.create_namespaced_pod, NS, stranger)
    assert await rt.reap(run_id="run-k8s") == 1
    left = {name for (_, name), p in standin.pods.items() if not p.obj["metadata"].get("deletionTimestamp")}
    assert left == {other.name, "stranger"}
    listing = standin.requests("GET", f"/namespaces/{NS}/pods$")[-1]
    assert dict(listing.query)["labelSelector"] == f"{L.MANAGED}=true,{L.RUN}=run-k8s"


def test_exec_url_carries_only_the_command_and_flags():
    conf = client.Configuration(host="https://k8s.example:6443")
    url = exec_ws.exec_url(conf, "ns", "pod-1", "sandbox", ["sh", "-c", "a b"], True)
    parts = urlsplit(url)
    assert (parts.scheme, parts.path) == ("wss", "/api/v1/namespaces/ns/pods/pod-1/exec")
    assert parse_qsl(parts.query) == [
        ("command", "sh"), ("command", "-c"), ("command", "a b"), ("container", "sandbox"),
        ("stdin", "true"), ("stdout", "true"), ("stderr", "true"), ("tty", "false"),
    ]


# --- a whole run on the stand-in, and the image a pod pulls ---------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kubeconfig(tmp_path: Path, standin: ApiServerStandIn) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": standin.url}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "me"}}],
        "users": [{"name": "me", "user": {"token": "t0ken"}}],
    }))
    return path


def shell_run_config(standin: ApiServerStandIn, base_image: str, tmp_path: Path, command: str, *sets: str) -> Any:
    """A whole run's config on the stand-in: the toy task `hello`, ShellHarness running ``command``, the proxy on loopback."""
    from core.config import load_config

    port = _free_port()
    cfg = load_config(None, [
        "runtime.kind=kubernetes", f"runtime.kubernetes.kubeconfig={json.dumps(str(_kubeconfig(tmp_path, standin)))}",
        f"runtime.kubernetes.namespace={NS}", f"runtime.base_image={json.dumps(base_image)}", "policy.backend=builtin:tiny",
        "env.name=toy", 'env.tasks=["hello"]', "harness.name=tests.harness_fixtures:ShellHarness", f"proxy.port={port}",
        f"proxy.public_url={json.dumps(f'http://127.0.0.1:{port}')}", *sets,
    ])
    cfg.harness.options = {"command": command}
    return cfg


def test_a_run_on_kubernetes_survives_a_killed_pod(enforcing_standin, base_image, tmp_path, monkeypatch):
    """kubeconfig → official client → stand-in pods, isolated by the run's policy; the killed pod is an infra error, retried, and nothing is left."""
    from core.run import execute_run

    standin = enforcing_standin
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    cfg = shell_run_config(standin, base_image, tmp_path, "sleep 4; echo hi > hello.txt", "run.max_retries=2")
    killed: list[str] = []

    def killer() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not killed:
            for (ns, name), pod in list(standin.pods.items()):
                launched = [r for r in standin.requests("GET", f"/pods/{name}/exec$") if ("command", detached.LAUNCH) in r.query]
                if pod.obj["status"].get("phase") == "Running" and launched:  # the harness runs
                    time.sleep(1.0)
                    standin.kill_pod(ns, name)
                    killed.append(name)
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=killer)
    thread.start()
    summary = asyncio.run(execute_run(cfg))
    thread.join()
    assert killed, "the test never saw a pod to kill"
    from tests.test_run_docker import rows

    ((status, attempt, passed),) = rows(summary.store, "SELECT status, attempt, passed FROM rollouts")
    assert (status, attempt, passed) == ("done", 1, True) and summary.infra_errors == 0
    exec_args = [v for r in standin.requests("GET", "/exec$") for _, v in r.query]
    assert exec_args and not any("/r/" in v for v in exec_args)  # the rollout's proxy token never in a URL
    assert {r.authorization for r in standin.seen} == {"Bearer t0ken"}  # the kubeconfig's token, on REST and exec alike
    assert not [k for k, p in standin.pods.items() if not p.obj["metadata"].get("deletionTimestamp") and p.obj["status"]["phase"] != "Failed"]
    assert not standin.policies  # the run's NetworkPolicy went with it
    needed = {_rbac_need(r) for r in standin.seen if not _optional(r)}
    assert ("", "pods/exec", "get") in needed and needed <= _rbac_granted()  # the documented Role is enough


def _optional(seen: Any) -> bool:
    """A request no Role grants or needs to: a self review (any authenticated user), the API server's endpoints (optional)."""
    return "/selfsubjectaccessreviews" in seen.path or seen.path == "/api/v1/namespaces/default/endpoints/kubernetes"


def _rbac_need(seen: Any) -> tuple[str, str, str]:
    """(API group, resource, verb) a request needs from RBAC."""
    group = "networking.k8s.io" if seen.path.startswith("/apis/networking.k8s.io/") else ""
    parts = seen.path.split("/namespaces/", 1)[1].split("/")  # ns, resource, [name, [subresource]]
    resource = parts[1] + (f"/{parts[3]}" if len(parts) > 3 else "")
    verb = {"POST": "create", "DELETE": "delete", "PUT": "update", "GET": "get" if len(parts) > 2 else "list"}[seen.method]
    return group, resource, verb


def _rbac_granted() -> set[tuple[str, str, str]]:
    import yaml

    docs = yaml.safe_load_all((Path(__file__).resolve().parents[1] / "examples" / "kubernetes-rbac.yaml").read_text())
    (role,) = [d for d in docs if d["kind"] == "Role"]
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("name", ["kubernetes-rbac.yaml", "kubernetes-proxy-service.yaml"])
def test_example_manifests_validate(name):
    import yaml

    docs = list(yaml.safe_load_all((Path(__file__).resolve().parents[1] / "examples" / name).read_text()))
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_images_build_push_names_the_image_pods_pull(docker_client, base_image, tmp_path):
    import subprocess
    import sys

    from core.config import load_config
    from core.proxy.server import BackgroundServer
    from core.registry import load_env, load_harness
    from core.session.setup import RunImages
    from tests.test_images_push import Registry

    sets = ["runtime.kind=kubernetes", f"runtime.base_image={json.dumps(base_image)}", "env.name=toy", "harness.name=react"]
    env = {**os.environ, "FORGETUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    (tmp_path / "run.toml").write_text("")
    cli = [sys.executable, "-m", "forgetui.cli", "images", "build", str(tmp_path / "run.toml"), *[a for s in sets for a in ("--set", s)]]
    refused = subprocess.run([*cli, "--push"], capture_output=True, text=True, env=env, timeout=600)
    assert refused.returncode != 0 and "--push needs runtime.registry" in refused.stderr
    registry = Registry()
    with BackgroundServer(registry) as server:
        address = server.url.removeprefix("http://")
        out = subprocess.run([*cli, "--push", "--set", f"runtime.registry={address}"], capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    task_pushed, harness_pushed = out.stdout.split()  # the task image, then the shared harness's image
    config = load_config(None, [*sets, f"runtime.registry={address}", "proxy.public_url=http://10.0.0.1:1"])
    from core.session.setup import pick_runtime

    runtime = pick_runtime(config)
    env = load_env("toy")
    chosen = asyncio.run(RunImages(runtime, config, env, load_harness("react")).for_task(env.tasks()[0]))
    pod = runtime.build_pod_manifest(_spec(image=chosen.tag, volumes=dict(chosen.volumes), env=dict(chosen.env)))  # type: ignore[attr-defined]
    assert pod["spec"]["containers"][0]["image"] == task_pushed == f"{address}/{chosen.tag}"  # the toy env's: the bare base
    assert pod["spec"]["initContainers"][0]["image"] == harness_pushed == f"{address}/{next(iter(chosen.volumes))}"
    for tag in (chosen.tag, next(iter(chosen.volumes))):
        repo, _, version = tag.rpartition(":")
        assert (repo, version) in registry.manifests
    for pushed in (task_pushed, harness_pushed):
        docker_client.images.remove(pushed)


def test_gc_reaps_the_configured_namespace(standin, base_image, tmp_path, monkeypatch, capsys):
    from forgetui.cli import main

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    kubeconfig = _kubeconfig(tmp_path, standin)
    sb = _runtime(standin).create(_live(base_image, run_id="died", owner=L.default_owner()))
    asyncio.run(sb.start())
    config = tmp_path / "run.toml"
    config.write_text(f'[runtime]\nkind = "kubernetes"\n[runtime.kubernetes]\nkubeconfig = "{kubeconfig}"\nnamespace = "{NS}"\n')
    assert main(["gc", "--runtime", "kubernetes", "--all", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == "1"
    assert standin.requests("DELETE", f"/pods/{sb.name}$")


class _SilentApiServer:
    """Completes the exec websocket handshake, counts what arrives, then never answers (a half-open connection)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.received = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import base64

        conn, _ = self.sock.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key"))
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: " + V5.encode() + b"\r\n\r\n")
        while chunk := conn.recv(4096):
            self.received += chunk


def test_a_silent_connection_is_pinged_then_given_up():
    server = _SilentApiServer()
    conf = client.Configuration(host=f"http://127.0.0.1:{server.sock.getsockname()[1]}")
    ws = exec_ws.connect(conf, exec_ws.exec_url(conf, NS, "p", "sandbox", ["true"], False), 5)
    with pytest.raises(exec_ws.ExecStreamError, match="sent nothing, not even a pong"):  # a deadline would return
        exec_ws.run(ws, None, 600, ping_s=0.3, stall_s=0.5)
    assert server.received[0] & 0x0F == 0x9  # the first frame the server got is a ping (opcode 9)
