"""`forgetui proxy` shows no key and no host path to anyone, stores none, logs none."""

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
KEY = "sk-inline-secret-4242"


@pytest.fixture
def env(tmp_path: Path) -> dict:
    return {**os.environ, "FORGETUI_HOME": str(tmp_path / "home")}


def serve(spec: str, store: Path, env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*FORGETUI, "proxy", "--backend", spec, "--store", str(store), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = proc.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
    return proc, url


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def test_a_keyed_spec_is_shown_and_stored_without_its_key(tmp_path, env):
    store = tmp_path / "s.duckdb"
    proc, url = serve(f"litellm:openai/gpt-4o?api_base=http://127.0.0.1:9/v1&api_key={KEY}", store, env)
    try:
        models = httpx.get(f"{url}/r/anyone/v1/models", timeout=30)
        assert models.status_code == 200 and KEY not in models.text
        assert [m["id"] for m in models.json()["data"]] == ["openai/gpt-4o"]
    finally:
        err = stop(proc)
    assert KEY not in err and "api_key_env" in err  # the inline key is discouraged, never echoed
    out = subprocess.run([*FORGETUI, "sql", "SELECT config FROM runs", "--store", str(store), "--format", "json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    config = row["config"] if isinstance(row["config"], dict) else json.loads(row["config"])
    assert KEY not in json.dumps(config) and config["backend"].endswith("api_key=***")
    assert oct(store.stat().st_mode & 0o777) == oct(0o600)


def test_a_scripted_backend_shows_no_host_path(tmp_path, env):
    script = tmp_path / "private-dir" / "teacher.json"
    script.parent.mkdir()
    script.write_text(json.dumps({"turns": [{"text": "ok"}]}))
    proc, url = serve(f"scripted:{script}", tmp_path / "s.duckdb", env)
    try:
        models = httpx.get(f"{url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["teacher.json"] and "private-dir" not in json.dumps(models)
    finally:
        stop(proc)
