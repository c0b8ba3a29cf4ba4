"""The `openclaw` harness: OpenClaw's embedded agent (`openclaw agent exec`, Node 24), in any of three wire protocols.

Option ``api`` picks how OpenClaw talks to the proxy: ``openai-completions`` (default, chat),
``openai-responses`` (responses) or ``anthropic-messages`` (messages): three ways to train the same harness.
The task's MCP servers (`Task.mcp_servers`, e.g. the GUI envs' `gui-mcp`) are `mcp.servers.<name>` in the same
config; the embedded agent shows their tools to the model as `<server>__<tool>` (`gui__observe`). With MCP servers
`tools.toolSearch` is false (unless the ``tool_search`` option says otherwise): OpenClaw's default Tool Search would
hide their schemas behind `tool_search`/`tool_call`, so the model could not call them by name. The model's input is
text only, so OpenClaw omits an image a tool returns (observe's screenshot); the tool's text reaches the model.
"""

from __future__ import annotations

import json
from typing import Any, Literal

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

RUN_DIR = "/tmp/forgetui-openclaw"
CONFIG_PATH = f"{RUN_DIR}/openclaw.json"
PROMPT_PATH = f"{RUN_DIR}/prompt.md"
PROVIDER = "forge"
CLI_PATH = "node_modules/openclaw/openclaw.mjs"
Api = Literal["openai-completions", "openai-responses", "anthropic-messages"]
APIS: dict[Api, str] = {"openai-completions": "chat", "openai-responses": "responses", "anthropic-messages": "messages"}  # → proxy protocol
EXIT_MEANING = {0: "ok", 1: "error", 2: "agent deadline reached"}
DEFAULT_TIMEOUT_S = 600
MCP_REQUEST_TIMEOUT_MS = 150_000  # one MCP request, above gui-mcp's own 120 s per command
QUIET_ENV = {
    "OPENCLAW_NO_AUTO_UPDATE": "1",
    "OPENCLAW_SKIP_STARTUP_MODEL_PREWARM": "1",
    "OPENCLAW_SKIP_BROWSER_CONTROL_SERVER": "1",
    "OPENCLAW_SKIP_CANVAS_HOST": "1",
    "OPENCLAW_SKIP_GMAIL_WATCHER": "1",
    "NO_COLOR": "1",
}


def envelope(stdout: str) -> dict[str, Any] | None:
    """The `--json` result envelope (one pretty-printed JSON object) from OpenClaw's stdout."""
    text = stdout.strip()
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n" and text[i + 1 : i + 2] == "{"]
    decoder = json.JSONDecoder()
    for start in reversed(starts):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


class OpenClawHarness(Harness):
    """Options: ``api`` (openai-completions), ``context_window`` (32768), ``max_tokens`` (4096), ``timeout_s``,
    ``mcp`` (true: start the task's MCP servers), ``tool_search`` (OpenClaw's `tools.toolSearch`; unset = its default,
    or false when MCP servers are started)."""

    name = "openclaw"
    version = versions.version_of(versions.OPENCLAW)
    installable = True
    protocols = ("chat", "responses", "messages")

    class Options(AdapterOptions):
        api: Api = Field("openai-completions", description="how OpenClaw talks to the proxy: chat, responses or messages")
        context_window: int = Field(32768, description="the model's contextWindow")
        max_tokens: int = Field(4096, description="the model's maxTokens")
        timeout_s: float | None = Field(None, description="the agent's deadline in s when the task sets none (unset: 600)")
        mcp: bool = Field(True, description="start the task's MCP servers")
        tool_search: bool | dict[str, Any] | None = Field(None, description="OpenClaw's tools.toolSearch (unset: its default, or false when MCP servers are started)")

    opts: Options

    @property
    def protocol(self) -> str:
        """The proxy protocol this instance's calls arrive in (chat, responses or messages)."""
        return APIS[self.opts.api]

    def image_layer(self) -> ImageLayer:
        # OpenClaw's install scripts refuse the host's Node 20: it is installed with the Node 24 it runs on
        return node_npm_layer("openclaw", versions.NODE, [versions.spec_at(versions.OPENCLAW, self.version)], links={"openclaw": CLI_PATH})

    def mcp_servers(self, task: Task) -> dict[str, McpServer]:
        """The task's MCP servers this run starts (none when the `mcp` option is off)."""
        return dict(task.mcp_servers) if self.opts.mcp else {}

    def config(self, endpoint: Endpoint, mcp_servers: dict[str, McpServer] | None = None) -> dict[str, Any]:
        """The pinned OpenClaw config (JSON is valid JSON5): one `forge` provider, models replaced, the task's MCP servers."""
        model = {
            "id": endpoint.model,
            "name": endpoint.model,
            "reasoning": False,
            "input": ["text"],
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            "contextWindow": self.opts.context_window,
            "maxTokens": self.opts.max_tokens,
        }
        base = endpoint.base_url if self.opts.api == "anthropic-messages" else endpoint.openai_base
        provider = {"baseUrl": base, "apiKey": endpoint.token, "api": self.opts.api, "models": [model]}
        out: dict[str, Any] = {
            "models": {"mode": "replace", "providers": {PROVIDER: provider}},
            "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{endpoint.model}"}}},
        }
        if mcp_servers:
            out["mcp"] = {"servers": mcp_config(mcp_servers)}
        tool_search = self.opts.tool_search if self.opts.tool_search is not None else (False if mcp_servers else None)
        if tool_search is not None:
            out["tools"] = {"toolSearch": tool_search}
        return out

    def deadline(self, task: Task) -> int:
        """OpenClaw's own agent deadline in seconds (the task's, else the option, else 600)."""
        return max(1, int(task.timeout_s or self.opts.timeout_s or DEFAULT_TIMEOUT_S))

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        command = [
            "openclaw", "agent", "exec",
            "--config", CONFIG_PATH,
            "--model", f"{PROVIDER}/{endpoint.model}",
            "--cwd", workdir,
            "--json",
            "--thinking", "off",
            "--timeout", str(self.deadline(task)),
            "--message-file", PROMPT_PATH,
        ]  # fmt: skip
        files: dict[str, bytes | str] = {
            CONFIG_PATH: json.dumps(self.config(endpoint, self.mcp_servers(task)), indent=2) + "\n",
            PROMPT_PATH: task.instruction,
        }
        return LaunchSpec(command=command, env=dict(QUIET_ENV), files=files, workdir=workdir)

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        tail = (result.stderr or "")[-1500:]
        if result.timed_out:
            return HarnessOutcome(False, f"timed out\n{tail}".strip())
        env = envelope(result.stdout) or {}
        meaning = EXIT_MEANING.get(result.exit_code, f"exit {result.exit_code}")
        status = env.get("status", "no JSON envelope")
        ok = result.exit_code == 0 and env.get("ok") is True
        detail = f"{meaning}; status {status}"
        error = env.get("error")
        if isinstance(error, dict):  # {"message": ..., "kind": ...}
            error = error.get("message") or error.get("kind")
        if error:
            detail += f": {error}"
        return HarnessOutcome(ok, detail if ok else f"{detail}\n{tail}".strip())


def mcp_config(servers: dict[str, McpServer]) -> dict[str, Any]:
    """The config's `mcp.servers`: one stdio server per entry."""
    return {name: {"command": s.command, "args": list(s.args), "requestTimeoutMs": MCP_REQUEST_TIMEOUT_MS} for name, s in servers.items()}


__all__ = ["OpenClawHarness", "envelope", "mcp_config"]
