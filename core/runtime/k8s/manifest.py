"""The objects forgetui creates on a cluster: one Pod per rollout, one NetworkPolicy per run."""

from __future__ import annotations

import ipaddress
import math
import re
import uuid
from typing import Any
from urllib.parse import urlsplit

from core import paths
from core.errors import ConfigError
from core.runtime import labels as L
from core.runtime.base import SandboxSpec, k8s_memory
from core.runtime.cloud_metadata import metadata_blocks
from core.runtime.docker.sandbox import KEEP_CAPS  # the same set on both runtimes: a task scores the same
from core.runtime.k8s import harness
from core.runtime.k8s.config import LINK_LOCAL, KubernetesConfig, quantity_bytes

CONTAINER = "sandbox"
LIFETIME_GRACE_S = 600  # activeDeadlineSeconds = the rollout's timeout + this
INSTALLATION_FILE = "installation-id"
_ID = re.compile(r"[0-9a-f]{8,32}")
RESTRICTED_UID = 1000  # "restricted" forbids root: the uid used when run_as_user is not set
MANAGED_BY = "app.kubernetes.io/managed-by"  # the well-known label: `kubectl delete pods,networkpolicies -l app.kubernetes.io/managed-by=forgetui`
INSTALLATION = "forgetui.installation"  # the forgetui installation (FORGETUI_HOME) that made it: `gc --all` removes its own only
# The pod's own process: it only keeps the pod up (commands come over exec), and ends at once on SIGTERM, so a
# delete is done when the kubelet confirms it, not at the end of the grace period (`sleep` as pid 1 ignores TERM).
KEEP_ALIVE = "trap 'exit 0' TERM; sleep infinity & wait"
# An emptyDir at the workdir (non-root pods): an init container of the task image copies what the image has
# there into it first, entry by entry as in harness.INIT_SCRIPT (a non-root `cp -a dir/. vol/` would set the
# times of the volume's root, which it does not own: EPERM).
WORKDIR_VOLUME = "forgetui-workdir"
WORKDIR_INIT = "forgetui-workdir"
SEED_AT = "/forgetui-workdir"
SEED_SCRIPT = (
    'w="$1"; if [ -d "$w" ]; then for f in "$w"/* "$w"/.[!.]* "$w"/..?*; do '
    f'if [ -e "$f" ] || [ -L "$f" ]; then cp -a "$f" {SEED_AT}/ || exit 1; fi; done; fi'
)


def installation_id() -> str:
    """This installation's id (a label value): made once and kept in FORGETUI_HOME/installation-id.

    Not the host name: cloned VMs and containers share names like ``vm``, and two FORGETUI_HOMEs on one
    host are two installations; either way `gc --all` must not select the other's pods.
    """
    path = paths.home() / INSTALLATION_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if _ID.fullmatch(text):
        return text
    made = uuid.uuid4().hex[:20]
    try:
        with open(path, "x") as f:  # exclusive: two processes starting at once agree on the first one's id
            f.write(made + "\n")
        return made
    except FileExistsError:  # another process wrote it meanwhile (or it held something unreadable: replaced)
        text = path.read_text().strip()
        if _ID.fullmatch(text):
            return text
        path.write_text(made + "\n")
        return made


def object_labels() -> dict[str, str]:
    """Labels on everything forgetui creates on a cluster, beside the run's own."""
    return {MANAGED_BY: "forgetui", INSTALLATION: installation_id()}


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


def runs_as_non_root(cfg: KubernetesConfig) -> bool:
    """Whether the pod's containers run as a non-root uid (which cannot create or write a root-made workdir)."""
    return cfg.pod_security == "restricted" or cfg.run_as_non_root or cfg.run_as_user not in (None, 0)


def _uid(cfg: KubernetesConfig) -> int | None:
    return cfg.run_as_user if cfg.run_as_user is not None else (RESTRICTED_UID if cfg.pod_security == "restricted" else None)


def workdir_volume(cfg: KubernetesConfig, workdir: str) -> bool:
    """Whether the pod gets an emptyDir at ``workdir`` (``workdir_volume``; auto: when it runs as non-root)."""
    if workdir.rstrip("/") in ("", "/tmp") and cfg.workdir_volume != "always":
        return False  # the root cannot be a mount; /tmp is writable by everyone already
    return cfg.workdir_volume == "always" or (cfg.workdir_volume == "auto" and runs_as_non_root(cfg))


def _resources(spec: SandboxSpec, cfg: KubernetesConfig) -> dict[str, dict[str, str]]:
    """Limits from the run's cpus/memory (and ``ephemeral_storage``); requests as configured (default: the limits)."""
    limits = {"cpu": cpu_quantity(spec.cpus), "memory": k8s_memory(spec.memory)}
    if cfg.cpu_request is not None and cfg.cpu_request > spec.cpus:
        raise ConfigError(f"runtime.kubernetes.cpu_request ({cfg.cpu_request:g}) is over runtime.cpus ({spec.cpus:g}), the pod's limit")
    if cfg.memory_request is not None and (quantity_bytes(cfg.memory_request) or 0) > (quantity_bytes(limits["memory"]) or 0):
        raise ConfigError(f"runtime.kubernetes.memory_request ({cfg.memory_request}) is over runtime.memory ({spec.memory}), the pod's limit")
    requests = {"cpu": cpu_quantity(cfg.cpu_request) if cfg.cpu_request else limits["cpu"], "memory": cfg.memory_request or limits["memory"]}
    if cfg.ephemeral_storage:
        limits["ephemeral-storage"] = cfg.ephemeral_storage
    if cfg.ephemeral_storage_request:
        requests["ephemeral-storage"] = cfg.ephemeral_storage_request
    return {"requests": requests, "limits": limits}


