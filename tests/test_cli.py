"""The CLI contract scripts rely on: `forgetui proxy` prints its URL, records, stops cleanly; `forgetui sql` reads live and after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

FORGETUI = [sys.executable, "-m", "forgetui.cli"]


def sql(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*FORGETUI, "sql", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def env(tmp_path: Path) -> dict:
    return {**os.environ, "FORGETUI_HOME": str(tmp_path / "home")}


def start_proxy(args: list[str], env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*FORGETUI, "proxy", *args, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
    return proc, url


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_proxy_records_serves_live_sql_and_stops_cleanly(tmp_path, env, sig):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"text": "hello there"}]}))
    store = tmp_path / "calls.duckdb"
    proc, url = start_proxy(["--backend", f"scripted:{script}", "--store", str(store)], env)
    try:
        for name in ("a", "b"):
            resp = httpx.post(f"{url}/r/{name}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
            assert resp.json()["choices"][0]["message"]["content"] == "hello there"
        # a live read while the proxy holds the store, through its query endpoint
        live = sql("SELECT count(*) AS n FROM calls", "--store", str(store), "--format", "json", env=env)
        assert live.returncode == 0, live.stderr
        assert json.loads(live.stdout) == [{"n": 2}]
        # the default store is the most recently written one under FORGETUI_HOME... here --store was given, so check csv
        csv = sql("SELECT rollout_id FROM calls ORDER BY seq, rollout_id", "--store", str(store), "--format", "csv", env=env)
        assert csv.stdout.splitlines()[0] == "rollout_id" and len(csv.stdout.splitlines()) == 3
        writes = sql("DELETE FROM calls", "--store", str(store), env=env)
        assert writes.returncode != 0 and "read-only" in (writes.stderr + writes.stdout).lower()
    finally:
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
    after = sql("SELECT status, count(*) AS n FROM rollouts GROUP BY status", "--store", str(store), "--format", "json", env=env)
    assert json.loads(after.stdout) == [{"status": "done", "n": 2}]
    runs = sql("SELECT status FROM runs", "--store", str(store), "--format", "json", env=env)
    assert json.loads(runs.stdout) == [{"status": "stopped"}]


def test_sql_defaults_to_latest_store_and_table_format(tmp_path, env):
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"text": "x"}]))
    proc, url = start_proxy(["--backend", f"scripted:{script}"], env)
    try:
        httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    table = sql("SELECT api, status FROM calls", env=env)
    assert table.returncode == 0 and "chat" in table.stdout and "ok" in table.stdout


def test_bad_backend_spec_is_a_clear_error(env):
    out = subprocess.run([*FORGETUI, "proxy", "--backend", "nonsense"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "builtin:MODEL" in out.stderr


def test_sql_without_any_store_says_what_to_do(env):
    out = sql("SELECT 1", env=env)
    assert out.returncode == 2 and "no store found" in out.stderr


def test_serve_model_prints_its_url_answers_token_ids_and_stops(env):
    proc = subprocess.Popen([*FORGETUI, "serve-model", "tiny", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        body = {"model": "tiny", "prompt": [1, 2, 3, 4], "max_tokens": 5, "return_token_ids": True, "logprobs": 0, "temperature": 0}
        choice = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]
        assert 0 < len(choice["token_ids"]) <= 5 and len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_progress_names_no_model_for_oracle_and_hides_keys() -> None:
    from core.config import load_config
    from forgetui.headless import policy_shown

    assert policy_shown(load_config(None, ["harness.name=noop", "policy.backend=builtin:tiny"])) == "none"
    assert policy_shown(load_config(None, ["harness.name=oracle"])) == "none"
    shown = policy_shown(load_config(None, ["harness.name=react", 'policy.backend="litellm:openai/gpt-x?api_key=sk-live-123"']))
    assert "sk-live-123" not in shown and shown.startswith("litellm:openai/gpt-x")


def test_resume_of_a_run_with_a_damaged_config_names_the_file(env):
    """A run's config.toml is read by the one TOML loader: damage is a clear error naming the file, not a traceback."""
    env = {**env, "COLUMNS": "400"}  # the log handler wraps at the terminal's width
    run = Path(env["FORGETUI_HOME"]) / "runs" / "r-damaged"
    run.mkdir(parents=True)
    (run / "config.toml").write_text("[policy\nbackend = ")
    out = subprocess.run([*FORGETUI, "run", "--no-ui", "--resume", "r-damaged"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "config.toml is not valid TOML" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([*FORGETUI, "run", "--no-ui", "--resume", "r-missing"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "no run 'r-missing' to resume" in out.stderr
