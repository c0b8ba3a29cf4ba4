"""Pod Security admission for the API server stand-in: the checks of the "baseline" and "restricted" levels.

What the API server's PodSecurity admission plugin does for a namespace labelled
``pod-security.kubernetes.io/enforce=<level>`` (https://kubernetes.io/docs/concepts/security/pod-security-standards/),
for the fields forgetui's pods use: a pod that breaks a rule is refused with 403 Forbidden and a message in
the plugin's words. Not emulated: host namespaces, hostPath, AppArmor, SELinux, sysctls, procMount (forgetui
never sets them), and version pinning (``restricted:latest`` only; its allowed volume types are those before
image volumes were added to the list).
"""

from __future__ import annotations

from typing import Any

BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID",
    "SETPCAP", "SETUID", "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _baseline(spec: dict[str, Any]) -> list[str]:
    out = []
    privileged = [c["name"] for c in _containers(spec) if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        out.append(f"privileged ({', '.join(f'container {n!r}' for n in privileged)} must not set securityContext.privileged=true)")
    extra = {
        c["name"]: sorted(set((c.get("securityContext") or {}).get("capabilities", {}).get("add", [])) - BASELINE_CAPS)
        for c in _containers(spec)
    }
    if any(extra.values()):
        parts = [f"container {n!r} must not include {', '.join(map(repr, caps))} in securityContext.capabilities.add" for n, caps in extra.items() if caps]
        out.append(f"non-default capabilities ({'; '.join(parts)})")
    seccomp = [(spec.get("securityContext") or {}).get("seccompProfile")] + [(c.get("securityContext") or {}).get("seccompProfile") for c in _containers(spec)]
    if any(p and p.get("type") == "Unconfined" for p in seccomp):
        out.append('seccompProfile (pod or containers must not set securityContext.seccompProfile.type to "Unconfined")')
    return out


def _restricted(spec: dict[str, Any]) -> list[str]:
    out = []
    pod_sc = spec.get("securityContext") or {}
    containers = _containers(spec)
    escalation = [c["name"] for c in containers if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if escalation:
        out.append(f"allowPrivilegeEscalation != false ({', '.join(f'container {n!r}' for n in escalation)} must set securityContext.allowPrivilegeEscalation=false)")
    caps = []
    for c in containers:
        capabilities = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in capabilities.get("drop", []):
            caps.append(f'container {c["name"]!r} must set securityContext.capabilities.drop=["ALL"]')
        added = [x for x in capabilities.get("add", []) if x != "NET_BIND_SERVICE"]
        if added:
            caps.append(f"container {c['name']!r} must not include {', '.join(map(repr, added))} in securityContext.capabilities.add")
    if caps:
        out.append(f"unrestricted capabilities ({'; '.join(caps)})")
    volumes = [v["name"] for v in spec.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    if volumes:
        out.append(f"restricted volume types (volumes {', '.join(map(repr, volumes))} use restricted volume types)")
    non_root = [c["name"] for c in containers if (c.get("securityContext") or {}).get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True]
    if non_root:
        out.append(f"runAsNonRoot != true (pod or {', '.join(f'container {n!r}' for n in non_root)} must set securityContext.runAsNonRoot=true)")
    root = [c["name"] for c in containers if (c.get("securityContext") or {}).get("runAsUser", pod_sc.get("runAsUser")) == 0]
    if root:
        out.append(f"runAsUser=0 ({', '.join(f'container {n!r}' for n in root)} must not set runAsUser=0)")
    no_seccomp = [
        c["name"] for c in containers
        if ((c.get("securityContext") or {}).get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost")
    ]
    if no_seccomp:
        out.append(f'seccompProfile (pod or {", ".join(f"container {n!r}" for n in no_seccomp)} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    return out


def violations(pod: dict[str, Any], level: str) -> str | None:
    """The admission plugin's refusal of ``pod`` under ``level`` ("privileged", "baseline", "restricted"), or None."""
    if level == "privileged":
        return None
    spec = pod.get("spec") or {}
    found = _baseline(spec) + (_restricted(spec) if level == "restricted" else [])
    if not found:
        return None
    return f'pods "{pod["metadata"]["name"]}" is forbidden: violates PodSecurity "{level}:latest": {", ".join(found)}'


__all__ = ["violations"]
