"""The `pi` harness: Mario Zechner's pi coding agent (npm, runs on Node 24), chat completions, headless `-p`."""

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
    Task,
    json_lines,
    node_npm_layer,
)
from harnesses import versions

RUN_DIR = "/tmp/forgetui-pi"
AGENT_DIR = f"{RUN_DIR}/agent"  # PI_CODING_AGENT_DIR: models.json, settings, auth
PROVIDER = "forge"
CLI_PATH = "node_modules/@mariozechner/pi-coding-agent/dist/cli.js"
QUIET_ENV = {"PI_OFFLINE": "1", "PI_TELEMETRY": "0", "PI_SKIP_VERSION_CHECK": "1"}
# `--mode json` repeats the whole partial message in every streaming update: drop those lines so a
# long rollout's stdout stays small (the message_end/turn_end/agent_end events carry everything).
FILTER = 'set -o pipefail; pi "$@" | sed -u -e \'/^{"type":"message_update"/d\' -e \'/^{"type":"tool_execution_update"/d\''
FAILED_STOPS = ("error", "aborted")


def run_verdict(events: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether pi's run worked, read from its `--mode json` events: (ok, why)."""
    last: dict[str, Any] | None = None
    retry_failed: str | None = None
    for event in events:
        kind = event.get("type")
        message = event.get("message")
        if kind == "message_end" and isinstance(message, dict) and message.get("role") == "assistant":
            last = message
            retry_failed = None
        elif kind == "auto_retry_end" and not event.get("success", True):
            retry_failed = str(event.get("finalError") or "model call failed after retries")
    if retry_failed is not None:
        return False, f"model calls failed after retries: {retry_failed}"
    if last is None:
        return False, "pi produced no assistant message"
    stop = last.get("stopReason")
    if stop in FAILED_STOPS:
        return False, f"last model call ended with {stop}: {last.get('errorMessage') or 'no message'}"
    return True, f"stop reason {stop}"


class PiHarness(Harness):
    """Options: ``context_window`` (32768), ``max_tokens`` (4096), ``thinking`` (None: pi's default)."""

    name = "pi"
    version = versions.version_of(versions.PI)
    installable = True
    protocols = ("chat",)

    class Options(AdapterOptions):
        context_window: int = Field(32768, description="the model's contextWindow in models.json")
        max_tokens: int = Field(4096, description="the model's maxTokens in models.json")
        thinking: str | None = Field(None, description="pi's --thinking level (unset: pi's default)")

    opts: Options

    def image_layer(self) -> ImageLayer:
        return node_npm_layer("pi", versions.NODE, [versions.spec_at(versions.PI, self.version)], links={"pi": CLI_PATH})

    def models_json(self, endpoint: Endpoint) -> dict[str, Any]:
        """$PI_CODING_AGENT_DIR/models.json: one `forge` provider serving the policy."""
        model = {"id": endpoint.model, "contextWindow": self.opts.context_window, "maxTokens": self.opts.max_tokens}
        provider = {
            "baseUrl": endpoint.openai_base,
            "api": "openai-completions",
            "apiKey": endpoint.token,
            "models": [model],
        }
        return {"providers": {PROVIDER: provider}}

    def pi_args(self, task: Task, endpoint: Endpoint) -> list[str]:
        args = [
            "-p",
            "--no-session",
            "--mode",
            "json",
            "--offline",
            "--model",
            f"{PROVIDER}/{endpoint.model}",
        ]
        if self.opts.thinking is not None:
            args += ["--thinking", self.opts.thinking]
        return args + ["--no-extensions", "--no-themes", task.instruction]

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        return LaunchSpec(
            command=["bash", "-c", FILTER, "pi", *self.pi_args(task, endpoint)],
            env={"PI_CODING_AGENT_DIR": AGENT_DIR, **QUIET_ENV},
            files={f"{AGENT_DIR}/models.json": json.dumps(self.models_json(endpoint), indent=2) + "\n"},
            workdir=workdir,
        )

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        tail = (result.stderr or "")[-1500:]
        if result.timed_out:
            return HarnessOutcome(False, f"timed out\n{tail}".strip())
        ok, why = run_verdict(json_lines(result.stdout))
        if result.exit_code != 0:
            return HarnessOutcome(False, f"exit {result.exit_code}: {why}\n{tail}".strip())
        return HarnessOutcome(ok, why if ok else f"{why}\n{tail}".strip())


__all__ = ["PiHarness", "run_verdict"]
