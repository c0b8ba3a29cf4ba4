"""What the first pod of a run checks: that it reaches the proxy, and that the NetworkPolicy keeps it from the rest.

A policy is only as good as the cluster's network plugin: EKS's VPC CNI without its network policy agent, GKE
Standard without network policy enforcement, k3s with ``--disable-network-policy`` or an old kindnet accept the
object and enforce nothing, and pods reach everything, cloud metadata included. So the first pod tries
destinations the policy forbids (the API server's in-cluster address by default, which every pod can reach
when nothing is enforced; or ``network_policy_probe``); one that answers means the policy is not enforced.

The network plugin judges the packet after NAT: a probe of the API server's ClusterIP reaches (or not) its real
endpoint, so the verdict judges both the ClusterIP and the endpoints the runtime read (``default/kubernetes``);
a target that an allowed block covers, or may cover when the endpoints cannot be read, tells nothing and is
left out. Its node's kubelet (``hostIP:10250``) is tried too: it answers pods on a cluster that enforces nothing
(metrics-server scrapes it from a pod), so reaching it shows a breach (a closed port alone proves nothing).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.runtime.k8s.config import KubernetesConfig, host_port

# Asks the proxy's /health from inside a pod with whatever client the image has (exit 3: none).
PROXY_CHECK = (
    'u="$1/health"; '
    'if command -v curl >/dev/null 2>&1; then curl -fsS -m 10 -o /dev/null "$u"; '
    'elif command -v wget >/dev/null 2>&1; then wget -q -T 10 -O /dev/null "$u"; '
    "elif command -v python3 >/dev/null 2>&1; then python3 -c 'import sys, urllib.request; "
    "urllib.request.urlopen(sys.argv[1], timeout=10)' \"$u\"; "
    "else exit 3; fi"
)
APISERVER = "@apiserver"  # the probe target standing for $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
NODE = "@node"  # a probe target's host standing for the pod's node (its hostIP): "@node:10250" is its kubelet
KUBELET_PORT = 10250
PROBE_TIMEOUT_S = 5
# Tries a TCP connection to each (host, port) argument pair with whatever the image has; prints
# "host port reached|unreachable|unknown" per pair (unknown: no tool, or the API server's address unset).
PROBE = (
    "tcp() { "
    "if command -v python3 >/dev/null 2>&1; then python3 -c 'import socket, sys\n"
    "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()\n"
    f"except OSError:\n    sys.exit(1)' \"$1\" \"$2\" {PROBE_TIMEOUT_S}; return $?; fi; "
    "if command -v bash >/dev/null 2>&1 && command -v timeout >/dev/null 2>&1; then "
    f"timeout {PROBE_TIMEOUT_S} bash -c 'exec 3<>\"/dev/tcp/$1/$2\"' sh \"$1\" \"$2\" 2>/dev/null && return 0; return 1; fi; "
    f"if command -v nc >/dev/null 2>&1; then nc -z -w {PROBE_TIMEOUT_S} \"$1\" \"$2\" 2>/dev/null && return 0; return 1; fi; "
    "return 3; }; "
    'while [ $# -ge 2 ]; do h=$1; p=$2; shift 2; '
    f'k=-; if [ "$h" = {APISERVER} ]; then h=$KUBERNETES_SERVICE_HOST; p=$KUBERNETES_SERVICE_PORT; k=api; fi; '
    'if [ -z "$h" ] || [ -z "$p" ]; then echo "- - unknown $k"; continue; fi; '
    'tcp "$h" "$p"; case $? in 0) s=reached;; 1) s=unreachable;; *) s=unknown;; esac; echo "$h $p $s $k"; done'
)


@dataclass(frozen=True)
class Probe:
    """One destination tried from a pod: ``reached``, ``unreachable`` or ``unknown``; ``apiserver``: the in-cluster address."""

    host: str
    port: int | None
    result: str
    apiserver: bool = False


def probe_args(cfg: KubernetesConfig, host_ip: str | None = None, endpoints: list[tuple[str, int]] | None = None) -> list[str]:
    """The PROBE script's arguments: (host, port) pairs; by default the API server (its ClusterIP, and its endpoints
    directly: no NAT to guess about) and the pod's node's kubelet.

    ``@node`` stands for ``host_ip`` (left out when it is not known).
    """
    targets = [host_port(t) for t in cfg.network_policy_probe] or [(APISERVER, 0), *(endpoints or []), (NODE, KUBELET_PORT)]
    resolved = [(host_ip if host == NODE else host, port) for host, port in targets if host != NODE or host_ip]
    return [part for host, port in dict.fromkeys(resolved) for part in (host, str(port))]


def parse_probes(stdout: str) -> list[Probe]:
    probes = []
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) in (3, 4):
            port = int(fields[1]) if fields[1].isdigit() else None
            probes.append(Probe(fields[0], port, fields[2], len(fields) == 4 and fields[3] == "api"))
    return probes


def _networks(cidrs: Iterable[dict[str, Any]]) -> list[tuple[Any, list[Any]]]:
    return [
        (ipaddress.ip_network(b["cidr"], strict=False), [ipaddress.ip_network(x, strict=False) for x in b.get("except", [])])
        for b in cidrs
    ]


def allowed_by(policy: dict[str, Any], host: str, port: int | None) -> bool:
    """Whether ``policy``'s egress rules let a pod reach ``host:port`` (an address in an ``ipBlock``, on a rule's port).

    Destinations named by host name, or reached through pod and namespace selectors, cannot be told apart
    here: they count as forbidden (a probe target the policy allows by selector would be a wrong choice).
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    for rule in policy["spec"].get("egress", []):
        ports = {p.get("port") for p in rule.get("ports", [])}
        if ports and port not in ports:
            continue
        blocks = _networks(peer["ipBlock"] for peer in rule.get("to", []) if "ipBlock" in peer)
        if any(ip in net and not any(ip in x for x in carved) for net, carved in blocks):
            return True
    return False


