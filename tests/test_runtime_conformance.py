"""The sandbox contract is written once (core.runtime.base): every runtime's classes take exactly its signatures."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from core.runtime.base import Runtime, Sandbox
from core.runtime.docker.runtime import DockerRuntime
from core.runtime.docker.sandbox import DockerSandbox
from core.runtime.k8s.runtime import KubernetesRuntime
from core.runtime.k8s.sandbox import KubernetesSandbox, PodHost
from core.runtime.local_runtime import LocalRuntime, LocalSandbox


def members(protocol: type) -> dict[str, Any]:
    """A Protocol's own methods and properties (its annotated attributes are checked on an instance instead)."""
    return {n: v for n, v in vars(protocol).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}


def differences(cls: type, protocol: type) -> list[str]:
    found = []
    for name, wanted in members(protocol).items():
        have = inspect.getattr_static(cls, name, None)
        if have is None:
            found.append(f"{cls.__name__} has no {name}")
        elif isinstance(wanted, property):
            if not isinstance(have, property):
                found.append(f"{cls.__name__}.{name} is not a property")
        elif inspect.signature(have).parameters != inspect.signature(wanted).parameters:  # a return type may narrow
            found.append(f"{cls.__name__}.{name}{inspect.signature(have)} != {protocol.__name__}.{name}{inspect.signature(wanted)}")
        elif inspect.iscoroutinefunction(have) != inspect.iscoroutinefunction(wanted):
            found.append(f"{cls.__name__}.{name}: async in one and not the other")
    return found


@pytest.mark.parametrize("cls", [DockerSandbox, KubernetesSandbox, LocalSandbox])
def test_every_sandbox_takes_the_protocols_signatures(cls: type) -> None:
    assert "exec" in members(Sandbox) and "id" in members(Sandbox)
    assert differences(cls, Sandbox) == []
    assert inspect.signature(cls.exec) == inspect.signature(Sandbox.exec)  # ExecResult back, the same annotations


@pytest.mark.parametrize("cls", [DockerRuntime, KubernetesRuntime, LocalRuntime])
def test_every_runtime_takes_the_protocols_signatures(cls: type) -> None:
    assert differences(cls, Runtime) == []
    assert {"name", "isolated", "images"} <= set(vars(cls))


def test_the_kubernetes_runtime_is_what_its_pods_ask_of_it() -> None:
    """KubernetesSandbox names its runtime by the PodHost protocol (no import of runtime.py: no hidden cycle)."""
    assert differences(KubernetesRuntime, PodHost) == []
    runtime = KubernetesRuntime(api_client=object())
    assert set(PodHost.__annotations__) == {"cfg", "api", "registry", "poll_interval_s"}
    for attr in PodHost.__annotations__:
        assert hasattr(runtime, attr), attr


def test_a_wrong_signature_is_caught() -> None:
    """The check itself: a sandbox whose exec drops ``stdin`` differs."""

    class Wrong(LocalSandbox):
        async def exec(self, cmd: list[str] | str, *, timeout_s: float, env: dict[str, str] | None = None, workdir: str | None = None):  # type: ignore[override]  # noqa: ANN202
            raise NotImplementedError

    assert any("Wrong.exec" in d for d in differences(Wrong, Sandbox))
