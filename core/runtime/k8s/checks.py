"""What the first pod of a run checks: that it reaches the proxy, and that the NetworkPolicy keeps it from the rest.

A policy is only as good as the cluster's network plugin: EKS's VPC CNI without its network policy agent, GKE
Standard without network policy enforcement, k3s with ``--disable-network-policy`` or an old kindnet accept the
object and enforce nothing, and pods reach everything, cloud metadata included. So the first pod tries
destinations the policy forbids (the API server's in-cluster address by default, which every pod can reach
when nothing is enforced; or ``network_policy_probe``); one that answers means the policy is not enforced.
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
    f'if [ "$h" = {APISERVER} ]; then h=$KUBERNETES_SERVICE_HOST; p=$KUBERNETES_SERVICE_PORT; fi; '
    'if [ -z "$h" ] || [ -z "$p" ]; then echo "- - unknown"; continue; fi; '
    'tcp "$h" "$p"; case $? in 0) s=reached;; 1) s=unreachable;; *) s=unknown;; esac; echo "$h $p $s"; done'
)


@dataclass(frozen=True)
class Probe:
    """One destination tried from a pod: ``reached``, ``unreachable`` or ``unknown``."""

    host: str
    port: int | None
    result: str


def probe_args(cfg: KubernetesConfig) -> list[str]:
    """The PROBE script's arguments: (host, port) pairs, the API server's address when none is configured."""
    targets = [host_port(t) for t in cfg.network_policy_probe] or [(APISERVER, 0)]
    return [part for host, port in targets for part in (host, str(port))]


def parse_probes(stdout: str) -> list[Probe]:
    probes = []
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) == 3:
            probes.append(Probe(fields[0], int(fields[1]) if fields[1].isdigit() else None, fields[2]))
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


def isolation_verdict(policy: dict[str, Any], probes: list[Probe]) -> tuple[str, str]:
    """("enforced" | "not-enforced" | "unknown", the destinations behind it) from what the probes found."""
    breaches = [p for p in probes if p.result == "reached" and not allowed_by(policy, p.host, p.port)]
    if breaches:
        return "not-enforced", ", ".join(f"{p.host}:{p.port}" for p in breaches)
    closed = [p for p in probes if p.result == "unreachable"]
    if closed:
        return "enforced", ", ".join(f"{p.host}:{p.port}" for p in closed)
    return "unknown", ", ".join(f"{p.host}:{p.port}" if p.port else "(no address)" for p in probes) or "(none)"


__all__ = ["APISERVER", "PROBE", "PROXY_CHECK", "Probe", "allowed_by", "isolation_verdict", "parse_probes", "probe_args"]
