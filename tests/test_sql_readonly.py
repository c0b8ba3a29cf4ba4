"""Read-only SQL reads the store and nothing else: no host files, no URLs, no extensions, no settings changes.

Every hostile query runs three ways: on the writer's live endpoint (with its token), on a closed store through
`run_query` (what `forgetui sql --store` does) and over a run's shards. URLs appear only as query text; the
settings are checked locked before any URL is sent, so nothing is ever fetched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from core.errors import StoreError
from core.store import Store, run_query
from core.store.live import TOKEN_HEADER
from core.store.query import READER_SETTINGS, run_query_shards, sidecar_path

REPO = Path(__file__).resolve().parents[1]
SECRET = "forgetui-test-secret-4f1c"
REFUSED = "disabled by configuration|locked|Permission"


def hostile_queries(tmp: Path, sidecar: Path) -> list[str]:
    """The issue's queries: each reads or writes a host file, or would fetch an extension."""
    secret = tmp / "secret.txt"
    return [
        f"EXPLAIN ANALYZE COPY (SELECT 42) TO '{tmp / 'x.csv'}'",
        f"SELECT * FROM read_text('{secret}')",
        "SELECT * FROM read_text('/etc/passwd')",
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM read_blob('{secret}')",
        f"SELECT * FROM glob('{tmp}/*')",
        "SELECT * FROM glob('/root/*')",
        "SELECT * FROM read_text('/proc/self/environ')",
        f"SELECT * FROM read_json('{sidecar}')",
        f"SELECT * FROM read_parquet('{tmp}/*.parquet')",
        "SET enable_external_access = true",
        "SELECT 1; SET lock_configuration = false",
    ]


def assert_locked(ask) -> None:
    """Every reader setting holds its safe value, as seen by the connection that runs the queries."""
    for name, value in READER_SETTINGS.items():
        assert ask(f"SELECT current_setting('{name}')") == [[value]], name


@pytest.fixture
def populated(tmp_path: Path):
    (tmp_path / "secret.txt").write_text(f"{SECRET}\n")
    store = Store.open(tmp_path / "store.duckdb")
    store.record_call({"call_id": "c1", "rollout_id": "r1", "seq": 0})
    store.flush()
    yield store
    store.close()


