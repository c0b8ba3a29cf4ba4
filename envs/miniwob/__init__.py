"""The `miniwob` environment: MiniWoB++ web tasks in a real headless Chromium inside the rollout's sandbox.

The task's setup starts `gui start` in the sandbox: a long-lived server drives Debian's Chromium
through chromedriver, loads the task page (from the `miniwob==1.1.0` wheel) and starts its episode
from the task's seed, so every sample of a GRPO group sees the same instance. The agent looks and
acts through the `gui` CLI (observe, click, click-xy, drag, type, key, scroll, select); the verifier asks
the same server for the page's own reward (`WOB_RAW_REWARD_GLOBAL` once `WOB_DONE_GLOBAL` is set:
the un-timed reward by default, `time_penalty = true` for MiniWoB's time-scaled
`WOB_REWARD_GLOBAL`), negative rewards clipped to 0. A browser that crashed or a page that never
loaded is an infrastructure error (the attempt is retried), never the agent's score.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

from pydantic import Field

from core.adapter import Environment, ImageLayer, McpServer, Sandbox, SandboxError, Score, Task
from envs.miniwob.image import HTML_ROOT, MCP_PATH, miniwob_html, miniwob_layer
from envs.miniwob.names import GuiOptions, select

ORACLE = Path(__file__).with_name("oracle") / "solve.sh"
ORACLE_TASKS = ("click-button", "click-link", "click-test", "focus-text", "enter-text", "choose-list", "click-checkboxes", "navigate-tree")
DEFAULT_TIMEOUT_S = 120.0
START_WAIT_S = 90.0
INSTRUCTION = """A web page is open in a browser in this sandbox: a small MiniWoB++ task. Complete the task the page states.
Look at the page and act on it with the `gui` command in the shell:
  gui observe              the task text, the page's elements as [id] tag "text" @ x,y, and a screenshot's path
  gui click ID             click an element by its id
  gui click-xy X Y         click at page coordinates (pixels of the screenshot)
  gui drag X1 Y1 X2 Y2     drag with the left button from (X1, Y1) to (X2, Y2)
  gui type 'TEXT' [--into ID]   type into the focused element (or click ID first)
  gui key KEY              press a key: Enter, Tab, Backspace, ctrl+a, ...
  gui scroll DY [--at ID]  scroll by DY pixels (positive = down)
  gui select ID 'OPTION'   choose an option of a <select> element
  gui status               whether the episode is over, and its reward
Start with `gui observe`. Ids can change when the page changes: observe again after acting.
The episode ends by itself when the page judges your answer: stop once `gui status` says done."""

# the instruction files external harnesses read from their working directory (Codex, Claude Code, OpenClaw)
INSTRUCTION_FILES = {
    **{name: f"# Working in this sandbox\n\n{INSTRUCTION}\n" for name in ("AGENTS.md", "CLAUDE.md")},
    # OpenClaw's exec mode reads no AGENTS.md (it never bootstraps a workspace) but loads the skills under
    # <workspace>/.agents/skills into its system prompt: the same guide as a skill
    ".agents/skills/gui/SKILL.md": (
        "---\nname: gui\ndescription: Look at and act on the web page open in this sandbox's browser with the `gui` shell command "
        f"(observe, click, type, key, scroll).\n---\n\n# The gui command\n\n{INSTRUCTION}\n"
    ),
}
# the same actions as MCP tools (the image's gui-mcp), for harnesses that take MCP servers
MCP_SERVERS = {"gui": McpServer(command=MCP_PATH)}


def task_names(html: Path) -> list[str]:
    """Every MiniWoB++ task the wheel ships as a page of its own (html/miniwob/*.html), sorted."""
    return sorted(p.stem for p in (html / "miniwob").glob("*.html"))


def instance_seed(seed: int, name: str, index: int) -> int:
    """The page's Math.seedrandom seed for instance `index` of task `name`: fixed by the env's seed."""
    return int.from_bytes(hashlib.sha256(f"miniwob:{seed}:{name}:{index}".encode()).digest()[:4], "big")


def start_command(name: str, seed: int, timeout_s: float, mode: str) -> str:
    """The task's setup: start the browser server on the task page, episode seeded."""
    url = f"file://{HTML_ROOT}/miniwob/{name}.html"
    args = ["gui", "start", "--task", name, "--url", url, "--seed", str(seed), "--timeout", f"{timeout_s:g}", "--mode", mode, "--wait", f"{START_WAIT_S:g}"]
    return " ".join(shlex.quote(a) for a in args)


class MiniWoBEnv(Environment):
    """Options: ``names`` (task names or globs; default all), ``instances`` per task (1), ``seed`` (0),
    ``timeout`` (the episode's clock in s, 120), ``mode`` (the page's data mode, "train"), ``time_penalty`` (False)."""

    name = "miniwob"
    version = "1.1.0"
    threshold = 1.0

    class Options(GuiOptions):
        timeout: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="the episode's clock in s")
        mode: str = Field("train", description="the page's data mode")
        time_penalty: bool = Field(False, description="score with MiniWoB's time-scaled reward instead of the un-timed one")

    opts: Options

    def names(self) -> list[str]:
        """The task names the `names` option selects (all when unset); ConfigError for a pattern that matches none."""
        return select(task_names(miniwob_html()), self.opts.names, "miniwob")

    def tasks(self) -> list[Task]:
        return [self.make_task(name, i) for name in self.names() for i in range(self.opts.instances)]

    def make_task(self, name: str, index: int) -> Task:
        seed = instance_seed(self.opts.seed, name, index)
        timeout, mode = self.opts.timeout, self.opts.mode
        return Task(
            id=f"{name}.{index}",
            instruction=INSTRUCTION,
            setup=start_command(name, seed, timeout, mode),
            files=dict(INSTRUCTION_FILES),
            mcp_servers=dict(MCP_SERVERS),
            timeout_s=timeout + 30.0,
            meta={"task": name, "instance": index, "seed": seed, "mode": mode, "family": name, "gui": "browser"},
            solution=str(ORACLE) if name in ORACLE_TASKS else None,
        )

    def image_layer(self) -> ImageLayer:
        return miniwob_layer()

    async def verify(self, sandbox: Sandbox, task: Task, workdir: str) -> Score:
        result = await sandbox.exec(["gui", "status", "--json"], timeout_s=60)
        if result.exit_code == 3 or result.timed_out:
            raise SandboxError(f"miniwob: the browser of {task.id} is gone, so its reward cannot be read: {(result.stderr or result.stdout).strip()[-500:]}")
        try:
            status = json.loads(result.stdout)
        except ValueError:
            return self.score(0.0, f"`gui status` answered no JSON (exit {result.exit_code}): {(result.stdout + result.stderr)[-500:]}")
        if not status.get("done"):
            return self.score(0.0, f"not done after {status.get('elapsed_s')} s: the page gave no reward")
        raw = float(status.get("raw_reward") or 0.0)
        timed = float(status.get("reward") or 0.0)
        value = timed if self.opts.time_penalty else raw
        detail = f"done: raw reward {raw:g}, time-scaled {timed:g} after {status.get('elapsed_s')} s" + (f" ({status['reason']})" if status.get("reason") else "")
        return self.score(max(0.0, value), detail)


__all__ = ["MCP_SERVERS", "MiniWoBEnv", "instance_seed", "task_names"]
