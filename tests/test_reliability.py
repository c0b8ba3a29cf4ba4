"""Issue 44 items 2, 6, 7: a wrong store path is refused untouched, a scripted lone surrogate is refused at load,
`forgetui sql` warns on a store from a newer forgetui."""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path

import duckdb
import pytest

from core.backends.scripted import ScriptedBackend, load_script
from core.errors import ConfigError, StoreError
from core.store.schema import SCHEMA_VERSION
from core.store.writer import Store
from forgetui.cli import main


def _snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("content", [b'{"notes": [1, 2, 3]}\n', b"", b"x" * 5000], ids=["json", "empty", "text"])
def test_an_existing_file_that_is_not_duckdb_is_refused_untouched(tmp_path, content):
    notes = tmp_path / "notes.json"
    notes.write_bytes(content)
    os.chmod(notes, 0o644)
    before = _snapshot(notes)
    with pytest.raises(StoreError, match="refusing to use it as a store"):
        Store.open(notes)
    assert _snapshot(notes) == before  # same bytes, same mode (was chmod-ed to 0600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]  # no stray .wal


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(StoreError, match="not a file"):
        Store.open(tmp_path)


def test_a_duckdb_file_of_something_else_is_refused_and_keeps_its_mode(tmp_path):
    other = tmp_path / "analytics.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE sales (id INTEGER)")
    con.close()
    os.chmod(other, 0o644)
    with pytest.raises(StoreError, match="not a forgetui store"):
        Store.open(other)
    assert stat.S_IMODE(other.stat().st_mode) == 0o644
    con = duckdb.connect(str(other), read_only=True)
    assert {t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()} == {"sales"}
    con.close()


def test_a_store_of_ours_still_opens_and_a_new_one_is_owner_only(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.insert_run("r1", {"a": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with Store.open(path) as store:
        assert store.cursor().execute("SELECT count(*) FROM runs").fetchone() == (1,)


def test_proxy_cli_on_a_json_store_is_a_message(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"text": "hi"}]}))
    notes = tmp_path / "notes.json"
    notes.write_text('{"keep": "me"}')
    before = _snapshot(notes)
    caplog.set_level(logging.ERROR)
    assert main(["proxy", "--backend", f"scripted:{script}", "--store", str(notes), "--port", "0"]) == 2
    assert "not a DuckDB database" in caplog.text
    assert _snapshot(notes) == before
    assert not Path(f"{notes}.wal").exists()


def test_sql_on_a_file_that_is_not_a_store_is_a_clear_message(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    notes = tmp_path / "notes.json"
    notes.write_text('{"keep": "me"}')
    caplog.set_level(logging.ERROR)
    assert main(["sql", "SELECT 1", "--store", str(notes)]) == 2
    assert "exists and is not a DuckDB database" in caplog.text


# -- item 6: a scripted turn with a lone surrogate ------------------------------------------------------------


@pytest.mark.parametrize(
    "turns",
    [
        [{"text": "bad \ud800 char"}],
        [{"text": "ok"}, {"think": "\udfff"}],
        [{"tool": "shell", "args": {"command": "echo \ud83d"}}],
    ],
)
def test_a_script_with_a_lone_surrogate_is_refused_at_load(tmp_path, turns):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": turns}))  # json.dumps writes \ud800 as an escape: loads back as a lone surrogate
    with pytest.raises(ConfigError, match="lone UTF-16 surrogate"):
        load_script(script)
    with pytest.raises(ConfigError, match="lone UTF-16 surrogate"):
        ScriptedBackend(script)


def test_a_script_with_a_lone_surrogate_in_a_task_entry_is_refused(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"text": "ok"}], "tasks": [{"match": "x", "turns": [{"text": "\ud800"}]}]}))
    with pytest.raises(ConfigError, match="tasks\\[0\\], turn 0"):
        ScriptedBackend(script)


def test_a_valid_surrogate_pair_still_loads(tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"turns": [{"text": "emoji \U0001f600"}]}))  # written as the pair \ud83d\ude00
    turns, _ = load_script(script)
    assert turns[0]["text"] == "emoji \U0001f600"


# -- item 7: forgetui sql on a store from a newer schema -----------------------------------------------------


def _future_store(path: Path) -> None:
    with Store.open(path) as store:
        store.insert_run("r1", {"a": 1})
    con = duckdb.connect(str(path))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()


