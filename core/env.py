"""The environment contract: tasks (instruction + workspace) and a verifier that scores in [0, 1]."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from core.options import DeclaresOptions
from core.runtime.base import as_bytes
from core.runtime.images import TaskImage  # noqa: F401 - part of the env contract (harbor tasks bring one)

if TYPE_CHECKING:
    from core.runtime.base import Sandbox
    from core.runtime.images import ImageLayer


@dataclass(frozen=True)
class McpServer:
    """An MCP server over stdio the sandbox carries for the agent: harnesses that take MCP tools start it."""

    command: str  # the program in the sandbox (absolute path or on PATH)
    args: tuple[str, ...] = ()


@dataclass
class Task:
    """One task: what the agent is told, and the workspace it starts from."""

    id: str
    instruction: str
    files: dict[str, bytes | str] = field(default_factory=dict)  # workspace-relative path → content
    setup: str | None = None  # shell run in the workspace before the harness starts
    timeout_s: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # domain, level, split, ...
    image: TaskImage | None = None  # the task's own image recipe; None = the run's base image
    workdir: str | None = None  # where the agent works, when the task fixes it (harbor: the image's WORKDIR)
    solution: str | None = None  # host path of the reference solution script (the oracle harness); not task content
    verifier: str | None = None  # content hash of the verifier's own files (harbor's tests/): part of task_hash
    threshold: float | None = None  # the score that passes this task; None = the environment's threshold
    # MCP servers (name → server) the task offers next to its CLI; adapters of harnesses with MCP configure them
    mcp_servers: dict[str, McpServer] = field(default_factory=dict)

    @property
    def content_hash(self) -> str:
        """What the agent and the verifier get, hashed: the same on every machine (no host paths)."""
        h = hashlib.sha256()
        h.update(orjson.dumps({"id": self.id, "instruction": self.instruction, "setup": self.setup, "meta": self.meta}, option=orjson.OPT_SORT_KEYS, default=str))
        if self.verifier is not None:
            h.update(b"verifier\0" + self.verifier.encode())
        if self.threshold is not None:
            h.update(b"threshold\0" + repr(float(self.threshold)).encode())
        if self.image is not None:
            h.update(self.image.digest().encode())
        if self.mcp_servers:  # the tools the agent gets; tasks without servers keep their old hash
            h.update(b"mcp\0" + orjson.dumps({n: [s.command, *s.args] for n, s in self.mcp_servers.items()}, option=orjson.OPT_SORT_KEYS))
        for path in sorted(self.files):
            data = self.files[path]
            h.update(path.encode() + b"\0" + as_bytes(data))
        return h.hexdigest()[:16]


@dataclass
class Score:
    """A verifier's verdict: the score in [0, 1], whether it passes, why, and per-check scores."""

    score: float
    passed: bool
    detail: str = ""
    checks: dict[str, float] = field(default_factory=dict)  # per-check scores in [0, 1] (rollouts.meta.checks)


def is_held_out(task: Task) -> bool:
    """A task of an env's held-out split (`meta.split` is `eval` or a variant such as `eval-phrasing`): never trained on."""
    split = (task.meta or {}).get("split")
    return isinstance(split, str) and (split == "eval" or split.startswith("eval-"))


class Environment(DeclaresOptions, ABC):
    """An environment adapter: a task source and its verifier.

    Class attributes: `name` (what `env.name` and the `forgetui.envs` entry point call it), `version`,
    `threshold` (the score that passes a task; a task's own `threshold` wins), `Options` (an
    `core.options.AdapterOptions` model of `[env.options]`, read as `self.opts`) and
    `graders_read_trajectory` (True: the recorded conversation is written into the sandbox before `verify`).

    Implement `tasks()` and `verify()`; `image_layer()` adds what the tasks need installed. A run calls
    `tasks()` once, starts each task's rollouts in fresh sandboxes and, after the harness exits, `verify()` in
    the same sandbox. Worked example: docs/plugins/add-environment.md.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "0"
    threshold: ClassVar[float] = 1.0
    # its typed `Options` ([env.options], and `path`/`strict` from [env] when it declares them) are read as `self.opts`;
    # an env without them may list the names it takes in `accepted_options` (`load_env` rejects others)
    config_section = "env"
    # its graders read the agent's transcript: the recorded conversation is written to the sandbox before verify
    graders_read_trajectory: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.opts = self.typed_options(options)

    @abstractmethod
    def tasks(self) -> list[Task]:
        """Every task of this environment (with its options applied: split, domain, level...)."""

    def image_layer(self) -> ImageLayer | None:
        """What the env's tasks need installed in the image (None: the base image is enough)."""
        return None

    @abstractmethod
    async def verify(self, sandbox: Sandbox, task: Task, workdir: str) -> Score:
        """Score the workspace after the harness exited; runs in the sandbox.

        Read what the agent left with `sandbox.get_file(path)` or `sandbox.exec(cmd, timeout_s=...)`, and return
        `self.score(value, detail, task)` so the value is clamped and passed against the right threshold.
        """

    def score(self, value: float, detail: str = "", task: Task | None = None) -> Score:
        """A score clamped into [0, 1]; passed when it reaches the task's threshold (else the env's)."""
        value = min(1.0, max(0.0, float(value)))
        threshold = task.threshold if task is not None and task.threshold is not None else self.threshold
        return Score(score=value, passed=value >= threshold, detail=detail)
