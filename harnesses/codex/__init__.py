"""The `codex` harness: OpenAI's Codex CLI (native musl binary from npm), headless `codex exec`.

Codex speaks only the OpenAI Responses API and ignores OPENAI_BASE_URL, so the proxy is a custom
model provider in $CODEX_HOME/config.toml. Plugins, analytics, update checks, web search and the
multi-agent/goal/app tools are off: the model sees a few plain function tools (`exec_command`, ...).
The task's MCP servers (`Task.mcp_servers`, e.g. the GUI envs' `gui-mcp`) are `[mcp_servers.<name>]`
tables in the same config.toml.
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

BINARY = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
RG = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/codex-path/rg"
RUN_DIR = "/tmp/forgetui-codex"
# not under /tmp (Codex refuses to create its helper aliases under the temp dir) nor /root (0700: a non-root
# sandbox user cannot enter it); /var/tmp is writable by every uid, and the folder belongs to whoever makes it
CODEX_HOME = "/var/tmp/forgetui-codex"
CONFIG_PATH = f"{CODEX_HOME}/config.toml"
INSTRUCTION_PATH = f"{RUN_DIR}/instruction.txt"
LAST_MESSAGE_PATH = f"{RUN_DIR}/last-message.txt"
API_KEY_ENV = "FORGE_API_KEY"
PROVIDER = "forge"
DEFAULT_CONTEXT_WINDOW = 32768
MCP_STARTUP_TIMEOUT_S = 30
MCP_TOOL_TIMEOUT_S = 150  # above gui-mcp's own 120 s limit on one `gui` command
# quiet (no plugin, analytics or update traffic) and a small plain tool set
QUIET_FLAGS = (
    "--disable", "plugins",
    "--disable", "remote_plugin",
    "--disable", "goals",
    "--disable", "apps",
    "-c", "analytics.enabled=false",
    "-c", 'web_search="disabled"',
    "-c", "agents.enabled=false",
)  # fmt: skip


def _toml_value(value: Any) -> str:
    """A TOML literal for a str/bool/int/float or a list of them (JSON string escapes are valid TOML basic strings)."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)


