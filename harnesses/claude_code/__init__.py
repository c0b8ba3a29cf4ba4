"""The `claude-code` harness: Anthropic's Claude Code (native binary from npm), headless `claude -p`.

Claude Code speaks Anthropic Messages to ANTHROPIC_BASE_URL (no /v1). A known model id
(`claude-sonnet-4-5`, mapped to the policy by the proxy) plus the switches below give a plain
Messages body: no thinking, no prompt caching, no experimental betas; telemetry, error reporting,
auto-update and every other non-essential call are off. The task's MCP servers (`Task.mcp_servers`,
e.g. the GUI envs' `gui-mcp`) are passed with `--mcp-config`; their tools reach the model as
`mcp__<server>__<tool>` and run unasked under the bypassPermissions mode every run uses.
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
    npm_layer,
)
from harnesses import versions

BINARY = "node_modules/@anthropic-ai/claude-code-linux-x64/claude"
RUN_DIR = "/tmp/forgetui-claude"
CONFIG_DIR = f"{RUN_DIR}/config"  # CLAUDE_CONFIG_DIR: settings and state of this run only (any uid can make it: not under /root)
SETTINGS_PATH = f"{CONFIG_DIR}/settings.json"
INSTRUCTION_PATH = f"{RUN_DIR}/instruction.txt"
MCP_CONFIG_PATH = f"{RUN_DIR}/mcp.json"
DEFAULT_MODEL = "claude-sonnet-4-5"  # a known id gives the plain request shape; the proxy serves the policy
DEFAULT_MAX_OUTPUT_TOKENS = 4096
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_UPGRADE_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    "CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL": "1",
}
PLAIN_BODY_ENV = {
    "CLAUDE_CODE_DISABLE_THINKING": "1",
    "MAX_THINKING_TOKENS": "0",
    "DISABLE_INTERLEAVED_THINKING": "1",
    "DISABLE_PROMPT_CACHING": "1",
    "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
}


class ClaudeCodeHarness(Harness):
    """Options: ``model`` (claude-sonnet-4-5: the id Claude Code is told), ``max_output_tokens`` (4096),
    ``max_turns`` (unset), ``tools`` (list of built-in tool names; unset = all), ``api_timeout_ms`` (600000),
    ``max_retries`` (1), ``mcp`` (true: start the task's MCP servers), ``extra_args`` (list of extra `claude` args)."""

    name = "claude-code"
    version = versions.version_of(versions.CLAUDE_CODE)
    installable = True
    protocols = ("messages",)

    class Options(AdapterOptions):
        model: str = Field(DEFAULT_MODEL, description="the model id Claude Code is told (a known id gives the plain request shape)")
        max_output_tokens: int = Field(DEFAULT_MAX_OUTPUT_TOKENS, description="CLAUDE_CODE_MAX_OUTPUT_TOKENS")
        max_turns: int | None = Field(None, description="--max-turns (unset: no limit)")
        tools: list[str] | str | None = Field(None, description="the built-in tools it may use, a list or one comma-separated string (unset: all)")
        api_timeout_ms: int = Field(600_000, description="API_TIMEOUT_MS: one model call")
        max_retries: int = Field(1, description="CLAUDE_CODE_MAX_RETRIES")
        mcp: bool = Field(True, description="start the task's MCP servers")
        extra_args: list[str] = Field(default_factory=list, description="more `claude` arguments")

    opts: Options

    def image_layer(self) -> ImageLayer:
        # the native binary needs no Node at run time
        return npm_layer("claude-code", [versions.spec_at(versions.CLAUDE_CODE, self.version)], links={"claude": BINARY})

    def settings(self) -> dict[str, Any]:
        """settings.json in CLAUDE_CONFIG_DIR: no update channel, no co-author lines, permissions bypassed."""
        return {
            "autoUpdates": False,
            "includeCoAuthoredBy": False,
            "permissions": {"defaultMode": "bypassPermissions"},
        }

    def environment(self, endpoint: Endpoint) -> dict[str, str]:
        """The process environment: proxy, key, model names, quiet and plain-body switches."""
        return {
            "ANTHROPIC_BASE_URL": endpoint.base_url,
            "ANTHROPIC_API_KEY": endpoint.token,
            "ANTHROPIC_MODEL": self.opts.model,
            "ANTHROPIC_SMALL_FAST_MODEL": self.opts.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": self.opts.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": self.opts.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": self.opts.model,
            "CLAUDE_CODE_SUBAGENT_MODEL": self.opts.model,
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(self.opts.max_output_tokens),
            "API_TIMEOUT_MS": str(self.opts.api_timeout_ms),
            "CLAUDE_CODE_MAX_RETRIES": str(self.opts.max_retries),
            "CLAUDE_CONFIG_DIR": CONFIG_DIR,
            "IS_SANDBOX": "1",  # --dangerously-skip-permissions refuses to run as root without it
            **QUIET_ENV,
            **PLAIN_BODY_ENV,
        }

    def mcp_servers(self, task: Task) -> dict[str, McpServer]:
        """The task's MCP servers this run starts (none when the `mcp` option is off)."""
        return dict(task.mcp_servers) if self.opts.mcp else {}

    def cli_args(self, mcp: bool = False) -> list[str]:
        """`claude` arguments; the prompt is read from stdin, which is the instruction file."""
        args = [
            "-p",
            "--output-format", "json",
            "--dangerously-skip-permissions",
            "--no-session-persistence",
            "--model", self.opts.model,
            "--settings", SETTINGS_PATH,
        ]  # fmt: skip
        if mcp:
            # only the task's servers (no user or project .mcp.json); the option after it ends the variadic list
            args += ["--mcp-config", MCP_CONFIG_PATH, "--strict-mcp-config"]
        if self.opts.max_turns is not None:
            args += ["--max-turns", str(self.opts.max_turns)]
        tools = self.opts.tools
        if tools is not None:
            args += ["--tools", tools if isinstance(tools, str) else ",".join(tools)]
        return args + self.opts.extra_args

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        # Claude Code works in its process cwd; stdin is the instruction file, never a terminal
        script = f'cd "$1" && shift && exec claude "$@" < {INSTRUCTION_PATH}'
        servers = self.mcp_servers(task)
        files: dict[str, bytes | str] = {SETTINGS_PATH: json.dumps(self.settings(), indent=2) + "\n", INSTRUCTION_PATH: task.instruction}
        if servers:
            files[MCP_CONFIG_PATH] = json.dumps(mcp_config(servers), indent=2) + "\n"
        return LaunchSpec(
            command=["sh", "-c", script, "claude", workdir, *self.cli_args(mcp=bool(servers))],
            env=self.environment(endpoint),
            files=files,
            workdir=workdir,
        )

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        return claude_outcome(result)


def mcp_config(servers: dict[str, McpServer]) -> dict[str, Any]:
    """The `--mcp-config` JSON: one stdio server per entry."""
    return {"mcpServers": {name: {"type": "stdio", "command": s.command, "args": list(s.args)} for name, s in servers.items()}}


def claude_result(stdout: str) -> dict[str, Any] | None:
    """The `{"type": "result", ...}` object `--output-format json` prints (last one wins)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "result":
            return obj
    try:
        obj = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and obj.get("type") == "result" else None


def claude_outcome(result: ExecResult) -> HarnessOutcome:
    """ok when Claude Code exited 0 with a result that is not an error."""
    tail = (result.stderr or result.stdout)[-2000:]
    if result.timed_out:
        return HarnessOutcome(False, f"timed out\n{tail}".strip())
    res = claude_result(result.stdout)
    if res is None:
        return HarnessOutcome(False, f"exit {result.exit_code}: no JSON result on stdout\n{tail}".strip())
    summary = f"{res.get('subtype', '?')} after {res.get('num_turns', '?')} turns"
    text = str(res.get("result") or res.get("errors") or "")[-1000:]
    ok = result.exit_code == 0 and not res.get("is_error") and res.get("subtype") == "success"
    detail = f"{summary}: {text}" if ok else f"exit {result.exit_code}, {summary}: {text}\n{result.stderr[-1000:]}".strip()
    return HarnessOutcome(ok, detail)


__all__ = ["ClaudeCodeHarness", "claude_outcome", "claude_result", "mcp_config"]
