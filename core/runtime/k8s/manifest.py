"""The objects forgetui creates on a cluster: one Pod per rollout, one NetworkPolicy per run."""

from __future__ import annotations

import ipaddress
import math
from typing import Any
from urllib.parse import urlsplit

from core.errors import ConfigError
from core.runtime import labels as L
from core.runtime.base import SandboxSpec, k8s_memory
from core.runtime.docker_runtime import KEEP_CAPS  # the same set on both runtimes: a task scores the same
from core.runtime.k8s import harness
from core.runtime.k8s.config import KubernetesConfig

CONTAINER = "sandbox"
LIFETIME_GRACE_S = 600  # activeDeadlineSeconds = the rollout's timeout + this
RESTRICTED_UID = 1000  # "restricted" forbids root: the uid used when run_as_user is not set


def in_registry(image: str, registry: str | None) -> str:
    """``image`` as pushed to ``registry`` (what `forgetui images push` makes); a name that already names a registry is kept."""
    first = image.split("/", 1)[0]
    if not registry or ("/" in image and ("." in first or ":" in first or first == "localhost")):
        return image
    return f"{registry.rstrip('/')}/{image}"


def cpu_quantity(cpus: float) -> str:
    milli = max(1, int(round(cpus * 1000)))
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def _container_security(cfg: KubernetesConfig) -> dict[str, Any]:
    restricted = cfg.pod_security == "restricted"
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if restricted:
        added = [c for c in cfg.add_capabilities if c == "NET_BIND_SERVICE"]  # the only one "restricted" allows
    else:
        added = list(dict.fromkeys([*KEEP_CAPS, *cfg.add_capabilities]))
    if added:
        caps["add"] = added
    sc: dict[str, Any] = {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": caps}
    uid = cfg.run_as_user if cfg.run_as_user is not None else (RESTRICTED_UID if restricted else None)
    if uid is not None:
        sc["runAsUser"] = uid
    if cfg.run_as_group is not None:
        sc["runAsGroup"] = cfg.run_as_group
    if cfg.run_as_non_root or restricted:
        sc["runAsNonRoot"] = True
    return sc


def pod_manifest(
    spec: SandboxSpec, name: str, cfg: KubernetesConfig, proxy_public_url: str | None = None, registry: str | None = None
) -> dict[str, Any]:
    """The Pod for ``spec`` (a plain dict, valid against the Kubernetes schema)."""
    raw_labels = spec.all_labels()
    env = dict(spec.env)
    if proxy_public_url:
        env.setdefault("FORGETUI_PROXY_URL", proxy_public_url)
    resources: dict[str, str] = {"cpu": cpu_quantity(spec.cpus), "memory": k8s_memory(spec.memory)}
    if cfg.ephemeral_storage:
        resources["ephemeral-storage"] = cfg.ephemeral_storage
    security = _container_security(cfg)
    pod_sc: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if cfg.run_as_non_root or cfg.pod_security == "restricted":
        pod_sc["runAsNonRoot"] = True
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": cfg.termination_grace_s,
        "securityContext": pod_sc,
        "containers": [
            {
                "name": CONTAINER,
                "image": in_registry(spec.image, registry),
                "imagePullPolicy": cfg.image_pull_policy,
                "command": ["sleep", "infinity"],
                "workingDir": spec.workdir,
                "env": [{"name": k, "value": str(v)} for k, v in env.items()],
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                "securityContext": security,
                "stdin": False,
                "tty": False,
            }
        ],
    }
    if spec.volumes:  # the shared harness: spec.volumes names its image (core.runtime.k8s.harness)
        sources = {in_registry(image, registry): path for image, path in spec.volumes.items()}
        inits, volumes, mounts = harness.pod_parts(sources, cfg, security, {"requests": dict(resources), "limits": dict(resources)})
        pod_spec["containers"][0]["volumeMounts"] = mounts
        pod_spec["volumes"] = volumes
        if inits:
            pod_spec["initContainers"] = inits
    if spec.timeout_s and spec.timeout_s > 0:
        pod_spec["activeDeadlineSeconds"] = math.ceil(spec.timeout_s) + LIFETIME_GRACE_S
    if cfg.service_account:
        pod_spec["serviceAccountName"] = cfg.service_account
    if cfg.node_selector:
        pod_spec["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        pod_spec["tolerations"] = [t.manifest() for t in cfg.tolerations]
    if cfg.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in cfg.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": {k: L.k8s_value(v) for k, v in raw_labels.items()},
            "annotations": {f"{k}-raw": v for k, v in raw_labels.items() if k in (L.RUN, L.ROLLOUT, L.OWNER)},
        },
        "spec": pod_spec,
    }


