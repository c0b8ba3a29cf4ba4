"""The `opencode` harness: sst's opencode (npm `opencode-ai`, a Bun binary), chat completions, `opencode run`.

The task's MCP servers (`Task.mcp_servers`, e.g. the GUI envs' `gui-mcp`) are `mcp.<name>` entries
(`type: "local"`, the command as one list) in the same opencode.json; opencode shows their tools to the
model as `<server>_<tool>` (`gui_observe`) and `--auto` approves them. The model is declared text-only, so an
image a tool returns (observe's screenshot) is replaced by a note; the tool's text reaches the model.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from core.adapter import (
    AdapterOptions,
    Endpoint,
    ExecResult,
    Harness,
    HarnessOutcome,
    ImageLayer,
    LaunchSpec,
    McpServer,
    Task,
    json_lines,
    npm_layer,
)
from harnesses import versions

RUN_DIR = "/tmp/forgetui-opencode"
CONFIG_HOME = f"{RUN_DIR}/config"  # XDG_CONFIG_HOME; opencode reads $XDG_CONFIG_HOME/opencode/opencode.json
CONFIG_DIR = f"{CONFIG_HOME}/opencode"
PROVIDER = "forge"
BINARY_PATH = "node_modules/opencode-ai/bin/opencode.exe"  # the postinstall puts the native Bun binary here
DEFAULT_TITLE = "forgetui"
MCP_TIMEOUT_MS = 150_000  # one MCP request (tool calls too; opencode's default is 5 s), above gui-mcp's 120 s per command
QUIET_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EMBEDDED_WEB_UI": "1",
    "OPENCODE_DISABLE_TERMINAL_TITLE": "1",
}
# opencode runs `npm install @opencode-ai/plugin` in every config dir on every run unless the dir
# already has node_modules/ and a lockfile naming that package: these make it a no-op (no registry call).
PLUGIN_LOCK = {
    "name": "opencode-config",
    "lockfileVersion": 3,
    "packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}},
}


def error_message(event: dict[str, Any]) -> str:
    """A readable line for one `{"type": "error"}` event."""
    error = event.get("error") or {}
    data = error.get("data") if isinstance(error, dict) else None
    message = data.get("message") if isinstance(data, dict) else None
    name = error.get("name") if isinstance(error, dict) else None
    return ": ".join(str(p) for p in (name, message or error) if p)


class OpenCodeHarness(Harness):
    """Options: ``context_window`` (32768), ``max_tokens`` (4096), ``title_call`` (False: pass --title so no title call),
    ``mcp`` (true: start the task's MCP servers)."""

    name = "opencode"
    version = versions.version_of(versions.OPENCODE)
    installable = True
    protocols = ("chat",)

    class Options(AdapterOptions):
        context_window: int = Field(32768, description="the model's limit.context")
        max_tokens: int = Field(4096, description="the model's limit.output")
        title_call: bool = Field(False, description="let opencode make its title-generation call (false: --title is passed)")
        mcp: bool = Field(True, description="start the task's MCP servers")

    opts: Options

    def image_layer(self) -> ImageLayer:
        return npm_layer("opencode", [versions.spec_at(versions.OPENCODE, self.version)], links={"opencode": BINARY_PATH})

    def mcp_servers(self, task: Task) -> dict[str, McpServer]:
        """The task's MCP servers this run starts (none when the `mcp` option is off)."""
        return dict(task.mcp_servers) if self.opts.mcp else {}

    def config(self, endpoint: Endpoint, mcp_servers: dict[str, McpServer] | None = None) -> dict[str, Any]:
        """opencode.json: one `forge` provider (@ai-sdk/openai-compatible, bundled in the binary), the task's MCP servers."""
        model = {"name": endpoint.model, "limit": {"context": self.opts.context_window, "output": self.opts.max_tokens}}
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": PROVIDER,
            "options": {"baseURL": endpoint.openai_base, "apiKey": endpoint.token},
            "models": {endpoint.model: model},
        }
        out: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "provider": {PROVIDER: provider},
            "model": f"{PROVIDER}/{endpoint.model}",
        }
        if mcp_servers:
            out["mcp"] = mcp_config(mcp_servers)
        return out

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        command = [
            "opencode",
            "run",
            "--auto",
            "--format",
            "json",
            "-m",
            f"{PROVIDER}/{endpoint.model}",
            "--dir",
            workdir,
        ]
        if not self.opts.title_call:
            command += ["--title", DEFAULT_TITLE]  # a given title skips the extra title-generation call
        env = {
            "XDG_CONFIG_HOME": CONFIG_HOME,
            "XDG_DATA_HOME": f"{RUN_DIR}/data",
            "XDG_CACHE_HOME": f"{RUN_DIR}/cache",
            "XDG_STATE_HOME": f"{RUN_DIR}/state",
            **QUIET_ENV,
        }
        files: dict[str, bytes | str] = {
            f"{CONFIG_DIR}/opencode.json": json.dumps(self.config(endpoint, self.mcp_servers(task)), indent=2) + "\n",
            f"{CONFIG_DIR}/package-lock.json": json.dumps(PLUGIN_LOCK) + "\n",
            f"{CONFIG_DIR}/node_modules/.keep": "",
        }
        return LaunchSpec(command=[*command, task.instruction], env=env, files=files, workdir=workdir)

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        tail = (result.stderr or "")[-1500:]
        if result.timed_out:
            return HarnessOutcome(False, f"timed out\n{tail}".strip())
        errors = [error_message(e) for e in json_lines(result.stdout) if e.get("type") == "error"]
        if result.exit_code != 0 or errors:
            why = errors[-1] if errors else "no error event"
            return HarnessOutcome(False, f"exit {result.exit_code}: {why}\n{tail}".strip())
        return HarnessOutcome(True, "finished")


def mcp_config(servers: dict[str, McpServer]) -> dict[str, Any]:
    """opencode.json's `mcp` section: one local (stdio) server per entry, enabled."""
    return {name: {"type": "local", "command": [s.command, *s.args], "enabled": True, "timeout": MCP_TIMEOUT_MS} for name, s in servers.items()}


__all__ = ["OpenCodeHarness", "error_message", "mcp_config"]
