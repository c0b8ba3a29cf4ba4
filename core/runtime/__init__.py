"""Sandbox runtimes: Docker containers, Kubernetes pods, or local processes (development only).

Runtimes are found by name in a registry a package can extend (entry point group ``forgetui.runtimes``);
each runtime class declares what it is (`Runtime.isolated`, `Runtime.images`) so callers ask it, not its name.
"""

from __future__ import annotations

from core.plugins import Registry
from core.runtime.base import ExecResult, Runtime, Sandbox, SandboxSpec

RUNTIMES = Registry(
    "forgetui.runtimes",
    "runtime",
    {
        "docker": "core.runtime.docker.runtime:DockerRuntime",
        "kubernetes": "core.runtime.k8s.runtime:KubernetesRuntime",
        "local": "core.runtime.local_runtime:LocalRuntime",
    },
)
ALIASES = {"k8s": "kubernetes"}


def make_runtime(kind: str, **options: object) -> Runtime:
    """A runtime by name: ``docker``, ``kubernetes`` (``k8s``), ``local``, or one a package registers."""
    return RUNTIMES.load(ALIASES.get(kind, kind))(**options)


__all__ = ["ALIASES", "RUNTIMES", "ExecResult", "Runtime", "Sandbox", "SandboxSpec", "make_runtime"]
