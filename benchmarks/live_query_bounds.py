"""What a live query costs the writer: through the bounded endpoint against planning it straight on the writer's connection.

A writer (a `Store` holding 2,000 calls, serving live queries) runs in a child process under a memory
cap (RLIMIT_AS 8 GB, killed past 3 GB resident). The script sends it queries two ways:
- `endpoint`: POST to its live endpoint (rehearsed in a child first, then run bounded);
- `direct`: executed on a cursor of the writer's own connection, as the endpoint did before
  (only the moderate sizes: the big ones would take the machine).
For each it prints the answer, the seconds and how much the writer's resident memory grew (peak
during the query, and what stayed after), then the endpoint's latency on an ordinary query against
the direct path (p50 over 50 runs; the ratio is the rehearsal's cost).

    .venv/bin/python benchmarks/live_query_bounds.py
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.adversarial import rss_mb  # noqa: E402 - the cap's own measure, shared with the adversarial suite

WATCH_MB = 3000


def cte_bomb(levels: int) -> str:
    parts = ["a0 AS (SELECT 1 AS x)"] + [f"a{i} AS NOT MATERIALIZED (SELECT * FROM a{i - 1} UNION ALL SELECT * FROM a{i - 1})" for i in range(1, levels + 1)]
    return "WITH " + ", ".join(parts) + f" SELECT count(*) FROM a{levels}"


QUERIES = [  # (name, sql, also run direct)
    ("union all × 3,000", "SELECT 1" + " UNION ALL SELECT 1" * 3000, True),
    ("union all × 8,000", "SELECT 1" + " UNION ALL SELECT 1" * 8000, False),
    ("union all × 30,000", "SELECT 1" + " UNION ALL SELECT 1" * 30000, False),
    ("NOT MATERIALIZED CTEs × 12", cte_bomb(12), True),
    ("NOT MATERIALIZED CTEs × 20", cte_bomb(20), False),
    ("repeat('x', 4e6) × range(2048)", "SELECT repeat('x', 4000000) FROM range(2048)", False),
    ("string_agg over range(1e9)", "SELECT length(string_agg('xxxxxxxxxx', '')) FROM range(1000000000)", False),
    ("count(*) of calls", "SELECT count(*) FROM calls", True),
]


def serve() -> None:
    """The writer: a store with calls, serving live queries; runs `direct` SQL sent on stdin on its own connection."""
    from core.store.writer import Store

    store = Store.open(Path(sys.argv[2]))
    for i in range(2000):
        store.record_call({"call_id": f"c{i}", "rollout_id": f"r{i % 20}", "seq": i, "request": {"messages": [{"role": "user", "content": "x" * 500}]}})
    store.flush()
    url = store.serve_queries()
    print(json.dumps({"url": url, "token": store.query_token}), flush=True)
    for line in sys.stdin:
        sql = json.loads(line)
        started = time.perf_counter()
        cur = store.cursor()
        try:
            rows = cur.execute(sql).fetchmany(5)
            answer = f"200 {str(rows)[:40]}"
        except Exception as exc:  # noqa: BLE001 - reported
            answer = f"error {str(exc)[:40]}"
        finally:
            cur.close()
        print(json.dumps({"answer": answer, "s": time.perf_counter() - started}), flush=True)
    store.close()


class Writer:
    def __init__(self, path: Path) -> None:
        cap = 8 << 30
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)),  # noqa: PLW1509 - setrlimit only
        )  # fmt: skip
        info = json.loads(self.proc.stdout.readline())
        self.url, self.token = info["url"], info["token"]
        self.peak = 0
        self.killed = False
        self.http = httpx.Client(trust_env=False)  # one client, as forgetui sql and the TUI hold one
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            rss = rss_mb(self.proc.pid)
            self.peak = max(self.peak, rss)
            if rss > WATCH_MB:
                self.killed = True
                self.proc.kill()
            time.sleep(0.01)

    def endpoint(self, sql: str) -> tuple[str, float]:
        started = time.perf_counter()
        resp = self.http.post(self.url, json={"sql": sql}, headers={"X-Forgetui-Token": self.token}, timeout=600)
        body = resp.json()
        shown = str(body.get("rows"))[:40] if resp.status_code == 200 else str(body.get("error"))[:60]
        return f"{resp.status_code} {shown}", time.perf_counter() - started

    def direct(self, sql: str) -> tuple[str, float]:
        self.proc.stdin.write(json.dumps(sql) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return "the writer died", 0.0
        out = json.loads(line)
        return out["answer"], out["s"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)


def measure(writer: Writer, how: str, sql: str) -> str:
    base = rss_mb(writer.proc.pid)
    writer.peak = base
    answer, seconds = (writer.endpoint if how == "endpoint" else writer.direct)(sql)
    time.sleep(0.2)
    after = rss_mb(writer.proc.pid)
    if writer.killed:
        answer = f"killed past {WATCH_MB} MB resident"
    return f"{how:8s} {seconds:7.2f} s  peak +{writer.peak - base:5d} MB  kept +{after - base:5d} MB  {answer}"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        writer = Writer(Path(tmp) / "store.duckdb")
        try:
            print(f"writer resident at start: {rss_mb(writer.proc.pid)} MB")
            for name, sql, direct in QUERIES:
                print(f"\n{name} ({len(sql):,} bytes of SQL)")
                print("  " + measure(writer, "endpoint", sql))
                if direct:
                    print("  " + measure(writer, "direct", sql))
            ordinary = "SELECT rollout_id, count(*) FROM calls GROUP BY rollout_id ORDER BY 1"
            for _ in range(5):
                writer.endpoint(ordinary)
            through = [writer.endpoint(ordinary)[1] for _ in range(50)]
            straight = [writer.direct(ordinary)[1] for _ in range(50)]
            p50, base = statistics.median(through), statistics.median(straight)
            print(f"\nan ordinary query: endpoint p50 {p50 * 1000:.1f} ms (HTTP + rehearsal + run), direct p50 {base * 1000:.1f} ms (run only): {p50 / base:.1f}×")
            print(f"writer resident at the end: {rss_mb(writer.proc.pid)} MB; alive: {writer.proc.poll() is None}")
        finally:
            writer.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve()
    else:
        os.environ.setdefault("FORGETUI_HOME", str(REPO / ".test-home"))
        main()