def to_toml(top: dict[str, Any], tables: dict[str, dict[str, Any]]) -> str:
    """A flat TOML document: top-level keys, then one `[table]` per entry (dotted names allowed)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in top.items()]
    for name, body in tables.items():
        lines += ["", f"[{name}]"] + [f"{key} = {_toml_value(value)}" for key, value in body.items()]
    return "\n".join(lines) + "\n"


class CodexHarness(Harness):
    """Options: ``context_window`` (32768), ``reasoning_effort`` (unset), ``stream_idle_timeout_ms`` (600000),
    ``request_max_retries`` (1), ``stream_max_retries`` (1), ``mcp`` (true: start the task's MCP servers),
    ``extra_args`` (list of extra `codex exec` args)."""

    name = "codex"
    version = versions.version_of(versions.CODEX)
    installable = True
    protocols = ("responses",)

    class Options(AdapterOptions):
        context_window: int = Field(DEFAULT_CONTEXT_WINDOW, description="model_context_window: the context Codex plans for")
        reasoning_effort: str | None = Field(None, description="model_reasoning_effort (unset: Codex's default)")
        stream_idle_timeout_ms: int = Field(600_000, description="how long Codex waits on a silent stream")
        request_max_retries: int = Field(1, description="Codex's retries of a failed request")
        stream_max_retries: int = Field(1, description="Codex's retries of a dropped stream")
        mcp: bool = Field(True, description="start the task's MCP servers")
        extra_args: list[str] = Field(default_factory=list, description="more `codex exec` arguments")

    opts: Options

    def image_layer(self) -> ImageLayer:
        # the native binary runs without Node; rg is what Codex's own tools search with
        return npm_layer("codex", [versions.spec_at(versions.CODEX, self.version)], links={"codex": BINARY, "rg": RG})

    def config_toml(self, endpoint: Endpoint, mcp_servers: dict[str, McpServer] | None = None) -> str:
        """$CODEX_HOME/config.toml: the proxy as the only provider, approvals and telemetry off, the task's MCP servers."""
        top: dict[str, Any] = {
            "model": endpoint.model,
            "model_provider": PROVIDER,
            "model_context_window": self.opts.context_window,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access",
            "check_for_update_on_startup": False,
            "web_search": "disabled",
        }
        if self.opts.reasoning_effort:
            top["model_reasoning_effort"] = self.opts.reasoning_effort
        tables = {
            f"model_providers.{PROVIDER}": {
                "name": "forgetui recording proxy",
                "base_url": endpoint.openai_base,
                "env_key": API_KEY_ENV,
                "wire_api": "responses",
                "request_max_retries": self.opts.request_max_retries,
                "stream_max_retries": self.opts.stream_max_retries,
                "stream_idle_timeout_ms": self.opts.stream_idle_timeout_ms,
            },
            "analytics": {"enabled": False},
            "feedback": {"enabled": False},
            "features": {"plugins": False, "remote_plugin": False, "goals": False, "apps": False},
            "agents": {"enabled": False},  # no subagent tools (replaces the deprecated features.multi_agent)
        }
        for name, server in (mcp_servers or {}).items():
            tables[f"mcp_servers.{name}"] = {
                "command": server.command,
                "args": list(server.args),
                "startup_timeout_sec": MCP_STARTUP_TIMEOUT_S,
                "tool_timeout_sec": MCP_TOOL_TIMEOUT_S,
            }
        return to_toml(top, tables)

    def exec_args(self, endpoint: Endpoint, workdir: str) -> list[str]:
        """`codex exec` arguments; the prompt is read from stdin (`-`), which is the instruction file."""
        return [
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            "--dangerously-bypass-approvals-and-sandbox",
            "--json",
            "--color", "never",
            "-C", workdir,
            "-o", LAST_MESSAGE_PATH,
            *QUIET_FLAGS,
            "-c", f"model_context_window={self.opts.context_window}",
            "-m", endpoint.model,
            *self.opts.extra_args,
            "-",
        ]  # fmt: skip

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        # stdin is the instruction file: never a terminal Codex could wait on
        script = f'exec codex "$@" < {INSTRUCTION_PATH}'
        return LaunchSpec(
            command=["sh", "-c", script, "codex", *self.exec_args(endpoint, workdir)],
            env={
                "CODEX_HOME": CODEX_HOME,
                API_KEY_ENV: endpoint.token,
                "NO_COLOR": "1",
                "RUST_LOG": "error",
            },
            files={CONFIG_PATH: self.config_toml(endpoint, task.mcp_servers if self.opts.mcp else None), INSTRUCTION_PATH: task.instruction},
            workdir=workdir,
        )

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        return codex_outcome(result)


def _error_text(event: dict[str, Any]) -> str:
    err = event.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err or event.get("message") or event)


def codex_outcome(result: ExecResult) -> HarnessOutcome:
    """ok when Codex exited 0 and its event stream completed a turn without an error event."""
    tail = (result.stderr or result.stdout)[-2000:]
    if result.timed_out:
        return HarnessOutcome(False, f"timed out\n{tail}".strip())
    events = json_lines(result.stdout)
    kinds = [str(e.get("type", "")) for e in events]
    errors = [_error_text(e) for e in events if e.get("type") in ("turn.failed", "error")]
    completed = "turn.completed" in kinds
    if result.exit_code == 0 and completed and not errors:
        answer = next((e["item"].get("text", "") for e in reversed(events) if e.get("type") == "item.completed" and isinstance(e.get("item"), dict) and e["item"].get("type") == "agent_message"), "")
        return HarnessOutcome(True, f"turn completed ({kinds.count('item.completed')} items): {answer[-500:]}")
    why = "; ".join(errors[-3:]) or ("no turn completed" if not completed else f"exit {result.exit_code}")
    return HarnessOutcome(False, f"exit {result.exit_code}: {why}\n{tail}".strip())


__all__ = ["CodexHarness", "codex_outcome", "to_toml"]
