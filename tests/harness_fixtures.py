"""Small harnesses for engine tests: each runs a shell command in the sandbox (no model needed)."""

from __future__ import annotations

from core.env import Task
from core.harness import Endpoint, Harness, LaunchSpec


class ShellHarness(Harness):
    """Runs `options["command"]` in the workspace; `{task}` is replaced by the task id."""

    name = "test-shell"
    version = "1"

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        command = self.options.get("command", "true").replace("{task}", task.id)
        return LaunchSpec(command=["bash", "-c", command], env={"FORGETUI_BASE_URL": endpoint.base_url})


class HangingHarness(ShellHarness):
    """Hangs on tasks whose id matches `options["hang_on"]` (a substring), solves the others."""

    name = "test-hang"

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        if self.options.get("hang_on", "") in task.id:
            return LaunchSpec(command=["bash", "-c", "sleep 3600"])
        return super().launch(task, endpoint, workdir)
