"""Crafted recordings for the analytics and replay tests: a scripted policy through a real harness in Docker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from core.config import load_config
from core.eval.summary import RunSummary
from core.run import execute_run
from envs.toy import ToyEnv

FAIL_FIX_VERIFY = [
    {"tool": "shell", "command": "cat missing.txt"},  # fails (exit 1)
    {"tool": "shell", "command": "echo hi > hello.txt"},  # the fix, a write
    {"tool": "shell", "command": "cat hello.txt"},  # reads it back
    {"text": "I created hello.txt containing hi."},
]
MALFORMED = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {not json}\n</tool_call>"


def toy_tasks() -> dict[str, Any]:
    """The toy tasks the crafted run uses: hello, a make-dirs task with several dirs, a sum-numbers and a write-file task."""
    tasks = ToyEnv().tasks()
    pick = {"hello": next(t for t in tasks if t.id == "hello")}
    pick["make-dirs"] = next(t for t in tasks if t.meta["family"] == "make-dirs" and len(t.meta["params"]["dirs"]) >= 2)
    pick["sum-numbers"] = next(t for t in tasks if t.meta["family"] == "sum-numbers")
    pick["write-file"] = next(t for t in tasks if t.meta["family"] == "write-file")
    return pick


def crafted_scripts(tasks: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Family → turns whose every behaviour metric is known by construction.

    One run per task: the scripted policy's per-task `match` reads the first user message, and Codex's
    first user message is its environment context, not the task.
    """
    dirs = tasks["make-dirs"].meta["params"]["dirs"]
    numbers = tasks["sum-numbers"].meta["params"]  # the task names its input and output files
    src, dst = numbers["src"], numbers["dst"]
    return {
        # no tool call at all: the harness ends on a text answer
        "hello": [{"text": "Nothing to do here."}],
        # a write never checked, one of several required outputs met
        "make-dirs": [{"tool": "shell", "command": f"mkdir -p {dirs[0]}"}, {"text": "done"}],
        # a failed command, then the fix, then a read-back
        "sum-numbers": [
            {"tool": "shell", "command": "cat missing-numbers.txt"},
            {"tool": "shell", "command": f"python3 -c 'print(sum(int(x) for x in open(\"{src}\")))' > {dst}"},
            {"tool": "shell", "command": f"cat {dst}"},
            {"text": f"The sum is in {dst}."},
        ],
        # a malformed tool call (not JSON): plain text to the harness, flagged in the store
        "write-file": [{"text": MALFORMED}],
    }


def run_scripted(harness: str, script: dict[str, Any] | list[dict[str, Any]], tmp_path: Path, *, env: str = "toy", tasks: list[str], extra: list[str] | None = None) -> RunSummary:
    """One run of `tasks` with a scripted policy through `harness` in Docker, one sample each."""
    path = tmp_path / f"script-{harness}.json"
    path.write_text(json.dumps(script if isinstance(script, dict) else {"turns": script}))
    ids = ",".join(tasks)
    config = load_config(
        None,
        [
            f"env.name={env}",
            f'env.tasks="{ids}"',
            f'harness.name="{harness}"',
            f'policy.backend="scripted:{path}"',
            "runtime.kind=docker",
            "run.timeout_s=300",
            "run.max_retries=0",
            "run.concurrency=4",
            *(extra or []),
        ],
    )
    return asyncio.run(execute_run(config))
