"""The built-in `react` harness: our small stdlib-only ReAct agent (agent.py), run with the sandbox's python3."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

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
)

IMAGE_AGENT_PATH = "/opt/forgetui/react_agent.py"  # baked into the image by image_layer()
RUN_DIR = "/tmp/forgetui-react"  # written by LaunchSpec.files on every launch (works without an image)
AGENT_PATH = f"{RUN_DIR}/react_agent.py"
INSTRUCTION_PATH = f"{RUN_DIR}/instruction.txt"
GuiMode = Literal["auto", "off", "text", "image", "both"]
EXIT_MEANING = {
    0: "final answer",
    2: "bad arguments or unreadable instruction/workdir",
    3: "step limit reached without a final answer",
    4: "the model endpoint failed",
}
# Under the local runtime commands see the host filesystem and sandbox paths live below
# $FORGETUI_SANDBOX_ROOT; the agent re-roots its own paths the same way.
LAUNCHER = (
    'a="${FORGETUI_SANDBOX_ROOT:-}' + AGENT_PATH + '"; '
    '[ -f "$a" ] || a="${FORGETUI_SANDBOX_ROOT:-}' + IMAGE_AGENT_PATH + '"; '
    'exec python3 "$a" "$@"'
)


@cache
def agent_source() -> str:
    """The agent script's source (agent.py next to this module)."""
    return (Path(__file__).with_name("agent.py")).read_text(encoding="utf-8")


class ReactHarness(Harness):
    """Options: ``max_steps`` (20), ``temperature``, ``max_tokens``, ``stream`` (False), ``command_timeout`` (60 s),
    ``gui``: ``auto`` (GUI mode with the text observation for tasks whose meta says ``gui``), ``off``, or the
    observation a GUI-mode turn shows: ``text`` (for text-only models), ``image`` (the screenshot), ``both``."""

    name = "react"
    version = "1"
    protocols = ("chat",)

    class Options(AdapterOptions):
        max_steps: int = Field(20, description="model turns before the agent gives up (exit 3)")
        temperature: float | None = Field(None, description="sampling temperature sent with each call (unset: the server's)")
        max_tokens: int | None = Field(None, description="completion cap sent with each call (unset: the server's)")
        stream: bool = Field(False, description="ask for streamed completions")
        command_timeout: float = Field(60.0, description="seconds one shell command may run")
        gui: GuiMode = Field("auto", description="auto: GUI mode with the text observation on tasks whose meta says gui; off; or the observation a GUI turn shows: text, image, both")

    opts: Options

    def image_layer(self) -> ImageLayer:
        return ImageLayer(
            name="react",
            dockerfile=f"COPY react_agent.py {IMAGE_AGENT_PATH}\n",
            files={"react_agent.py": agent_source()},
        )

    def agent_args(self, endpoint: Endpoint, workdir: str) -> list[str]:
        """The agent's command-line arguments (after the script path)."""
        args = [
            "--base-url", endpoint.openai_base,
            "--api-key", endpoint.token,
            "--model", endpoint.model,
            "--max-steps", str(self.opts.max_steps),
            "--workdir", workdir,
            "--instruction-file", INSTRUCTION_PATH,
            "--command-timeout", f"{self.opts.command_timeout:g}",
        ]  # fmt: skip
        if self.opts.temperature is not None:
            args += ["--temperature", str(self.opts.temperature)]
        if self.opts.max_tokens is not None:
            args += ["--max-tokens", str(self.opts.max_tokens)]
        if self.opts.stream:
            args.append("--stream")
        return args

    def gui_mode(self, task: Task) -> str | None:
        """The observation GUI mode shows for `task` (None: the shell agent)."""
        gui = self.opts.gui
        if gui == "auto":
            return "text" if task.meta.get("gui") else None
        return None if gui == "off" else gui

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        mode = self.gui_mode(task)
        gui = ["--gui", mode] if mode else []
        return LaunchSpec(
            command=["sh", "-c", LAUNCHER, "react_agent", *self.agent_args(endpoint, workdir), *gui],
            env={"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"},
            files={AGENT_PATH: agent_source(), INSTRUCTION_PATH: task.instruction},
            workdir=workdir,
        )

    def outcome(self, result: ExecResult) -> HarnessOutcome:
        code = result.exit_code
        meaning = "timed out" if result.timed_out else EXIT_MEANING.get(code, f"exit {code}")
        tail = (result.stderr or result.stdout)[-2000:]
        return HarnessOutcome(ok=code == 0 and not result.timed_out, detail=f"{meaning}\n{tail}".strip())


__all__ = ["ReactHarness", "agent_source"]
