"""Small environments for engine tests: a verifier whose reward varies within a group under a random model."""

from __future__ import annotations

import hashlib
import json
import random

from core.env import Environment, Score, Task
from core.rollout.trajectory_formats import TRAJECTORY_PATH

NOTE_WORDS = ("file test build change review commit branch module config script output error format docs check run "
              "release version import name path log cache schema table index query request response client server").split()
HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace")


def answer_text(trajectory: bytes) -> str:
    """What the agent said: every assistant message's text and tool calls in the recorded conversation, in order."""
    parts = []
    for line in trajectory.decode("utf-8", "replace").splitlines():
        message = json.loads(line) if line.strip() else {}
        if message.get("role") == "assistant":
            parts.append(json.dumps([message.get("content"), message.get("tool_calls")], sort_keys=True))
    return "\n".join(parts)


def answer_reward(text: str) -> float:
    """A stand-in grader's score of an answer in [0, 1): its SHA-256's first two bytes (two answers almost never tie)."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:2], "big") / 65536


def project_notes(size: int) -> str:
    """A project's contributor notes of `size` bytes (what a long AGENTS.md holds), the same every time."""
    rng = random.Random(size)
    lines = ["# Contributor notes", ""]
    while sum(len(line) + 1 for line in lines) < size:
        words = rng.sample(NOTE_WORDS, 9)
        lines.append(f"- When you {words[0]} the {words[1]}, {words[2]} its {words[3]} before you {words[4]} the {words[5]} ({words[6]}, {words[7]}, {words[8]}).")
    return "\n".join(lines)[:size]


class AnswerHashEnv(Environment):
    """The toy `hello` task scored on the sampled answer itself (the recorded conversation), not the workspace.

    A random model never solves a real task, so a real verifier gives every rollout 0 and GRPO no signal;
    this one reads the transcript graders get (`graders_read_trajectory`) and scores the model's own words,
    a reward that is a fixed function of what was sampled and differs across a group.
    """

    name = "test-answer-hash"
    version = "1"
    threshold = 0.5
    graders_read_trajectory = True
    accepted_options = ("agents_md_kb",)

    def tasks(self) -> list[Task]:
        """`hello`; with option `agents_md_kb`, its workspace has an AGENTS.md of that many KB (Codex reads it into its prompt)."""
        kb = int(self.options.get("agents_md_kb", 0))
        if not kb:
            return [HELLO]
        return [Task(id=HELLO.id, instruction=HELLO.instruction, files={"AGENTS.md": project_notes(kb * 1024)})]

    async def verify(self, sandbox, task: Task, workdir: str) -> Score:
        text = answer_text(await sandbox.get_file(TRAJECTORY_PATH))
        return self.score(answer_reward(text), f"{len(text)} characters of answer", task)
