"""The harness contract: how a harness is installed in an image and pointed at a rollout's proxy."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from core.env import Task
from core.runtime.base import ExecResult
from core.runtime.images import ImageLayer


@dataclass(frozen=True)
class Endpoint:
    """Where a harness finds its model: the rollout's own proxy URL (identity in the URL) and token."""

    base_url: str  # http://HOST:PORT/r/TOKEN — no /v1
    token: str
    model: str = "policy"

    @property
    def openai_base(self) -> str:
        return self.base_url + "/v1"


@dataclass
class LaunchSpec:
    """What to run in the sandbox: the command, its environment and the config files it needs."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes | str] = field(default_factory=dict)  # absolute path in the sandbox → content
    workdir: str | None = None


@dataclass
class HarnessOutcome:
    """How the harness run ended, as the harness itself reports it."""

    ok: bool
    detail: str = ""


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a harness's JSON-lines output (`--json`, `--mode json`), other lines skipped."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


class Harness(ABC):
    """A harness adapter. Subclasses set the class attributes and implement `launch`."""

    name: ClassVar[str]
    version: ClassVar[str] = "0"
    protocols: ClassVar[tuple[str, ...]] = ("chat",)

    def __init__(self, **options: Any) -> None:
        self.options = options

    def image_layer(self) -> ImageLayer | None:
        """The install recipe as an image layer (None: nothing to install)."""
        return None

    @abstractmethod
    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        """The command that runs `task` in `workdir` against `endpoint`, with telemetry and prompts off."""

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        """Read the harness's exit (some exit 0 even when every model call failed)."""
        return HarnessOutcome(ok=result.exit_code == 0, detail=(result.stderr or result.stdout)[-2000:])