def _workdir_parts(
    image: str, workdir: str, cfg: KubernetesConfig, security: dict[str, Any], resources: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(init container, volume, mount) that put a writable emptyDir at ``workdir``, holding what the image has there."""
    init = {
        "name": WORKDIR_INIT,
        "image": image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["sh", "-c", SEED_SCRIPT, "sh", workdir],
        "volumeMounts": [{"name": WORKDIR_VOLUME, "mountPath": SEED_AT}],
        "resources": resources,
        "securityContext": security,
    }
    return init, {"name": WORKDIR_VOLUME, "emptyDir": {}}, {"name": WORKDIR_VOLUME, "mountPath": workdir}


NO_RESOLVER = "127.0.0.1"  # dns = "never": the pod's only nameserver, where nothing answers (a lookup fails at once)


def dns_parts(cfg: KubernetesConfig, proxy_public_url: str | None, aliases: dict[str, str]) -> dict[str, Any]:
    """The pod's ``dnsPolicy``/``dnsConfig``/``hostAliases``: the cluster DNS, or (dns off) /etc/hosts entries only."""
    parts: dict[str, Any] = {}
    if cfg.network_policy and not needs_dns(cfg, proxy_public_url):
        parts = {"dnsPolicy": "None", "dnsConfig": {"nameservers": [NO_RESOLVER]}}
    by_ip: dict[str, list[str]] = {}
    for name, ip in aliases.items():
        by_ip.setdefault(ip, []).append(name)
    if by_ip:
        parts["hostAliases"] = [{"ip": ip, "hostnames": sorted(names)} for ip, names in sorted(by_ip.items())]
    return parts


def pod_manifest(
    spec: SandboxSpec,
    name: str,
    cfg: KubernetesConfig,
    proxy_public_url: str | None = None,
    registry: str | None = None,
    owner: dict[str, str] | None = None,
    aliases: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Pod for ``spec`` (a plain dict, valid against the Kubernetes schema).

    ``owner``: the run's NetworkPolicy (``name``, ``uid``), made the pod's owner: deleting it (a namespace-level
    cleanup) lets the garbage collector remove the run's pods too. ``aliases``: name → address lines of the
    pod's /etc/hosts (``runtime.kubernetes.hosts``; the proxy's host name, resolved by forgetui, when DNS is off).
    """
    raw_labels = spec.all_labels()
    env = dict(spec.env)
    if proxy_public_url:
        env.setdefault("FORGETUI_PROXY_URL", proxy_public_url)
    resources = _resources(spec, cfg)
    security = _container_security(cfg)
    pod_sc: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if cfg.run_as_non_root or cfg.pod_security == "restricted":
        pod_sc["runAsNonRoot"] = True
    image = in_registry(spec.image, registry)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["sh", "-c", KEEP_ALIVE],
        "workingDir": spec.workdir,
        "env": [{"name": k, "value": str(v)} for k, v in env.items()],
        "resources": resources,
        "securityContext": security,
        "stdin": False,
        "tty": False,
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": cfg.termination_grace_s,
        "securityContext": pod_sc,
        "containers": [container],
    }
    inits: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if workdir_volume(cfg, spec.workdir):  # a non-root uid cannot create (or write) the workdir the runtime makes as root
        init, volume, mount = _workdir_parts(image, spec.workdir, cfg, security, resources)
        inits.append(init)
        volumes.append(volume)
        mounts.append(mount)
        gid = cfg.run_as_group if cfg.run_as_group is not None else _uid(cfg)
        if gid:
            pod_sc["fsGroup"] = gid  # the volume's files belong to the pod's group
    if spec.volumes:  # the shared harness: spec.volumes names its image (core.runtime.k8s.harness)
        sources = {in_registry(source, registry): path for source, path in spec.volumes.items()}
        more_inits, more_volumes, more_mounts = harness.pod_parts(sources, cfg, security, resources)
        inits += more_inits
        volumes += more_volumes
        mounts += more_mounts
    if mounts:
        container["volumeMounts"] = mounts
        pod_spec["volumes"] = volumes
    if inits:
        pod_spec["initContainers"] = inits
    if spec.timeout_s and spec.timeout_s > 0:
        pod_spec["activeDeadlineSeconds"] = math.ceil(spec.timeout_s) + LIFETIME_GRACE_S
    optional = {
        "serviceAccountName": cfg.service_account,
        "nodeSelector": dict(cfg.node_selector) or None,
        "tolerations": [t.manifest() for t in cfg.tolerations] or None,
        "imagePullSecrets": [{"name": s} for s in cfg.image_pull_secrets] or None,
        "runtimeClassName": cfg.runtime_class_name,
        "priorityClassName": cfg.priority_class_name,
        "affinity": dict(cfg.affinity) or None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})
    pod_spec.update(dns_parts(cfg, proxy_public_url, {**cfg.hosts, **(aliases or {})}))
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": cfg.namespace,
        "labels": {**object_labels(), **{k: L.k8s_value(v) for k, v in raw_labels.items()}},
        "annotations": {**cfg.annotations, **{f"{k}-raw": v for k, v in raw_labels.items() if k in (L.RUN, L.ROLLOUT, L.OWNER)}},
    }
    if owner:
        metadata["ownerReferences"] = [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **owner}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def policy_name(run_id: str) -> str:
    return f"forgetui-{L.k8s_value(run_id).lower().replace('_', '-').replace('.', '-')}"[:63].rstrip("-")


def _proxy_peers(cfg: KubernetesConfig, proxy_public_url: str | None) -> list[dict[str, Any]]:
    """The egress rule for the proxy, from its URL and the config."""
    if not proxy_public_url:
        return []
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
    return [{"to": [peer], "ports": ports}]


def _in_namespace(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}, "podSelector": {"matchLabels": labels}}


def _ports(port: int) -> list[dict[str, Any]]:
    return [{"protocol": "UDP", "port": port}, {"protocol": "TCP", "port": port}]


NODE_LOCAL_DNS = "169.254.20.10/32"  # NodeLocal DNSCache's usual link-local address (its pods answer on the node)


def dns_rules(cfg: KubernetesConfig) -> list[dict[str, Any]]:
    """Egress to the cluster's resolvers: CoreDNS/kube-dns pods, NodeLocal DNSCache, OpenShift's DNS, ``dns_cidrs``.

    OpenShift's DNS pods answer on 5353 (its Service maps 53 there), and a policy sees the pod's port.
    """
    on_53 = [_in_namespace("kube-system", {"k8s-app": "kube-dns"}), {"ipBlock": {"cidr": NODE_LOCAL_DNS}}]
    on_53 += [{"ipBlock": {"cidr": cidr}} for cidr in cfg.dns_cidrs]
    openshift = _in_namespace("openshift-dns", {"dns.operator.openshift.io/daemonset-dns": "default"})
    return [{"to": on_53, "ports": _ports(53)}, {"to": [openshift], "ports": _ports(5353)}]


def allowed_block(cidr: str) -> dict[str, Any]:
    """An ``ipBlock`` for an ``egress_allow`` CIDR, link-local (whole) and every cloud metadata address it contains carved out.

    The addresses are ``core.runtime.cloud_metadata``'s, the list the Docker egress proxy refuses too; link-local
    goes whole, as Docker's egress proxy refuses it (169.254.169.252/.253 and the like are not in the list).
    """
    net = ipaddress.ip_network(cidr, strict=False)
    carve = [str(ll) for ll in LINK_LOCAL if ll.version == net.version and ll.subnet_of(net) and ll != net]  # type: ignore[arg-type]
    for block in metadata_blocks():
        if any(block.version == ll.version and block.subnet_of(ll) for ll in LINK_LOCAL if str(ll) in carve):  # type: ignore[arg-type]
            continue  # inside the link-local block already carved out
        # a CIDR that is the metadata address itself was asked for by name: the API server also refuses an equal `except`
        if block.version == net.version and block.subnet_of(net) and block != net:  # type: ignore[arg-type]
            carve.append(str(block))
    return {"cidr": cidr, "except": carve} if carve else {"cidr": cidr}


def needs_dns(cfg: KubernetesConfig, proxy_public_url: str | None) -> bool:
    """``dns``: always, never (the default), or (auto) when the proxy is named by host name or pods reach ``egress_allow``."""
    if cfg.dns != "auto":
        return cfg.dns == "always"
    host = urlsplit(proxy_public_url).hostname if proxy_public_url else None
    try:
        named = host is not None and not ipaddress.ip_address(host)
    except ValueError:
        named = True
    return named or bool(cfg.egress_allow)


def network_policy_manifest(
    run_id: str, owner: str, cfg: KubernetesConfig, proxy_public_url: str | None
) -> dict[str, Any]:
    """A NetworkPolicy for the run's pods: no ingress; egress to the proxy (+ DNS, + ``egress_allow``) only."""
    proxy = _proxy_peers(cfg, proxy_public_url)
    dns = dns_rules(cfg) if needs_dns(cfg, proxy_public_url) else []
    extra = [{"to": [{"ipBlock": allowed_block(cidr)}]} for cidr in cfg.egress_allow]
    labels = {**object_labels(), **{k: L.k8s_value(v) for k, v in L.selector(run_id, owner).items()}}
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


__all__ = [
    "CONTAINER", "INSTALLATION", "MANAGED_BY", "NO_RESOLVER", "allowed_block", "dns_parts", "dns_rules", "installation_id", "in_registry", "network_policy_manifest",
    "object_labels", "pod_manifest", "policy_name", "runs_as_non_root", "workdir_volume",
]
