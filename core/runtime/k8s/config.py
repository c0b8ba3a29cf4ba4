"""`runtime.kubernetes`: every pod option a run config can set (see examples/kubernetes.toml)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.errors import ConfigError

log = logging.getLogger(__name__)

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

    namespace: str = "default"
    kubeconfig: str | None = Field(None, description="path to a kubeconfig (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    context: str | None = Field(None, description="kubeconfig context (default: the current one)")
    in_cluster: bool | None = Field(None, description="use the pod's service account (default: when running in a pod)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[str] = Field(default_factory=list)
    service_account: str | None = Field(None, description="the pod's service account (its token is never mounted)")
    pod_security: Literal["baseline", "restricted"] = Field(
        "baseline",
        description="baseline: root with Docker's default capabilities (as the docker runtime); restricted: "
        "non-root, every capability dropped (namespaces under Pod Security 'restricted')",
    )
    run_as_user: int | None = Field(None, ge=0, description="uid (restricted defaults to 1000)")
    run_as_group: int | None = Field(None, ge=0)
    run_as_non_root: bool = False
    add_capabilities: list[str] = Field(default_factory=list, description="capabilities added to the kept set")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    ephemeral_storage: str | None = Field("10Gi", description="scratch disk limit per pod (none: unlimited)")
    termination_grace_s: int = Field(5, ge=1, description="grace period of pod deletes (never 0: no force deletes)")
    schedule_timeout_s: float = Field(300.0, gt=0, description="wait this long for a node (Unschedulable is reported)")
    start_timeout_s: float = Field(600.0, gt=0, description="wait this long from scheduled to Running (image pull included)")
    pull_retry_s: float = Field(60.0, ge=0, description="tolerate image-pull errors this long (the first is often transient)")
    request_timeout_s: float = Field(30.0, gt=0, description="per API request and websocket connect/read stall")
    api_retries: int = Field(5, ge=0, description="retries of 429/5xx/connection errors, with exponential backoff")
    ping_interval_s: float = Field(30.0, gt=0, description="websocket ping during silent execs")
    network_policy: bool = Field(True, description="a NetworkPolicy per run: pods reach the proxy (and DNS) only")
    proxy_cidr: str | None = Field(None, description="the proxy's address block for the policy (default: proxy.public_url's host if an IP)")
    proxy_pod_labels: dict[str, str] = Field(default_factory=dict, description="or: labels of the proxy's pods (an in-cluster proxy)")
    proxy_namespace: str | None = Field(None, description="namespace of those pods (default: this namespace)")
    egress_allow: list[str] = Field(default_factory=list, description="more CIDRs pods may reach (a package mirror)")
    check_proxy: bool = Field(True, description="check from the first pod that proxy.public_url answers")
    harness_mount: Literal["init", "image"] = Field(
        "init",
        description="how the shared harness reaches a pod: init (an init container copies it into an emptyDir; any "
        "cluster) or image (an image volume: Kubernetes >= 1.31 with the ImageVolume feature gate)",
    )

    @model_validator(mode="after")
    def _say_what_restricted_drops(self) -> KubernetesConfig:
        dropped = [c for c in self.add_capabilities if c != "NET_BIND_SERVICE"] if self.pod_security == "restricted" else []
        if dropped:
            log.warning(
                "runtime.kubernetes.add_capabilities: %s not added: pod_security = \"restricted\" allows NET_BIND_SERVICE only "
                "(use pod_security = \"baseline\" for the others)", ", ".join(dropped),
            )
        return self


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


__all__ = ["KubernetesConfig", "Toleration", "migrate_legacy"]
