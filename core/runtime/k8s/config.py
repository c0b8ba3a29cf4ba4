"""`runtime.kubernetes`: every pod option a run config can set (see examples/kubernetes.toml)."""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.errors import ConfigError

log = logging.getLogger(__name__)

# link-local: never reachable from a pod, whatever egress_allow says (as the Docker runtime's egress proxy refuses it)
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
# runtime.<key> (the old top-level spelling) -> runtime.kubernetes.<key>
LEGACY_KEYS = ("namespace", "kubeconfig", "image_pull_policy")


class Toleration(BaseModel):
    """One pod toleration, as in the Pod spec."""

    model_config = ConfigDict(extra="forbid")

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    def manifest(self) -> dict[str, Any]:
        names = {"toleration_seconds": "tolerationSeconds"}
        return {names.get(k, k): v for k, v in self.model_dump().items() if v is not None}


class KubernetesConfig(BaseModel):
    """Where pods run, what they may do, and how long forgetui waits for the API."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    namespace: str = Field("default", description="where the run's pods and NetworkPolicy are made")
    kubeconfig: str | None = Field(None, description="path to a kubeconfig (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    context: str | None = Field(None, description="kubeconfig context (default: the current one)")
    in_cluster: bool | None = Field(None, description="use the pod's service account (default: when running in a pod)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="the pods' imagePullPolicy")
    image_pull_secrets: list[str] = Field(default_factory=list, description="names of Secrets the pods pull their images with")
    service_account: str | None = Field(None, description="the pod's service account (its token is never mounted)")
    pod_security: Literal["baseline", "restricted"] = Field(
        "baseline",
        description="baseline: root with Docker's default capabilities (as the docker runtime); restricted: "
        "non-root, every capability dropped (namespaces under Pod Security 'restricted')",
    )
    run_as_user: int | None = Field(None, ge=0, description="uid (restricted defaults to 1000)")
    run_as_group: int | None = Field(None, ge=0, description="gid (restricted defaults to 1000)")
    run_as_non_root: bool = Field(False, description="ask the kubelet to refuse a root container (restricted sets it)")
    add_capabilities: list[str] = Field(default_factory=list, description="capabilities added to the kept set")
    node_selector: dict[str, str] = Field(default_factory=dict, description="node labels the pods must land on")
    tolerations: list[Toleration] = Field(default_factory=list, description="taints the pods tolerate")
    ephemeral_storage: str | None = Field("10Gi", description="scratch disk limit per pod (none: unlimited)")
    ephemeral_storage_request: str | None = Field(
        "1Gi", description="scratch disk the scheduler reserves per pod (small: a 10Gi request fits one pod per 20 GiB node)"
    )
    cpu_request: float | None = Field(None, gt=0, description="CPUs the scheduler reserves (default runtime.cpus, the limit)")
    memory_request: str | None = Field(None, description="memory the scheduler reserves (default runtime.memory, the limit)")
    runtime_class_name: str | None = Field(None, description="the pod's RuntimeClass (gvisor, kata: a sandboxed kernel)")
    priority_class_name: str | None = Field(None, description="the pod's PriorityClass")
    affinity: dict[str, Any] = Field(default_factory=dict, description="the pod's affinity, as in the Pod spec (nodeAffinity, ...)")
    annotations: dict[str, str] = Field(default_factory=dict, description="more annotations on every pod")
    workdir_volume: Literal["auto", "always", "never"] = Field(
        "auto",
        description="an emptyDir at the workdir, seeded from the image's own workdir by an init container (auto: when "
        "the pod runs as non-root, which could not create or write a missing workdir)",
    )
    termination_grace_s: int = Field(5, ge=1, description="grace period of pod deletes (never 0: no force deletes)")
    schedule_timeout_s: float = Field(300.0, gt=0, description="wait this long for a node (Unschedulable is reported)")
    start_timeout_s: float = Field(600.0, gt=0, description="wait this long from scheduled to Running (image pull included)")
    pull_retry_s: float = Field(60.0, ge=0, description="tolerate image-pull errors this long (the first is often transient)")
    request_timeout_s: float = Field(30.0, gt=0, description="per API request and websocket connect/read stall")
    api_retries: int = Field(5, ge=0, description="retries of 429/5xx/connection errors, with exponential backoff")
    ping_interval_s: float = Field(30.0, gt=0, description="websocket ping during silent execs")
    reattach_s: float = Field(
        300.0, gt=0, description="a command runs detached in the pod: its output stream may stay lost this long (reattached) before the rollout is an infra error"
    )
    network_policy: bool = Field(True, description="a NetworkPolicy per run: pods reach the proxy (and DNS) only")
    require_network_policy: bool = Field(
        True,
        description="check from the first pod that the policy is enforced (a destination it forbids does not answer) "
        "and refuse to run if not; false: run anyway, with a warning",
    )
    network_policy_probe: list[str] = Field(
        default_factory=list,
        description="host:port destinations the policy forbids, tried from the first pod on each node (default: the API "
        "server's in-cluster address, $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, and the node's kubelet, "
        "@node:10250); pick ones outside egress_allow that answer when nothing is enforced",
    )
    policy_settle_s: float = Field(
        10.0, ge=0, description="a probe that gets through is tried again this long (a network plugin applies a new policy a moment late)"
    )
    dns: Literal["never", "always", "auto"] = Field(
        "never",
        description="never (default): no resolver; the names a run needs (the proxy's host name, `hosts`) go in each "
        "pod's /etc/hosts. always: the cluster DNS, which resolves any name (Service names too) and carries data out "
        "in queries. auto: always when the proxy is named by host name or egress_allow is set (the old default)",
    )
    hosts: dict[str, str] = Field(
        default_factory=dict, description="more names for the pods' /etc/hosts, name = address (a mirror in egress_allow)"
    )
    dns_cidrs: list[str] = Field(default_factory=list, description="resolvers besides the cluster DNS pods and NodeLocal DNSCache (CIDRs)")
    proxy_cidr: str | None = Field(None, description="the proxy's address block for the policy (default: proxy.public_url's host if an IP)")
    proxy_pod_labels: dict[str, str] = Field(default_factory=dict, description="or: labels of the proxy's pods (an in-cluster proxy)")
    proxy_namespace: str | None = Field(None, description="namespace of those pods (default: this namespace)")
    egress_allow: list[str] = Field(
        default_factory=list, description="more CIDRs pods may reach (a package mirror); cloud metadata addresses stay closed"
    )
    check_proxy: bool = Field(True, description="check from the first pod that proxy.public_url answers")
    check_permissions: bool = Field(
        True, description="before the first pod: ask the API server (SelfSubjectAccessReview) whether this identity may do what a run needs"
    )
    quota_wait_s: float = Field(
        300.0, ge=0, description="a pod refused for an exceeded ResourceQuota waits this long for quota (another pod's end) before the rollout fails"
    )
    unschedulable_s: float = Field(
        60.0, gt=0, description="once the scheduler says why a pod fits no node, wait this long (schedule_timeout_s when a cluster autoscaler is adding one)"
    )
    harness_mount: Literal["init", "image"] = Field(
        "init",
        description="how the shared harness reaches a pod: init (an init container copies it into an emptyDir; any "
        "cluster) or image (an image volume: Kubernetes >= 1.31 with the ImageVolume feature gate)",
    )

    @field_validator("egress_allow", "dns_cidrs", "network_policy_probe", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):  # --set runtime.kubernetes.egress_allow=10.0.0.0/8,192.168.5.0/24
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("egress_allow", "dns_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str], info: Any) -> list[str]:
        for cidr in value:
            _check_cidr(cidr, f"runtime.kubernetes.{info.field_name}")
        return value

    @field_validator("egress_allow")
    @classmethod
    def _not_link_local(cls, value: list[str]) -> list[str]:
        for cidr in value:
            net = ipaddress.ip_network(cidr.strip(), strict=False)
            if any(net.subnet_of(ll) for ll in LINK_LOCAL if ll.version == net.version):  # type: ignore[arg-type]
                raise ValueError(
                    f"runtime.kubernetes.egress_allow: {cidr} is link-local, which no sandbox may reach (cloud metadata and "
                    "credential endpoints live there; the Docker runtime refuses it too)"
                )
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: dict[str, str]) -> dict[str, str]:
        for name, address in value.items():
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ValueError(f"runtime.kubernetes.hosts: {name} = {address!r} is not an IP address") from None
        return value

    @field_validator("proxy_cidr")
    @classmethod
    def _proxy_cidr(cls, value: str | None) -> str | None:
        if value is not None:
            _check_cidr(value, "runtime.kubernetes.proxy_cidr")
        return value

    @field_validator("network_policy_probe")
    @classmethod
    def _probes(cls, value: list[str]) -> list[str]:
        for item in value:
            host_port(item)
        return value

    @field_validator("ephemeral_storage", "ephemeral_storage_request", "memory_request")
    @classmethod
    def _quantity(cls, value: str | None, info: Any) -> str | None:
        if value is not None and quantity_bytes(value) is None:
            raise ValueError(f"runtime.kubernetes.{info.field_name}: {value!r} is not a Kubernetes quantity (e.g. 1Gi, 500Mi, 2G)")
        return value

    @model_validator(mode="after")
    def _request_within_limit(self) -> KubernetesConfig:
        if self.ephemeral_storage and self.ephemeral_storage_request:
            if (quantity_bytes(self.ephemeral_storage_request) or 0) > (quantity_bytes(self.ephemeral_storage) or 0):
                raise ValueError(
                    f"runtime.kubernetes.ephemeral_storage_request ({self.ephemeral_storage_request}) is over the limit "
                    f"ephemeral_storage ({self.ephemeral_storage}): the API server would reject every pod"
                )
        return self

    @model_validator(mode="after")
    def _say_what_restricted_drops(self) -> KubernetesConfig:
        dropped = [c for c in self.add_capabilities if c != "NET_BIND_SERVICE"] if self.pod_security == "restricted" else []
        if dropped:
            log.warning(
                "runtime.kubernetes.add_capabilities: %s not added: pod_security = \"restricted\" allows NET_BIND_SERVICE only "
                "(use pod_security = \"baseline\" for the others)", ", ".join(dropped),
            )
        return self


def _check_cidr(text: str, key: str) -> None:
    try:
        ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"{key}: {text!r} is not a CIDR (e.g. 10.20.0.0/16 or 10.20.0.5/32): a NetworkPolicy matches addresses only, "
            "not host names"
        ) from None


def host_port(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as (host, port); ValueError naming the key when it is neither."""
    raw = text.strip()
    host, _, port = raw[1:].partition("]:") if raw.startswith("[") else raw.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"runtime.kubernetes.network_policy_probe: {text!r} is not host:port (e.g. 10.96.0.1:443)")
    return host, int(port)


