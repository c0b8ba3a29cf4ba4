"""The sandbox contract: a spec, a `Sandbox` (one rollout's container/pod) and a `Runtime` that makes them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from core.runtime import labels as L


@dataclass(frozen=True)
class ExecResult:
    """What one command in a sandbox did; ``exit_code`` is -1 (or 137) when it was killed on timeout."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class SandboxSpec:
    """Everything a runtime needs to create one rollout's sandbox."""

    image: str
    run_id: str
    rollout_id: str
    owner: str = field(default_factory=L.default_owner)
    workdir: str = "/workspace"
    env: dict[str, str] = field(default_factory=dict)
    cpus: float = 1.0
    memory: str = "2g"
    pids_limit: int = 512
    network: Literal["isolated", "host", "bridge"] = "isolated"
    proxy: str | None = None  # the proxy's URL on the host: an isolated sandbox reaches it, and only it
    labels: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 3600.0
    # the shared harness, read-only: Docker, a named volume → mount path; Kubernetes, the harness's image → mount path
    # (an init container copies it into an emptyDir, or an image volume mounts it: core.runtime.k8s.harness)
    volumes: dict[str, str] = field(default_factory=dict)
    egress_allow: list[str] = field(default_factory=list)  # docker, isolated: names reachable through the egress proxy
    egress_allow_private: list[str] = field(default_factory=list)  # of those, names that may resolve to private addresses

    def all_labels(self) -> dict[str, str]:
        """The spec's extra labels plus the forgetui run/rollout/owner keys."""
        return L.sandbox_labels(self.run_id, self.rollout_id, self.owner, self.labels)


def as_bytes(data: bytes | str) -> bytes:
    """File content as bytes (text is UTF-8)."""
    return data.encode() if isinstance(data, str) else data


@dataclass(frozen=True)
class SandboxFile:
    """A file to place in a sandbox (``path`` relative to its workdir, or absolute)."""

    path: str
    data: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class Entry:
    """The command a sandbox runs as soon as it starts: a rollout's harness.

    Docker runs it as the container's own first process, which saves an engine exec per rollout;
    other runtimes run it with `exec` right after start. Either way `wait_entry` returns its result.
    """

    command: list[str]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None


@runtime_checkable
class Sandbox(Protocol):
    """One rollout's isolated environment; every method is safe to call from asyncio.

    The one definition of these signatures (`exec`'s above all): each runtime's sandbox class takes them exactly,
    which tests/test_runtime_conformance.py checks for Docker, Kubernetes and local.
    """

    @property
    def id(self) -> str: ...

    async def start(self, files: Sequence[SandboxFile] = (), entry: Entry | None = None) -> None:
        """Create and start the sandbox with ``files`` in place, then begin running ``entry`` (if any)."""
        ...

    async def wait_entry(self) -> ExecResult:
        """The result of the ``entry`` given to `start` (its timeout included); raises SandboxError when the sandbox is lost."""
        ...

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout_s: float,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a list, or a string run by ``bash -lc``) and wait at most ``timeout_s``."""
        ...

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def put_dir(self, local_dir: Path | str, remote_dir: str) -> None: ...

    async def get_file(self, path: str) -> bytes: ...

    async def logs(self) -> str: ...

    async def stop(self) -> None:
        """Remove the container/pod; idempotent."""
        ...


@runtime_checkable
class Runtime(Protocol):
    """Makes sandboxes and cleans up the ones left behind."""

    name: str
    isolated: bool  # sandboxes are cut off from the host (containers, pods); the local runtime's are not
    # where sandbox images come from: built on and run by this Docker engine ("engine"); built on this machine's
    # engine and pulled by the cluster ("cluster"); none at all, commands run on the host ("none")
    images: Literal["engine", "cluster", "none"]

    def create(self, spec: SandboxSpec) -> Sandbox: ...

    async def reap(self, run_id: str | None = None, owner: str | None = None, *, stopped: bool = False) -> int:
        """Remove labelled leftovers (of one run/owner, or all of ours); returns how many.

        With ``stopped``, only sandboxes that are no longer running (a container that exited, a pod
        that succeeded or failed): no run can still be using one, whatever its pid file says.
        """
        ...

    def available(self) -> bool: ...


def shell_command(cmd: list[str] | str) -> list[str]:
    """A string becomes ``bash -lc STRING``; a list is used as is."""
    if isinstance(cmd, str):
        return ["bash", "-lc", cmd]
    if not cmd:
        raise ValueError("empty command")
    return list(cmd)


def parse_memory(memory: str) -> int:
    """Bytes in a docker-style size ("512m", "2g", "1024k", "100")."""
    text = memory.strip().lower().removesuffix("b").removesuffix("i")
    units = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def k8s_memory(memory: str) -> str:
    """A Kubernetes quantity for a docker-style size ("2g" → "2Gi")."""
    text = memory.strip()
    suffixes = {"k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}
    low = text.lower().removesuffix("b").removesuffix("i")
    if low and low[-1] in suffixes:
        return f"{low[:-1]}{suffixes[low[-1]]}"
    return str(int(low))


class EntryByExec:
    """An `Entry` run with `exec` right after start: for runtimes with no cheaper way to start one."""

    def __init__(self) -> None:
        self._task: asyncio.Future[ExecResult] | None = None

    async def begin(self, sandbox: Sandbox, files: Sequence[SandboxFile], entry: Entry | None) -> None:
        for f in files:
            await sandbox.put_file(f.path, f.data, f.mode)
        if entry is not None:
            self._task = asyncio.ensure_future(
                sandbox.exec(entry.command, timeout_s=entry.timeout_s, env=entry.env, workdir=entry.workdir)
            )

    async def wait(self) -> ExecResult:
        if self._task is None:
            raise RuntimeError("this sandbox was started without an entry command")
        return await self._task

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
