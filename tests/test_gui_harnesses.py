"""External harnesses on a GUI task: Codex, Claude Code and OpenClaw act through the sandbox's `gui` CLI, told how
by the instruction file each reads (AGENTS.md, CLAUDE.md, a skill), on a MiniWoB++ page in real Chromium, scripted backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from envs.miniwob import MiniWoBEnv

# the scripted policy calls whichever shell tool the harness offers: look, then click the button (id 4 on click-test)
SCRIPT = [
    {"tool": "shell", "command": "gui observe --no-screenshot"},
    {"tool": "shell", "command": "gui click 4"},
    {"text": "I clicked the button; the page ended the episode."},
]


def test_every_task_ships_the_instruction_files_harnesses_read() -> None:
    task = MiniWoBEnv(names="click-test").tasks()[0]
    for name in ("AGENTS.md", "CLAUDE.md", ".agents/skills/gui/SKILL.md"):
        text = str(task.files[name])
        assert "gui observe" in text and "gui click ID" in text and "gui select ID" in text
    assert str(task.files[".agents/skills/gui/SKILL.md"]).startswith("---\nname: gui\ndescription: ")  # a skill's frontmatter


def _run(harness: str, tmp_path: Path) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": SCRIPT}))
    sets = [
        "env.name=miniwob", 'env.options.names=["click-test"]', f'harness.name="{harness}"',
        f'policy.backend="scripted:{script}"', "runtime.kind=docker", "run.max_retries=0", "run.timeout_s=300",
    ]  # fmt: skip
    summary = asyncio.run(execute_run(load_config(None, sets)))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        cur = con.execute("SELECT status, reward, passed, error, meta FROM rollouts")
        rollout = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
        cur = con.execute("SELECT seq, status, request FROM calls ORDER BY seq")
        calls = [dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    return summary, rollout, calls


def _request_text(call: dict[str, Any]) -> str:
    body = call["request"]
    return body if isinstance(body, str) else json.dumps(body)


# what each harness reads into the model's context: its instruction file (the heading is in no prompt), or
# for OpenClaw the skill (its exec mode reads no AGENTS.md; the skill's description is listed in its system prompt)
READS = {"codex": "# Working in this sandbox", "claude-code": "# Working in this sandbox", "openclaw": "with the `gui` shell command"}


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the harness's npm tree
@pytest.mark.parametrize("harness", ["codex", "claude-code", pytest.param("openclaw", marks=pytest.mark.slow)])
def test_external_harness_solves_a_miniwob_task_through_the_gui_cli(harness: str, docker_client, base_image, tmp_path: Path) -> None:
    summary, rollout, calls = _run(harness, tmp_path)
    assert (rollout["status"], rollout["reward"], rollout["passed"]) == ("done", 1.0, True), (rollout["error"], rollout["meta"])
    assert len(calls) == 3 and all(c["status"] == "ok" for c in calls)
    assert READS[harness] in _request_text(calls[0])
    # the harness ran `gui observe` and the model saw the page's text form in the tool result of the next call
    second = _request_text(calls[1])
    assert "task: Click the button." in second and "button#subbtn" in second
    third = _request_text(calls[2])
    assert "clicked [4] button#subbtn" in third and "the episode is over: reward" in third