# A Kubernetes quantity's suffixes. Our own few lines, not kubernetes.utils.parse_quantity: this module loads
# with every run config, and the client package takes most of a second to import.
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_FACTORS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_FACTORS.update({f"{p}i": 1024 ** (i + 1) for i, p in enumerate("KMGTPE")})


def quantity_bytes(text: str) -> float | None:
    """The byte count of a quantity like ``10Gi`` or ``500M`` (None when it is not one)."""
    match = _QUANTITY.match(text.strip())
    return float(match.group(1)) * _FACTORS[match.group(2)] if match else None


def migrate_legacy(values: Any) -> Any:
    """Move the old ``runtime.namespace``/``kubeconfig``/``image_pull_policy`` into ``runtime.kubernetes``."""
    if not isinstance(values, dict) or not any(k in values for k in LEGACY_KEYS):
        return values
    values = dict(values)
    nested = values.get("kubernetes")
    nested = dict(nested) if isinstance(nested, dict) else nested.model_dump(exclude_unset=True) if nested else {}
    for key in LEGACY_KEYS:
        if key not in values:
            continue
        old = values.pop(key)
        if key in nested and nested[key] != old:
            raise ConfigError(
                f"runtime.{key} = {old!r} conflicts with runtime.kubernetes.{key} = {nested[key]!r}: "
                f"keep only runtime.kubernetes.{key}"
            )
        log.warning("runtime.%s is deprecated: write runtime.kubernetes.%s", key, key)
        nested[key] = old
    values["kubernetes"] = nested
    return values


__all__ = ["LINK_LOCAL", "KubernetesConfig", "Toleration", "host_port", "migrate_legacy", "quantity_bytes"]
