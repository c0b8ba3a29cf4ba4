"""Small harnesses for engine tests: each runs a shell command in the sandbox (no model needed)."""

from __future__ import annotations

from core.env import Task
from core.harness import Endpoint, Harness, LaunchSpec
from harnesses.codex import INSTRUCTION_PATH, CodexHarness


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


COIN_SCRIPT = r"""
import hashlib, json, os, urllib.request
body = {"model": "policy", "max_tokens": 6, "messages": [{"role": "user", "content": "Say anything."}]}
req = urllib.request.Request(os.environ["FORGETUI_BASE_URL"] + "/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
text = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"] or ""
if hashlib.sha256(text.encode()).digest()[0] % 2 == 0:
    open("hello.txt", "w").write("hi")
"""


class CoinHarness(Harness):
    """One real model call; the `hello` task passes when the answer's hash is even (a reward that varies in a group)."""

    name = "test-coin"
    version = "1"

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        return LaunchSpec(command=["python3", "-c", COIN_SCRIPT], env={"FORGETUI_BASE_URL": endpoint.base_url})


FOLLOW_UP_PATH = "/tmp/forgetui-codex/follow-up.txt"


class CodexFollowUp(CodexHarness):
    """Codex for two turns: `codex exec` on the task, then `codex exec resume --last` with a follow-up message.

    The second turn resends the first one's conversation, so its call extends the first call token for token
    even when the model never calls a tool (a random model's answers are text): calls to merge through Codex.
    """

    class Options(CodexHarness.Options):
        follow_up: str = "Check your work and say what you changed."

    opts: Options

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        spec = super().launch(task, endpoint, workdir)
        args = [a for a in self.exec_args(endpoint, workdir) if a != "--ephemeral"][1:-1]  # the session is kept for resume
        script = f'codex exec "$@" - < {INSTRUCTION_PATH} && exec codex exec "$@" resume --last "$(cat {FOLLOW_UP_PATH})" < /dev/null'
        spec.command = ["sh", "-c", script, "codex", *args]
        spec.files[FOLLOW_UP_PATH] = self.opts.follow_up
        return spec