def live_post(url: str, token: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(url, json=body, headers={TOKEN_HEADER: token, **headers}, timeout=30)


def test_live_endpoint_reads_only_the_store(populated: Store, tmp_path: Path) -> None:
    url = populated.serve_queries()
    token = populated.query_token
    side = sidecar_path(populated.path)
    ask = lambda sql: live_post(url, token, {"sql": sql}).json()["rows"]  # noqa: E731
    assert ask("SELECT call_id FROM calls") == [["c1"]]
    assert_locked(ask)
    for sql in hostile_queries(tmp_path, side):
        resp = live_post(url, token, {"sql": sql})
        assert resp.status_code == 400, (sql, resp.text)
        body = resp.json()
        assert set(body) == {"error"} and SECRET not in resp.text and token not in resp.text, sql
        assert any(w in body["error"] for w in ("disabled by configuration", "locked", "not allowed", "only read-only")), body
    resp = live_post(url, token, {"sql": "SELECT * FROM read_text('http://127.0.0.1:9/x')"})
    assert resp.status_code == 400 and "disabled by configuration" in resp.json()["error"]
    assert not (tmp_path / "x.csv").exists()
    assert ask("SELECT count(*) FROM calls") == [[1]]  # the writer still writes and reads its own file
    populated.record_call({"call_id": "c2", "rollout_id": "r1", "seq": 1})
    populated.flush()
    assert ask("SELECT count(*) FROM calls") == [[2]]


def test_closed_store_reads_only_the_store(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text(f"{SECRET}\n")
    path = tmp_path / "store.duckdb"
    with Store.open(path) as s:
        s.record_call({"call_id": "c1", "rollout_id": "r1", "seq": 0})
    decoy = tmp_path / "decoy.live.json"  # a sidecar-like file: no live endpoint, so run_query opens the file
    decoy.write_text(json.dumps({"token": SECRET}))
    assert_locked(lambda sql: run_query(path, sql).rows)
    for sql in hostile_queries(tmp_path, decoy):
        with pytest.raises(StoreError, match=f"{REFUSED}|not allowed|only read-only") as err:
            run_query(path, sql)
        assert SECRET not in str(err.value)
    with pytest.raises(StoreError, match="disabled by configuration"):
        run_query(path, "SELECT * FROM read_text('https://127.0.0.1:9/x')")
    assert not (tmp_path / "x.csv").exists()
    assert run_query(path, "SELECT call_id FROM calls").rows == [["c1"]]


def test_shards_read_only_the_shards(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text(f"{SECRET}\n")
    paths = []
    for i in range(2):
        paths.append(tmp_path / f"s{i}" / "store.duckdb")
        with Store.open(paths[-1]) as s:
            s.record_call({"call_id": f"c{i}", "rollout_id": "r1", "seq": i})
    assert run_query_shards(paths, "SELECT call_id FROM calls ORDER BY 1").rows == [["c0"], ["c1"]]
    for sql in hostile_queries(tmp_path, tmp_path / "secret.txt"):
        with pytest.raises(StoreError, match=f"{REFUSED}|not allowed|only read-only"):
            run_query_shards(paths, sql)
    assert_locked(lambda sql: run_query_shards(paths, sql).rows)


def test_cli_sql_refuses_host_files(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text(f"{SECRET}\n")
    path = tmp_path / "store.duckdb"
    with Store.open(path):
        pass
    out = subprocess.run(
        [sys.executable, "-m", "forgetui.cli", "sql", f"SELECT * FROM read_text('{tmp_path / 'secret.txt'}')",
         "--store", str(path)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )
    assert out.returncode != 0 and SECRET not in out.stdout + out.stderr
    assert "disabled by configuration" in out.stderr


def raw_http(url: str, request: bytes) -> bytes:
    """Send raw bytes to a loopback server and read its whole answer (b'' if it closed without one)."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_live_endpoint_answers_bad_requests_in_json(populated: Store) -> None:
    url = populated.serve_queries()
    token = populated.query_token
    body = b'{"sql": "SELECT 1"}'
    answer = raw_http(url, b"POST / HTTP/1.1\r\nHost: x\r\nX-Forgetui-Token: t\xe9\xff\r\nConnection: close\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b"missing or wrong" in answer
    for bad, needle in [({"sql": 5}, '"sql" must be a string'), ({"sql": "SELECT 1", "max_rows": -1}, "positive"),
                        ({"sql": "SELECT 1", "max_rows": 0}, "positive"), ({"sql": "SELECT 1", "max_rows": "9"}, "positive"),
                        ([1], '"sql" must be a string'), ({}, '"sql" must be a string')]:
        resp = live_post(url, token, bad)
        assert resp.status_code == 400 and needle in resp.json()["error"], (bad, resp.text)
        assert "Traceback" not in resp.text
    resp = httpx.post(url, content=b"{not json", headers={TOKEN_HEADER: token})
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]
    assert live_post(url, token, {"sql": "SELECT 1", "max_rows": 1}).json()["rows"] == [[1]]


def test_get_tells_nothing_without_the_token(populated: Store) -> None:
    url = populated.serve_queries()
    anon = httpx.get(url)
    assert anon.status_code == 401
    assert str(populated.path) not in anon.text and str(os.getpid()) not in anon.text
    mine = httpx.get(url, headers={TOKEN_HEADER: populated.query_token})
    assert mine.status_code == 200 and mine.json() == {"store": str(populated.path), "pid": os.getpid()}


def test_the_one_live_server_refuses_the_same_over_http(populated: Store) -> None:
    """The Starlette `query_app` (used only by tests) is gone: its cases run against the one live server."""
    url = populated.serve_queries()
    token = populated.query_token
    assert httpx.post(url, json={"sql": "SELECT 1"}, headers={TOKEN_HEADER: "t\u00e9".encode("latin-1")}).status_code == 401
    assert live_post(url, token, {"sql": 5}).status_code == 400
    resp = live_post(url, token, {"sql": "SELECT * FROM read_text('/etc/passwd')"})
    assert resp.status_code == 400 and "disabled by configuration" in resp.json()["error"]
