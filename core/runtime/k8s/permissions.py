"""What this identity may do in the namespace, asked once before the first pod (SelfSubjectAccessReview).

A run without ``pods/exec`` would otherwise create pods and find out on the first command; without
``networkpolicies`` it would fail on its policy; without ``events`` its start failures would lose their
reasons. The API server answers for the caller's own identity (every authenticated user may ask).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from core.errors import SandboxError
from core.runtime.k8s.api import describe, status_of
from core.runtime.k8s.config import KubernetesConfig

log = logging.getLogger(__name__)
RBAC_HINT = "grant them to the run's identity (examples/kubernetes-rbac.yaml)"


@dataclass(frozen=True)
class Need:
    """One permission a run uses: ``verb`` on ``resource`` (``pods/exec``: the subresource) in ``group``."""

    verb: str
    resource: str
    group: str = ""
    required: bool = True

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}" + (f".{self.group}" if self.group else "")


def needs(cfg: KubernetesConfig) -> list[Need]:
    """What a run does in the namespace: pods and their exec (a websocket GET: ``get``; newer servers ask ``create`` too), its
    NetworkPolicy, and (for diagnoses) Events."""
    out = [Need("create", "pods"), Need("get", "pods"), Need("delete", "pods"), Need("get", "pods/exec"), Need("create", "pods/exec")]
    if cfg.network_policy:
        out += [Need("create", "networkpolicies", "networking.k8s.io"), Need("delete", "networkpolicies", "networking.k8s.io")]
    out.append(Need("list", "events", required=False))
    return out


def _review(need: Need, namespace: str) -> dict[str, Any]:
    sub, _, rest = need.resource.partition("/")
    attrs: dict[str, Any] = {"namespace": namespace, "verb": need.verb, "resource": sub, "group": need.group}
    if rest:
        attrs["subresource"] = rest
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": attrs}}


def missing(api: Any, cfg: KubernetesConfig) -> list[Need] | None:
    """The needs the API server denies (None: it cannot be asked, an old or locked-down server)."""
    from kubernetes import client

    auth = client.AuthorizationV1Api(api.api_client)
    denied = []
    for need in needs(cfg):
        try:
            answer = api.call(f"asking whether this identity may {need}", auth.create_self_subject_access_review, _review(need, cfg.namespace))
        except SandboxError as exc:
            if status_of(exc.__cause__ or exc) in (403, 404, 405):
                log.info("cannot check permissions up front (%s): they show when used", describe(exc.__cause__ or exc))
                return None
            raise
        if answer is not None and not answer.status.allowed:
            denied.append(need)
    return denied


def check(api: Any, cfg: KubernetesConfig) -> None:
    """Raise SandboxError naming every required permission this identity lacks; warn about optional ones."""
    denied = missing(api, cfg)
    if not denied:
        return
    optional = [n for n in denied if not n.required]
    required = [n for n in denied if n.required]
    if optional:
        log.warning(
            "this identity may not %s in namespace %s: start failures will not show the pods' Events; %s",
            ", ".join(map(str, optional)), cfg.namespace, RBAC_HINT,
        )
    if required:
        raise SandboxError(
            f"this identity may not {', '.join(map(str, required))} in namespace {cfg.namespace} (asked the API server "
            f"before creating anything): {RBAC_HINT}"
            + ("" if not cfg.network_policy or all(n.resource != "networkpolicies" for n in required) else
               ", or set runtime.kubernetes.network_policy = false")
        )


__all__ = ["Need", "check", "missing", "needs"]
