"""The `zeroclaw` harness: ZeroClaw (Rust) from a binary the user provides (`harness.binary`), over chat completions.

ZeroClaw is on no registry forgetui can reach, so `image_layer()` copies the user's binary into the image.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from core.adapter import (
    AdapterOptions,
    ConfigError,
    Endpoint,
    ExecResult,
    Harness,
    HarnessOutcome,
    ImageLayer,
    LaunchSpec,
    Task,
)

CONFIG_DIR = "/tmp/forgetui-zeroclaw"  # ZEROCLAW_CONFIG_DIR
CONFIG_PATH = f"{CONFIG_DIR}/config.toml"
IMAGE_BINARY = "/usr/local/bin/zeroclaw"
PROVIDER = "forge"  # [providers.models.custom.forge]
AGENT = "main"


def _toml_value(value: Any) -> str:
    """A TOML scalar: JSON's string escapes are valid TOML basic-string escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def config_toml(endpoint: Endpoint, *, wire_api: str = "chat_completions", timeout_secs: int | None = None) -> str:
    """ZeroClaw's config.toml (schema 3): one custom provider at the proxy, agent `main` on it, risk level full."""
    provider: dict[str, Any] = {
        "uri": endpoint.openai_base,
        "api_key": endpoint.token,
        "model": endpoint.model,
        "wire_api": wire_api,
        "native_tools": True,
    }
    if timeout_secs:
        provider["timeout_secs"] = int(timeout_secs)
    sections: list[tuple[str, dict[str, Any]]] = [
        ("memory", {"backend": "none"}),
        (f"providers.models.custom.{PROVIDER}", provider),
        (f"agents.{AGENT}", {"model_provider": f"custom.{PROVIDER}", "risk_profile": "yolo"}),
        ("risk_profiles.yolo", {"level": "full"}),
    ]
    lines = ["schema_version = 3", ""]
    for name, table in sections:
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
        lines.append("")
    return "\n".join(lines)


class ZeroClawHarness(Harness):
    """Options: ``binary`` (path to a linux-x86_64 `zeroclaw` on this machine; required to build the image), ``wire_api``
    (chat_completions or responses), ``timeout_secs`` (per model call)."""

    name = "zeroclaw"
    version = "user-binary"  # replaced by the binary's content hash when one is given
    protocols = ("chat", "responses")

    class Options(AdapterOptions):
        binary: str | None = Field(None, description="a linux-x86_64 `zeroclaw` on this machine (harness.binary); required to build the image")
        wire_api: Literal["chat_completions", "responses"] = Field("chat_completions", description="the protocol ZeroClaw speaks to the proxy")
        timeout_secs: int | None = Field(None, description="per model call (unset or 0: ZeroClaw's default)")

    opts: Options

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.binary = Path(self.opts.binary).expanduser() if self.opts.binary else None
        self.protocols = ("chat",) if self.opts.wire_api == "chat_completions" else ("responses",)
        if self.binary is not None and self.binary.is_file():
            self.version = f"binary-{self.binary_sha256[:12]}"

    @cached_property
    def binary_sha256(self) -> str:
        h = hashlib.sha256()
        with open(self.binary, "rb") as f:  # type: ignore[arg-type]
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    def _binary_bytes(self) -> bytes:
        if self.binary is None:
            raise ConfigError(
                "the zeroclaw harness needs a ZeroClaw binary (it is on no registry forgetui can install from): "
                "build or download a linux-x86_64 `zeroclaw` and set harness.binary=\"/path/to/zeroclaw\""
            )
        if not self.binary.is_file():
            raise ConfigError(f"zeroclaw binary {self.binary} does not exist or is not a file; check harness.binary")
        return self.binary.read_bytes()

    def image_layer(self) -> ImageLayer:
        return ImageLayer(
            name="zeroclaw",
            dockerfile=f"COPY zeroclaw {IMAGE_BINARY}\nRUN chmod 755 {IMAGE_BINARY}\n",
            files={"zeroclaw": self._binary_bytes()},
        )

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        env = {
            "ZEROCLAW_CONFIG_DIR": CONFIG_DIR,
            "ZEROCLAW_API_KEY": endpoint.token,
            "NO_COLOR": "1",
            "TERM": "dumb",
        }
        files = {CONFIG_PATH: config_toml(endpoint, wire_api=self.opts.wire_api, timeout_secs=self.opts.timeout_secs or None)}
        return LaunchSpec(command=["zeroclaw", "agent", "-a", AGENT, "-m", task.instruction], env=env, files=files, workdir=workdir)

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        head = "timed out" if result.timed_out else f"exit {result.exit_code}"
        failed = "LLM request failed" in (result.stderr + result.stdout)
        ok = result.exit_code == 0 and not result.timed_out and not failed
        return HarnessOutcome(ok=ok, detail=f"{head}\n{(result.stderr or result.stdout)[-2000:]}".strip())


__all__ = ["ZeroClawHarness", "config_toml"]
