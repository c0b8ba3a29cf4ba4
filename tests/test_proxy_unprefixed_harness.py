"""A real multi-turn harness run by hand against `forgetui proxy`'s un-prefixed URL: one session, spliced, extending."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORGETUI = [sys.executable, "-m", "forgetui.cli"]
AGENT = REPO / "harnesses" / "react" / "agent.py"


@pytest.fixture
def env(tmp_path: Path) -> dict:
    return {**os.environ, "FORGETUI_HOME": str(tmp_path / "home")}


def test_the_react_harness_by_hand_gets_one_session_with_token_splicing(tmp_path, env):
    script = tmp_path / "script.json"
    turns = [{"tool": "shell", "command": "echo hi > hello.txt"}, {"tool": "shell", "command": "cat hello.txt"}, {"text": "done: hello.txt says hi"}]
    script.write_text(json.dumps({"turns": turns}))
    store = tmp_path / "s.duckdb"
    proxy = subprocess.Popen([*FORGETUI, "proxy", "--backend", f"scripted:{script}", "--store", str(store), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = proxy.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proxy.stderr.read() if proxy.poll() is not None else url
        work = tmp_path / "work"
        work.mkdir()
        agent = subprocess.run(
            [sys.executable, str(AGENT), "--base-url", f"{url}/v1", "--api-key", "sk-whatever", "--workdir", str(work), "--max-steps", "5"],
            input="Write hi into hello.txt, then check it.", capture_output=True, text=True, timeout=180, env=env,
        )
        assert agent.returncode == 0, agent.stderr
        assert (work / "hello.txt").read_text() == "hi\n"
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.communicate(timeout=60)
    out = subprocess.run(
        [*FORGETUI, "sql", "SELECT rollout_id, seq, branch, extends_parent, prefix_tokens, status FROM calls ORDER BY seq", "--store", str(store), "--format", "json"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["seq"] for r in rows] == [0, 1, 2]
    assert len({r["rollout_id"] for r in rows}) == 1 and rows[0]["rollout_id"].endswith("-default")
    assert [r["extends_parent"] for r in rows] == [False, True, True]
    assert {r["branch"] for r in rows} == {0} and all(r["status"] == "ok" for r in rows)
    assert rows[1]["prefix_tokens"] > 0 and rows[2]["prefix_tokens"] > rows[1]["prefix_tokens"]
