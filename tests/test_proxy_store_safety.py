"""The store never loses a row (dead letters as bytes), keeps its files owner-only, and never stores a key."""

from __future__ import annotations

import json
import stat
import sys
import uuid

import pytest

from core.store.writer import Store


def deep(n: int) -> dict:
    d: dict = {"leaf": 1}
    for _ in range(n):
        d = {"a": d}
    return d


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "s.duckdb")
    yield s
    s.close()


def call_row(**extra) -> dict:
    return {"call_id": "call-" + uuid.uuid4().hex, "rollout_id": "r", "seq": 0, "status": "ok", **extra}


def test_a_row_too_deep_for_json_is_kept_as_bytes(store):
    row = call_row(response=deep(300))
    store.record_call(row)
    store.record_call(call_row(response={"fine": True}))
    assert store.problem_counts() == {"store_errors": 0, "dead_letters": 1}
    cur = store.cursor()
    assert cur.execute("SELECT count(*) FROM calls").fetchone() == (1,)  # the healthy row is unharmed
    table, key, raw, error = cur.execute("SELECT table_name, row_key, raw, error FROM dead_letters").fetchone()
    assert (table, key) == ("calls", row["call_id"]) and "Recursion" in error
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 5000))
    try:
        kept = json.loads(raw)
    finally:
        sys.setrecursionlimit(limit)
    assert kept["call_id"] == row["call_id"] and kept["response"] == row["response"]


def test_a_row_with_a_bad_value_goes_to_store_errors_as_json(store):
    row = call_row(seq="not a number")
    store.record_call(row)
    assert store.problem_counts() == {"store_errors": 1, "dead_letters": 0}
    (kept,) = store.cursor().execute("SELECT row ->> 'call_id' FROM store_errors").fetchone()
    assert kept == row["call_id"]


def test_store_files_are_owner_only(tmp_path):
    path = tmp_path / "s.duckdb"
    store = Store.open(path)
    try:
        store.record_call(call_row(response={"secret": "prompt"}))
        store.flush()
        wal = tmp_path / "s.duckdb.wal"
        assert mode(path) == 0o600 and mode(wal) == 0o600
        store.cursor().execute("CHECKPOINT")  # the log goes away; the next write makes a new one
        assert not wal.exists()
        store.record_call(call_row())
        store.flush()
        assert wal.exists() and mode(wal) == 0o600
    finally:
        store.close()
    assert mode(path) == 0o600
    again = Store.open(path)  # reopened: still owner-only, even for a file someone widened
    try:
        path.chmod(0o644)
        again.close()
        again = Store.open(path)
        assert mode(path) == 0o600
    finally:
        again.close()


def test_runs_config_never_holds_a_key(store):
    config = {"policy": {"backend": "litellm:openai/gpt-4o?api_base=http://user:pw@127.0.0.1:9/v1&api_key=sk-live-123&token_ids=1", "api_key": "sk-other"}}
    store.insert_run("run-1", config)
    store.flush()
    (text,) = store.cursor().execute("SELECT config::VARCHAR FROM runs").fetchone()
    assert "sk-live-123" not in text and "sk-other" not in text and ":pw@" not in text
    stored = json.loads(text)
    assert stored["policy"]["backend"] == "litellm:openai/gpt-4o?api_base=http://user:***@127.0.0.1:9/v1&api_key=***&token_ids=1"


def test_the_config_file_beside_a_run_holds_no_key_and_a_redacted_key_is_refused():
    from core.backends.spec import PolicySpec
    from core.config import RunConfig, dump_toml
    from core.errors import ConfigError
    from core.proxy.factory import make_policy

    config = RunConfig()
    config.policy.backend = "litellm:openai/gpt-4o?api_key=sk-live-123&api_base=http://127.0.0.1:9/v1"
    text = dump_toml(config)
    assert "sk-live-123" not in text and 'backend = "litellm:openai/gpt-4o?api_key=***&api_base=http://127.0.0.1:9/v1"' in text
    with pytest.raises(ConfigError, match="api_key_env=NAME"):  # a resumed run says how to give the key back
        make_policy(PolicySpec.parse("litellm:openai/gpt-4o?api_key=***&api_base=http://127.0.0.1:9/v1"))


def test_forgetui_sql_warns_when_the_store_kept_rows_it_could_not_store(tmp_path):
    import os
    import subprocess

    path = tmp_path / "s.duckdb"
    with Store.open(path) as s:
        s.record_call(call_row(response=deep(300)))
        s.flush()
    env = {**os.environ, "FORGETUI_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "forgetui.cli", "sql", "SELECT count(*) AS n FROM calls", "--store", str(path), "--format", "json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"n": 0}]
    assert "1 row(s) in dead_letters" in " ".join(out.stderr.split())
