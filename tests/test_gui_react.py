"""The react harness's GUI mode: a MiniWoB++ task end to end in Docker (real Chromium) with the scripted backend."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from core.env import Task
from core.errors import ConfigError
from core.harness import Endpoint
from harnesses.react import ReactHarness

GUI_TOOL_NAMES = {"click", "click_xy", "type_text", "press_key", "scroll", "select_option", "drag"}


def _flags(argv: list[str]) -> list[str]:
    return argv[4:]


def test_gui_mode_follows_the_task_unless_set() -> None:
    gui_task = Task(id="t", instruction="x", meta={"gui": "browser"})
    shell_task = Task(id="s", instruction="x")
    ep = Endpoint(base_url="http://127.0.0.1:9/r/a", token="a")
    argv = ReactHarness().launch(gui_task, ep, "/workspace").command
    assert _flags(argv)[-2:] == ["--gui", "text"]
    assert "--gui" not in ReactHarness().launch(shell_task, ep, "/workspace").command
    assert _flags(ReactHarness(gui="both").launch(shell_task, ep, "/workspace").command)[-2:] == ["--gui", "both"]
    assert "--gui" not in ReactHarness(gui="off").launch(gui_task, ep, "/workspace").command
    with pytest.raises(ConfigError, match=r"harness.options.gui: Input should be 'auto', 'off', 'text', 'image' or 'both'"):
        ReactHarness(gui="video")


def _run(script: Path, *extra: str) -> tuple[Any, list[tuple], list[tuple]]:
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    sets = [
        "env.name=miniwob", 'env.options.names=["click-test"]', 'harness.name="react"', f'policy.backend="scripted:{script}"',
        "runtime.kind=docker", "run.max_retries=0", *extra,
    ]  # fmt: skip
    summary = asyncio.run(execute_run(load_config(None, sets)))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        rollouts = con.execute("SELECT status, reward, passed, error, meta->>'stdout_tail', meta->>'stderr_tail' FROM rollouts").fetchall()
        calls = con.execute("SELECT seq, status, request FROM calls_full ORDER BY seq").fetchall()
    finally:
        con.close()
    return summary, [tuple(r) for r in rollouts], [tuple(r) for r in calls]


@pytest.mark.docker
def test_react_gui_mode_solves_a_miniwob_task_with_the_scripted_backend(docker_client, base_image, tmp_path: Path) -> None:
    script = tmp_path / "gui.json"
    # a bad id first (the agent sees the error as the tool result), then the button (id 4 on click-test's page)
    script.write_text(json.dumps({"turns": [
        {"tool_call": {"name": "click", "arguments": {"id": 999}}},
        {"tool_call": {"name": "click", "arguments": {"id": 4}}},
        {"text": "should not be asked: the page ended the episode"},
    ]}))  # fmt: skip
    summary, rollouts, calls = _run(script)
    ((status, reward, passed, error, stdout, stderr),) = rollouts
    assert (status, reward, passed) == ("done", 1.0, True), (error, stdout, stderr)
    assert "episode over" in stdout
    assert [c[:2] for c in calls] == [(0, "ok"), (1, "ok")]  # no third call: the agent stopped when the page judged
    first, second = (json.loads(c[2]) if isinstance(c[2], str) else c[2] for c in calls)
    assert {t["function"]["name"] for t in first["tools"]} == GUI_TOOL_NAMES
    shown = " ".join(p["text"] for p in first["messages"][1]["content"] if p["type"] == "text")
    assert "task: Click the button." in shown and '[4] button#subbtn "Click Me!"' in shown
    tool_results = [m["content"] for m in second["messages"] if m["role"] == "tool"]
    assert tool_results == ["error: no element with id 999 on the page now; run `gui observe` for the current ids\n(exit code 1)"]
    # after the action the screen is shown again, as a user turn
    assert second["messages"][-1]["role"] == "user" and "task: Click the button." in second["messages"][-1]["content"][0]["text"]


@pytest.mark.docker
def test_react_image_mode_sends_screenshots_that_are_stored_once(docker_client, base_image, tmp_path: Path) -> None:
    import duckdb

    script = tmp_path / "gui.json"
    script.write_text(json.dumps({"turns": [
        {"tool_call": {"name": "click", "arguments": {"id": 999}}},
        {"tool_call": {"name": "click", "arguments": {"id": 4}}},
    ]}))  # fmt: skip
    summary, rollouts, calls = _run(script, 'harness.options.gui="image"')
    ((status, reward, _passed, error, _stdout, stderr),) = rollouts
    assert (status, reward) == ("done", 1.0), (error, stderr)
    first = json.loads(calls[0][2]) if isinstance(calls[0][2], str) else calls[0][2]
    parts = first["messages"][1]["content"]
    assert parts[-1]["type"] == "image_url" and parts[-1]["image_url"]["url"] is None  # the bytes are not in the row
    ref = parts[-1]["image_url"]["forgetui_blob"]
    con = duckdb.connect(summary.store, read_only=True)
    try:
        blobs = con.execute("SELECT sha256, media_type, bytes, data FROM blobs").fetchall()
        hashes = [r[0] for r in con.execute("SELECT image_hashes FROM calls ORDER BY seq").fetchall()]
    finally:
        con.close()
    assert ref == f"sha256:{hashes[0][0]}" and len(hashes[0]) == 1 and len(hashes[1]) == 2  # call 1 resends call 0's screenshot
    assert {b[0] for b in blobs} == {h for hs in hashes for h in hs}  # each distinct screenshot once
    for sha, media_type, size, data in blobs:
        assert media_type == "image/png" and data[:8] == b"\x89PNG\r\n\x1a\n" and size == len(data)
        assert hashlib.sha256(data).hexdigest() == sha