def test_sql_on_a_future_store_warns(tmp_path, caplog, capsys, monkeypatch):
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    path = tmp_path / "future.duckdb"
    _future_store(path)
    with pytest.raises(StoreError, match="newer than this forgetui"):
        Store.open(path)  # the writer refuses it
    caplog.set_level(logging.WARNING)
    assert main(["sql", "SELECT run_id FROM runs", "--store", str(path), "--format", "csv"]) == 0
    assert "r1" in capsys.readouterr().out
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this forgetui ({SCHEMA_VERSION})" in caplog.text


def test_sql_on_a_current_store_does_not_warn(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    path = tmp_path / "now.duckdb"
    with Store.open(path) as store:
        store.insert_run("r1", {"a": 1})
    caplog.set_level(logging.WARNING)
    assert main(["sql", "SELECT run_id FROM runs", "--store", str(path)]) == 0
    assert "newer than this forgetui" not in caplog.text


# -- item 1 at the store's level: held rows are retried, and spilled (not lost) if the disk never has room again --------


def _fill(store: Store, n: int, size: int = 120_000) -> None:
    for i in range(n):
        store.record_call({"call_id": f"c{i}", "rollout_id": "r", "seq": i, "status": "ok", "request": json.dumps({"t": os.urandom(size // 2).hex()})})


def test_held_rows_are_written_when_space_returns(tmp_path):
    from tests.adversarial import resize_tmpfs, small_tmpfs

    with small_tmpfs(tmp_path / "disk", "3m") as disk:
        store = Store.open(disk / "s.duckdb", hold_bytes=1 << 30)
        try:
            _fill(store, 40)
            store.flush()
            health = store.health()
            assert health["state"] == "degraded" and health["held_rows"] > 0, health
            assert store.refusing() is None  # under the bound: calls still run
            resize_tmpfs(disk, "64m")
            for _ in range(100):
                if store.health()["state"] == "ok":
                    break
                threading.Event().wait(0.1)
            assert store.health() == {"state": "ok", "held_rows": 0, "held_bytes": 0}
            assert store.cursor().execute("SELECT count(*) FROM calls").fetchone() == (40,)
            assert store.cursor().execute("SELECT sum(rows) FROM store_problems").fetchone() == (0,)
        finally:
            store.close()


def test_rows_still_held_at_close_are_spilled_under_forgetui_home(tmp_path, monkeypatch):
    from tests.adversarial import small_tmpfs

    monkeypatch.setenv("FORGETUI_HOME", str(tmp_path / "home"))
    with small_tmpfs(tmp_path / "disk", "3m") as disk:
        store = Store.open(disk / "s.duckdb", hold_bytes=1 << 20)
        _fill(store, 40)
        store.flush()
        held = store.health()["held_rows"]
        assert held > 0 and store.refusing() is not None
        store.close()
        (spilled,) = (tmp_path / "home" / "held").iterdir()
        rows = [json.loads(line) for line in spilled.read_bytes().splitlines()]
        assert len(rows) == held and {r["row"]["call_id"] for r in rows} <= {f"c{i}" for i in range(40)}


# -- item 3: connections without the token never keep the token holder out ----------------------------------------


def _slow_sockets(url: str, n: int) -> list:
    import socket

    host, port = url.removeprefix("http://").rstrip("/").split(":")
    held = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")  # headers never finished, no token
        held.append(sock)
    return held


def test_slow_header_clients_cannot_keep_the_token_holder_out(tmp_path):
    import time

    from core.store.live import HEADER_TIMEOUT_S, MAX_CONNECTIONS, MAX_PENDING
    from core.store.query import run_query

    path = tmp_path / "live.duckdb"
    store = Store.open(path)
    held: list = []
    try:
        store.insert_run("r1", {"a": 1})
        store.flush()
        url = store.serve_queries()
        held = _slow_sockets(url, max(70, MAX_CONNECTIONS + MAX_PENDING + 6))
        started = time.monotonic()
        for _ in range(5):  # the token holder's reads, as `forgetui sql` sends them, while every slow socket is open
            assert run_query(path, "SELECT run_id FROM runs").rows == [["r1"]]
        assert time.monotonic() - started < HEADER_TIMEOUT_S  # answered at once, not after the slow ones were cut
        # the slow ones are cut within the header deadline (the oldest even sooner, for the newer ones)
        for sock in held:
            sock.settimeout(HEADER_TIMEOUT_S + 3)
            try:
                data = sock.recv(4096)
            except ConnectionResetError:
                data = b""
            assert data.startswith((b"HTTP/1.1 408 ", b"HTTP/1.1 503 ")), data[:100]  # a JSON answer, then closed
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 3
    finally:
        for sock in held:
            sock.close()
        store.close()
