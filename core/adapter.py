"""The plugin surface: everything a harness or environment adapter imports from core, and nothing else.

`harnesses/*` and `envs/*` (and a third party's adapters, found by entry point) import from this module
only (an import-linter contract in pyproject.toml checks the project's own), so the runtime's internals can
move without breaking a plugin. Public here:

- harness contract (`core.harness`): `Harness`, `Endpoint`, `LaunchSpec`, `HarnessOutcome`, `json_lines`
- environment contract (`core.env`): `Environment`, `Task`, `Score`, `McpServer`, `TaskImage`
- typed options (`core.options`): `AdapterOptions` (the base of an adapter's `Options`), `NoOptions`, `Names`
- the sandbox a harness or verifier acts in (`core.runtime.base`): `Sandbox` (a Protocol), `ExecResult`
- image layers (`core.runtime.images`): `ImageLayer`, `HostDir`
- install recipes (`core.runtime.recipes`): `INSTALL_ROOT`, `apt_layer`, `combined_layer`, `node_npm_layer`,
  `npm_layer`, `pip_layer`, `pip_tree`
- errors (`core.errors`): `ForgetuiError`, `ConfigError`, `SandboxError`
"""

from __future__ import annotations

from core.env import Environment, McpServer, Score, Task, TaskImage
from core.errors import ConfigError, ForgetuiError, SandboxError
from core.harness import Endpoint, Harness, HarnessOutcome, LaunchSpec, json_lines
from core.options import AdapterOptions, Names, NoOptions
from core.runtime.base import ExecResult, Sandbox
from core.runtime.images import HostDir, ImageLayer
from core.runtime.recipes import (
    INSTALL_ROOT,
    apt_layer,
    combined_layer,
    node_npm_layer,
    npm_layer,
    pip_layer,
    pip_tree,
)

__all__ = [
    "INSTALL_ROOT",
    "AdapterOptions",
    "ConfigError",
    "Endpoint",
    "Environment",
    "ExecResult",
    "ForgetuiError",
    "Harness",
    "HarnessOutcome",
    "HostDir",
    "ImageLayer",
    "LaunchSpec",
    "McpServer",
    "Names",
    "NoOptions",
    "Sandbox",
    "SandboxError",
    "Score",
    "Task",
    "TaskImage",
    "apt_layer",
    "combined_layer",
    "json_lines",
    "node_npm_layer",
    "npm_layer",
    "pip_layer",
    "pip_tree",
]
