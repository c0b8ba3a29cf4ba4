"""The `desktop` environment: real Debian programs on an X desktop (Xvfb + openbox) inside the sandbox.

The task's setup prepares its files and runs `gui start`, which starts Xvfb, the openbox window
manager and the task's program (xterm, Mousepad or Gnumeric) detached. The agent looks and acts
through the same `gui` CLI as in miniwob, backed here by xdotool and scrot (windows instead of page
elements: `gui click ID` focuses a window). The verifier checks the state the program left: files
written from the terminal or saved from the editor, spreadsheet cells read back with ssconvert. An X
server that is gone at verification is an infrastructure error.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pydantic import Field

from core.adapter import Environment, ImageLayer, Sandbox, SandboxError, Score, Task
from envs.desktop.image import desktop_layer
from envs.desktop.tasks import HOME, KINDS, setup_script
from envs.miniwob import MCP_SERVERS
from envs.miniwob.names import GuiOptions, select

ORACLE = Path(__file__).with_name("oracle") / "solve.sh"
START_WAIT_S = 90.0
DEFAULT_TIMEOUT_S = 300.0
GUIDE = """Look at the desktop and act on it with the `gui` command in the shell:
  gui observe              the open windows as [id] window "title" @ x,y WxH, and a screenshot's path
  gui find TITLE           the id of the window whose title contains TITLE
  gui click ID             focus window ID
  gui click-xy X Y         click at screen coordinates (double-click-xy, drag X1 Y1 X2 Y2 too)
  gui type 'TEXT' [--into ID]   type into the focused window (or focus window ID first)
  gui key KEY              press a key: Return, Tab, ctrl+s, ctrl+Home, shift+End, ...
  gui scroll DY [--at ID]  scroll (positive = down)
The task is judged from the files the programs leave: save your work. Stop when you are done."""
INSTRUCTION_FILES = {
    **{name: f"# Working in this sandbox\n\n{GUIDE}\n" for name in ("AGENTS.md", "CLAUDE.md")},
    # OpenClaw's exec mode reads no AGENTS.md (it never bootstraps a workspace) but loads the skills under
    # <workspace>/.agents/skills into its system prompt: the same guide as a skill
    ".agents/skills/gui/SKILL.md": (
        "---\nname: gui\ndescription: Look at and act on the desktop programs open on this sandbox's screen with the `gui` shell command "
        f"(observe, click, type, key, scroll).\n---\n\n# The gui command\n\n{GUIDE}\n"
    ),
}


class DesktopEnv(Environment):
    """Options: ``names`` (task names or globs; default all 13), ``instances`` per task (1), ``seed`` (0), ``timeout`` (s, 300)."""

    name = "desktop"
    version = "1"
    threshold = 1.0

    class Options(GuiOptions):
        timeout: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="the episode's clock in s")

    opts: Options

    def names(self) -> list[str]:
        return select(list(KINDS), self.opts.names, "desktop")

    def tasks(self) -> list[Task]:
        return [self.make_task(name, i) for name in self.names() for i in range(self.opts.instances)]

    def make_task(self, name: str, index: int) -> Task:
        kind = KINDS[name]
        params = kind.params(random.Random(f"desktop:{self.opts.seed}:{name}:{index}"))
        return Task(
            id=f"{name}.{index}",
            instruction=f"{kind.instruction(params)}\n\n{GUIDE}",
            files={**INSTRUCTION_FILES, **kind.files(params)},
            mcp_servers=dict(MCP_SERVERS),  # the same gui-mcp, over the desktop `gui`
            setup=setup_script(kind, params, START_WAIT_S),
            timeout_s=self.opts.timeout,
            meta={"task": name, "instance": index, "params": params, "family": name, "gui": "desktop"},
            workdir=HOME,
            solution=str(ORACLE),
        )

    def image_layer(self) -> ImageLayer:
        return desktop_layer()

    async def verify(self, sandbox: Sandbox, task: Task, workdir: str) -> Score:
        kind = KINDS.get(str(task.meta.get("task")))
        if kind is None:
            return self.score(0.0, f"{task.id} is not a desktop task")
        probe = await sandbox.exec(["gui", "status", "--json"], timeout_s=60)
        if probe.exit_code == 3 or probe.timed_out:
            raise SandboxError(f"desktop: the X server of {task.id} is gone: {(probe.stderr or probe.stdout).strip()[-500:]}")
        value, detail = await kind.check(sandbox, task.meta.get("params", {}))
        windows = json.loads(probe.stdout).get("windows") if probe.ok else None
        return self.score(value, f"{detail} ({windows} windows open)")


__all__ = ["DesktopEnv"]
