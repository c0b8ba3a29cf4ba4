"""Sandbox runtimes: Docker containers, Kubernetes pods, or local processes (development only)."""

from __future__ import annotations

from core.errors import ConfigError
from core.runtime.base import ExecResult, Runtime, Sandbox, SandboxSpec


def make_runtime(kind: str, **options: object) -> Runtime:
    """A runtime by name: ``docker`` (default), ``kubernetes``/``k8s`` or ``local``."""
    if kind == "docker":
        from core.runtime.docker_runtime import DockerRuntime

        return DockerRuntime(**options)  # type: ignore[arg-type]
    if kind in ("kubernetes", "k8s"):
        from core.runtime.k8s.runtime import KubernetesRuntime

        return KubernetesRuntime(**options)  # type: ignore[arg-type]
    if kind == "local":
        from core.runtime.local_runtime import LocalRuntime

        return LocalRuntime(**options)  # type: ignore[arg-type]
    raise ConfigError(f"unknown runtime {kind!r}: use docker, kubernetes or local")


__all__ = ["ExecResult", "Runtime", "Sandbox", "SandboxSpec", "make_runtime"]
