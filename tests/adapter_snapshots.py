"""What each harness launches and each env's tasks, as plain JSON: compared with `tests/fixtures/adapter_options/`.

The fixtures were written by this module from main's code before harness and env options became typed models
(`python -m tests.adapter_snapshots`), so `tests/test_adapter_options.py` checks the typed options build the same
commands, config files and tasks as the hand-parsed ones did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from core.env import McpServer, Task
from core.harness import Endpoint
from core.registry import load_env, load_harness

FIXTURES = Path(__file__).with_name("fixtures") / "adapter_options"
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")
WORKDIR = "/workspace"
ZEROCLAW_BYTES = b"#!/bin/sh\necho a stand-in zeroclaw\n"  # its hash is the harness's version
INLINE_LIMIT = 4096  # longer file contents (react's agent script: no option changes it) are only marked

# (harness, options): the defaults, then every documented option set to something else
HARNESS_CASES: list[tuple[str, dict[str, Any]]] = [
    ("react", {}),
    ("react", {"max_steps": 7, "temperature": 0.5, "max_tokens": 64, "stream": True, "command_timeout": 30, "gui": "both"}),
    ("codex", {}),
    ("codex", {"context_window": 65536, "reasoning_effort": "low", "stream_idle_timeout_ms": 1000, "request_max_retries": 2, "stream_max_retries": 3, "mcp": False, "extra_args": ["--profile", "x"]}),
    ("claude-code", {}),
    ("claude-code", {"model": "claude-opus-4-1", "max_output_tokens": 1024, "max_turns": 5, "tools": ["Bash", "Read"], "api_timeout_ms": 1000, "max_retries": 2, "mcp": False, "extra_args": ["--verbose"]}),
    ("claude-code", {"tools": "Bash,Edit"}),
    ("openclaw", {}),
    ("openclaw", {"api": "openai-responses", "context_window": 1000, "max_tokens": 100, "timeout_s": 42, "tool_search": {"mode": "directory"}}),
    ("openclaw", {"api": "anthropic-messages", "mcp": False, "tool_search": True}),
    ("opencode", {}),
    ("opencode", {"context_window": 1000, "max_tokens": 100, "title_call": True, "mcp": False}),
    ("pi", {}),
    ("pi", {"context_window": 1000, "max_tokens": 100, "thinking": "low"}),
    ("gemini-cli", {}),
    ("gemini-cli", {"max_session_turns": 3, "mcp": False, "extra_args": ["--debug"]}),
    ("mini-swe-agent", {}),
    ("mini-swe-agent", {"step_limit": 5, "command_timeout": 30, "retries": 0, "extra_config": ["agent.cost_limit=1"]}),
    ("mini-swe-agent", {"client": "litellm"}),
    ("zeroclaw", {}),
    ("zeroclaw", {"binary": "ZEROCLAW", "wire_api": "responses", "timeout_secs": 30}),
    ("oracle", {}),
    ("noop", {}),
]

# (env, options): the defaults, then the documented options
ENV_CASES: list[tuple[str, dict[str, Any]]] = [
    ("claw-bench", {}),
    ("claw-bench", {"domains": "calendar,email", "levels": ["l1", "L2"], "workdir": "/work"}),
    ("claw-bench", {"ids": ["cal-001", "eml-002-compose-from-template"]}),
    ("harbor", {}),
    ("harbor", {"threshold": 0.5, "strict": True}),
    ("miniwob", {}),
    ("miniwob", {"names": "click-*,enter-text", "instances": 2, "seed": 3, "timeout": 60, "mode": "test", "time_penalty": True}),
    ("desktop", {}),
    ("desktop", {"names": ["sheet-*", "term-exit"], "instances": 2, "seed": 4, "timeout": 100}),
]


def case_id(name: str, options: dict[str, Any]) -> str:
    return f"{name}:{json.dumps(options, sort_keys=True)}"


def sample_tasks(root: Path) -> list[Task]:
    """A plain task, and one with a timeout, MCP servers and a reference solution (written under `root`)."""
    solution = root / "solution" / "solve.sh"
    solution.parent.mkdir(parents=True, exist_ok=True)
    solution.write_text("#!/bin/bash\necho hi > hello.txt\n")
    return [
        Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace", solution=str(solution)),
        Task(
            id="gui.0", instruction="Click the button.", timeout_s=90.0, solution=str(solution),
            mcp_servers={"gui": McpServer(command="/opt/forgetui/gui-mcp", args=("--stdio",))},
        ),
    ]  # fmt: skip


def _content(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > INLINE_LIMIT:
        return "(long)"
    return raw.decode("utf-8", "replace")


def harness_snapshot(name: str, options: dict[str, Any], root: Path) -> dict[str, Any]:
    """The harness's version and protocols, and its LaunchSpec (command, env, files, workdir) for each sample task."""
    if "binary" in options:
        binary = root / "zeroclaw"
        binary.write_bytes(ZEROCLAW_BYTES)
        options = {**options, "binary": str(binary)}
    harness = load_harness(name, **options)
    launches = []
    for task in sample_tasks(root):
        spec = harness.launch(task, ENDPOINT, WORKDIR)
        launches.append({
            "task": task.id, "command": spec.command, "env": spec.env, "workdir": spec.workdir,
            "files": {path: _content(data) for path, data in sorted(spec.files.items())},
        })  # fmt: skip
    out: dict[str, Any] = {"protocols": list(harness.protocols), "launches": launches}
    if not harness.installable:  # an installable harness's version is the pin in harnesses/versions.py, not an option's doing
        out["version"] = harness.version
    return out


def env_snapshot(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every task the env makes: its id, content hash (instruction, setup, meta, files, image, verifier) and the rest."""
    env = load_env(name, **options)
    tasks = []
    for task in env.tasks():
        tasks.append({
            "id": task.id, "hash": task.content_hash, "timeout_s": task.timeout_s, "workdir": task.workdir,
            "threshold": task.threshold, "mcp": sorted(task.mcp_servers), "solution": Path(task.solution).name if task.solution else None,
        })  # fmt: skip
    return {"tasks": tasks}


def write(root: Path) -> None:
    """Write both fixtures from the code as it is now."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    harnesses = {case_id(n, o): harness_snapshot(n, o, root) for n, o in HARNESS_CASES}
    envs = {case_id(n, o): env_snapshot(n, o) for n, o in ENV_CASES}
    (FIXTURES / "harness_launches.json").write_text(json.dumps(harnesses, indent=1, sort_keys=True) + "\n")
    (FIXTURES / "env_tasks.json").write_text(json.dumps(envs, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
    print(f"wrote {FIXTURES}", file=sys.stderr)