def policy_name(run_id: str) -> str:
    return f"forgetui-{L.k8s_value(run_id).lower().replace('_', '-').replace('.', '-')}"[:63].rstrip("-")


def _proxy_peers(cfg: KubernetesConfig, proxy_public_url: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(egress rules for the proxy, for DNS) from the proxy's URL and the config."""
    if not proxy_public_url:
        return [], []
    url = urlsplit(proxy_public_url)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    ports = [{"protocol": "TCP", "port": port}]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if cfg.proxy_pod_labels:
        ns = cfg.proxy_namespace or cfg.namespace
        peer = {
            "podSelector": {"matchLabels": dict(cfg.proxy_pod_labels)},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        }
    elif cfg.proxy_cidr or ip is not None:
        cidr = cfg.proxy_cidr or f"{ip}/{ip.max_prefixlen}"  # type: ignore[union-attr]
        peer = {"ipBlock": {"cidr": cidr}}
    else:
        raise ConfigError(
            f"proxy.public_url names a host ({host}), which a NetworkPolicy cannot select: set "
            "runtime.kubernetes.proxy_pod_labels (an in-cluster proxy behind a Service) or runtime.kubernetes.proxy_cidr, "
            "or runtime.kubernetes.network_policy = false"
        )
    rules = [{"to": [peer], "ports": ports}]
    dns: list[dict[str, Any]] = []
    if ip is None:
        dns = [
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            }
        ]
    return rules, dns


# cloud metadata services (AWS/GCP/Azure/OpenStack's link-local one, AWS's IPv6 one): an allowed CIDR never
# opens them, even 0.0.0.0/0 — they hand out the node's credentials
METADATA_BLOCKS = ("169.254.169.254/32", "fd00:ec2::254/128")


def _allowed_block(cidr: str) -> dict[str, Any]:
    """An ``ipBlock`` for an ``egress_allow`` CIDR, with the metadata addresses it contains carved out."""
    net = ipaddress.ip_network(cidr, strict=False)
    carve = []
    for block in map(ipaddress.ip_network, METADATA_BLOCKS):
        # a CIDR that is the metadata address itself was asked for by name: the API server also refuses an equal `except`
        if block.version == net.version and block.subnet_of(net) and block != net:  # type: ignore[arg-type]
            carve.append(str(block))
    return {"cidr": cidr, "except": carve} if carve else {"cidr": cidr}


def network_policy_manifest(
    run_id: str, owner: str, cfg: KubernetesConfig, proxy_public_url: str | None
) -> dict[str, Any]:
    """A NetworkPolicy for the run's pods: no ingress; egress to the proxy (+ DNS, + ``egress_allow``) only."""
    proxy, dns = _proxy_peers(cfg, proxy_public_url)
    extra = [{"to": [{"ipBlock": _allowed_block(cidr)}]} for cidr in cfg.egress_allow]
    labels = {k: L.k8s_value(v) for k, v in L.selector(run_id, owner).items()}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": policy_name(run_id), "namespace": cfg.namespace, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": {L.MANAGED: "true", L.RUN: L.k8s_value(run_id)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [*proxy, *dns, *extra],
        },
    }


__all__ = ["CONTAINER", "in_registry", "network_policy_manifest", "pod_manifest", "policy_name"]
