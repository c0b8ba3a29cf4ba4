"""The harness contract: how a harness is installed in an image and pointed at a rollout's proxy."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from core.env import Task
from core.errors import ConfigError, NoSuchVersionError
from core.options import DeclaresOptions
from core.runtime.base import ExecResult
from core.runtime.images import ImageLayer

VERSION_KEY = "harness.version"
# an exact release (1.2.3, 2026.9.6, 0.2.0-beta.1, 2.0.0a1): a dist-tag or a range would install whatever is newest
_EXACT_VERSION = re.compile(r"[0-9][0-9A-Za-z.+!_-]*")


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


class Harness(DeclaresOptions, ABC):
    """A harness adapter. Subclasses set the class attributes, declare their `Options` and implement `launch`.

    Class attributes: `name` (what `harness.name` and the `forgetui.harnesses` entry point call it), `version`
    (the pinned release, recorded in `rollouts.harness_version`), `installable` (True: `harness.version` may
    install another published release), `protocols` (the wire protocols it speaks to the proxy: `chat`,
    `responses`, `messages`, `gemini`; empty for one that calls no model) and `Options` (an
    `core.options.AdapterOptions` model of `[harness.options]`, read as `self.opts`).

    Per rollout, the run calls `install_layer()` once (the image layer that installs the program), then
    `launch(task, endpoint, workdir)` (the command, environment and config files that start it against the
    rollout's own proxy URL) and, when it exits, `outcome(result)`. Worked example: docs/plugins/add-harness.md.
    """

    name: ClassVar[str]
    version: str = "0"  # what `rollouts.harness_version` records; the pinned one unless `harness.version` says another
    installable: ClassVar[bool] = False  # True: `image_layer` installs an npm/PyPI package at `self.version`
    protocols: ClassVar[tuple[str, ...]] = ("chat",)
    # its typed `Options` ([harness.options], and `binary` when it runs one the user provides) are read as `self.opts`
    config_section = "harness"

    def __init__(self, **options: Any) -> None:
        wanted = options.pop("version", None)
        self.options = options
        self.opts = self.typed_options(options)
        self.version_set = wanted is not None  # harness.version given (else the pinned version)
        if wanted is not None:
            self.version = self._checked_version(str(wanted))

    @classmethod
    def typed_options(cls, given: Mapping[str, Any]) -> Any:
        if cls.Options is not None and "binary" in given and "binary" not in cls.Options.model_fields:
            raise ConfigError(f"harness.binary: the {cls.name} harness runs no binary you provide (zeroclaw does); remove harness.binary")
        return super().typed_options(given)

    @classmethod
    def check_options(cls, given: Mapping[str, Any]) -> None:
        """Check `given` (`version` too) as building the adapter would, building nothing: ConfigError naming a bad one."""
        rest = dict(given)
        wanted = rest.pop("version", None)
        if wanted is not None:
            cls._checked_version(str(wanted))
        super().check_options(rest)

    @classmethod
    def _checked_version(cls, wanted: str) -> str:
        if not cls.installable:
            raise ConfigError(
                f"{VERSION_KEY} = {wanted!r}: the {cls.name} harness has no installable version (it is version {cls.version}, "
                f"not a package forgetui installs from npm or PyPI); remove {VERSION_KEY}"
            )
        if not _EXACT_VERSION.fullmatch(wanted):
            raise ConfigError(f"{VERSION_KEY} = {wanted!r} is not an exact release of {cls.name} (e.g. {cls.version}): a tag or a range would change under a cached image")
        return wanted

    def image_layer(self) -> ImageLayer | None:
        """The install recipe as an image layer (None: nothing to install)."""
        return None

    def install_layer(self) -> ImageLayer | None:
        """`image_layer()`, with a version the registry does not have reported in config terms."""
        try:
            return self.image_layer()
        except NoSuchVersionError as exc:
            source = f"set by {VERSION_KEY}" if self.version_set else f"the version this forgetui pins; override it with {VERSION_KEY}"
            raise NoSuchVersionError(f"cannot install the {self.name} harness at version {self.version} ({source}): {exc}") from None

    @abstractmethod
    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        """The command that runs `task` in `workdir` against `endpoint`, with telemetry and prompts off.

        `endpoint.base_url` (or `openai_base`) carries the rollout's identity in its path and `endpoint.token`
        is its key; `LaunchSpec.files` are written into the sandbox before the command starts.
        """

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        """Read the harness's exit (some exit 0 even when every model call failed)."""
        return HarnessOutcome(ok=result.exit_code == 0, detail=(result.stderr or result.stdout)[-2000:])
