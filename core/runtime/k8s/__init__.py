"""Kubernetes sandboxes: config, manifests, API calls, the exec websocket, pods (``KubernetesRuntime``).

Only ``config`` is imported eagerly (the run config needs it); the rest loads the ``kubernetes`` client lazily.
"""

from __future__ import annotations

from typing import Any

from core.runtime.k8s.config import KubernetesConfig


def __getattr__(name: str) -> Any:
    if name == "KubernetesRuntime":
        from core.runtime.k8s.runtime import KubernetesRuntime

        return KubernetesRuntime
    if name == "KubernetesSandbox":
        from core.runtime.k8s.sandbox import KubernetesSandbox

        return KubernetesSandbox
    raise AttributeError(name)


__all__ = ["KubernetesConfig", "KubernetesRuntime", "KubernetesSandbox"]