def _wide_blocks(policy: dict[str, Any]) -> list[str]:
    """The policy's ipBlocks wider than one address: any of them may hold an endpoint behind a ClusterIP."""
    wide = []
    for rule in policy["spec"].get("egress", []):
        for peer in rule.get("to", []):
            block = peer.get("ipBlock")
            if block and ipaddress.ip_network(block["cidr"], strict=False).num_addresses > 1:
                wide.append(block["cidr"])
    return wide


def covered(policy: dict[str, Any], probe: Probe, endpoints: list[tuple[str, int]] | None) -> bool:
    """Whether the policy may allow what ``probe`` reached: its address, or (the API server) an endpoint behind it.

    ``endpoints``: the API server's real addresses after NAT (None: unknown, so any block wider than one
    address might hold one).
    """
    if allowed_by(policy, probe.host, probe.port):
        return True
    if not probe.apiserver:
        return False
    if endpoints is None:
        return bool(_wide_blocks(policy))
    return any(allowed_by(policy, host, port) for host, port in endpoints)


def isolation_verdict(
    policy: dict[str, Any], probes: list[Probe], endpoints: list[tuple[str, int]] | None = None, *, node_ip: str | None = None
) -> tuple[str, str]:
    """("enforced" | "not-enforced" | "unknown" | "covered", the destinations behind it) from what the probes found.

    "covered": every destination that answered or not is one the policy may allow (after NAT): nothing was
    learned, set ``network_policy_probe``. A closed kubelet (``node_ip``) alone proves nothing.
    """
    judged = [p for p in probes if p.result in ("reached", "unreachable")]
    telling = [p for p in judged if not covered(policy, p, endpoints)]
    breaches = [p for p in telling if p.result == "reached"]
    if breaches:
        return "not-enforced", ", ".join(f"{p.host}:{p.port}" for p in breaches)
    closed = [p for p in telling if p.result == "unreachable" and not (p.host == node_ip and p.port == KUBELET_PORT)]
    if closed:
        return "enforced", ", ".join(f"{p.host}:{p.port}" for p in closed)
    if judged and not telling:
        return "covered", ", ".join(f"{p.host}:{p.port}" for p in judged)
    return "unknown", ", ".join(f"{p.host}:{p.port}" if p.port else "(no address)" for p in probes) or "(none)"


__all__ = ["APISERVER", "KUBELET_PORT", "NODE", "PROBE", "PROXY_CHECK", "Probe", "allowed_by", "covered", "isolation_verdict", "parse_probes", "probe_args"]
