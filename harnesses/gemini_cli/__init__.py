"""The `gemini-cli` harness: Google's Gemini CLI (npm `@google/gemini-cli`, runs on Node) against the proxy's Gemini API.

The task's MCP servers (`Task.mcp_servers`, e.g. the GUI envs' `gui-mcp`) are `mcpServers.<name>` in settings.json,
each `trust: true` (a policy rule that allows its tools, next to `--yolo`); Gemini CLI shows their tools to the
model as `mcp_<server>_<tool>` (`mcp_gui_observe`).
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
    node_npm_layer,
)
from harnesses import versions

HOME_DIR = "/tmp/forgetui-gemini"  # GEMINI_CLI_HOME: Gemini CLI reads $GEMINI_CLI_HOME/.gemini/settings.json
SETTINGS_PATH = f"{HOME_DIR}/.gemini/settings.json"
BIN_PATH = "node_modules/@google/gemini-cli/bundle/gemini.js"
MCP_TIMEOUT_MS = 150_000  # one MCP request (default 10 min), above gui-mcp's own 120 s per command
# Gemini CLI's fatal exit codes (FatalError subclasses in the bundle)
EXIT_MEANING = {
    0: "finished",
    1: "error",
    41: "authentication is not configured (settings.json security.auth.selectedType)",
    42: "bad input",
    44: "sandbox error",
    52: "config error",
    53: "session turn limit reached",
    54: "tool execution error",
    130: "cancelled",
}


def mcp_settings(servers: dict[str, McpServer]) -> dict[str, Any]:
    """settings.json's `mcpServers`: one trusted stdio server per entry."""
    return {name: {"command": s.command, "args": list(s.args), "timeout": MCP_TIMEOUT_MS, "trust": True} for name, s in servers.items()}


def settings(max_session_turns: int | None = None, mcp_servers: dict[str, McpServer] | None = None) -> dict[str, Any]:
    """settings.json: API-key auth, every update check, usage statistic and telemetry export off, the task's MCP servers."""
    out: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "general": {
            "enableAutoUpdate": False,
            "enableAutoUpdateNotification": False,
            "checkpointing": {"enabled": False},
        },
        "ide": {"enabled": False},
    }
    if max_session_turns is not None:
        out["model"] = {"maxSessionTurns": int(max_session_turns)}
    if mcp_servers:
        out["mcpServers"] = mcp_settings(mcp_servers)
    return out


class GeminiCliHarness(Harness):
    """Options: ``max_session_turns`` (unlimited), ``mcp`` (true: start the task's MCP servers),
    ``extra_args`` (list of more CLI flags)."""

    name = "gemini-cli"
    version = versions.version_of(versions.GEMINI_CLI)
    installable = True
    protocols = ("gemini",)

    class Options(AdapterOptions):
        max_session_turns: int | None = Field(None, description="settings.json model.maxSessionTurns (unset: unlimited)")
        mcp: bool = Field(True, description="start the task's MCP servers")
        extra_args: list[str] = Field(default_factory=list, description="more `gemini` flags")

    opts: Options

    def mcp_servers(self, task: Task) -> dict[str, McpServer]:
        """The task's MCP servers this run starts (none when the `mcp` option is off)."""
        return dict(task.mcp_servers) if self.opts.mcp else {}

    def image_layer(self) -> ImageLayer:
        return node_npm_layer("gemini-cli", versions.NODE, [versions.spec_at(versions.GEMINI_CLI, self.version)], links={"gemini": BIN_PATH})

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        command = ["gemini", "-p", task.instruction, "-m", endpoint.model, "--yolo", "--skip-trust", "-o", "json", *self.opts.extra_args]
        env = {
            "GEMINI_API_KEY": endpoint.token,
            "GOOGLE_GEMINI_BASE_URL": endpoint.base_url,  # no /v1: the CLI adds /v1beta/models/...
            "GEMINI_CLI_HOME": HOME_DIR,
            "GEMINI_TELEMETRY_ENABLED": "false",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "NO_BROWSER": "true",
            "CI": "1",
            "TERM": "dumb",
            "NO_COLOR": "1",
        }
        files = {SETTINGS_PATH: json.dumps(settings(self.opts.max_session_turns, self.mcp_servers(task)), indent=2) + "\n"}
        return LaunchSpec(command=command, env=env, files=files, workdir=workdir)

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        code = result.exit_code
        meaning = "timed out" if result.timed_out else EXIT_MEANING.get(code, f"exit {code}")
        report = parse_json_output(result.stdout)
        error = report.get("error") if isinstance(report, dict) else None
        ok = code == 0 and not result.timed_out and not error
        if error:
            detail = f"{meaning}: {error.get('type', 'error') if isinstance(error, dict) else ''} {error.get('message', error) if isinstance(error, dict) else error}"
        elif report.get("response") is not None:
            detail = f"{meaning}\n{str(report['response'])[-2000:]}"
        else:
            detail = f"{meaning}\n{(result.stderr or result.stdout)[-2000:]}"
        return HarnessOutcome(ok=ok, detail=detail.strip())


def parse_json_output(stdout: str) -> dict[str, Any]:
    """The `-o json` report ({response, stats, error?}): the last JSON object in stdout, or {}."""
    text = stdout.strip()
    start = text.find("{")
    while start >= 0:
        try:
            data = json.loads(text[start:])
        except json.JSONDecodeError:
            start = text.find("\n{", start + 1)
            start = start + 1 if start >= 0 else -1
            continue
        return data if isinstance(data, dict) else {}
    return {}


__all__ = ["GeminiCliHarness", "mcp_settings", "parse_json_output", "settings"]
