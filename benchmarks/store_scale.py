"""How big the record grows for harnesses that resend their whole history, what reading it back costs, and how
fast samples are built from it on busy cores.

    .venv/bin/python benchmarks/store_scale.py [--calls 40 200] [--harnesses claude-code codex gemini-cli openclaw-chat]
        [--rebuild-rollouts 250 --rebuild-calls 40 --rebuild-harness pi]
        [--sample-rollouts 100 --sample-calls 50 --system 50000] [--only bodies rebuild samples]

1. bodies: each harness's real first request (`tests/fixtures/harness-requests/`) grown into a `--calls` history
   the way that harness grows it (`tests/harness_histories.py`: the answer and a ~1.2 KB tool result per call in
   its protocol's shape), sent through a real `forgetui proxy` process (scripted backend: it answers call i with
   the history's answer i, a sentence and a shell tool call, through the token path) on loopback, stopped
   cleanly (SIGINT). Reported: the bodies
   sent, the distinct content (the final body + the recorded answers), the store file, and the ratio (floor
   <= 2x on Claude Code, Codex, Gemini CLI and OpenClaw), and where the file's bytes are (`components`: token
   ids, bodies, DuckDB's catalog, indexes, the small tables' blocks, free blocks; `token_bytes`: the token ids'
   bytes each as stored, and as schema 5's INTEGER[] columns in copies with 32 KB and 16 KB blocks). Every body
   is read back and compared byte for byte.
2. rebuild: one call's body read back (the last call of the longest Claude Code history: Python's `request_of`
   and SQL's `full_request`), and every body of a 10k-call store (`--rebuild-rollouts` x `--rebuild-calls` of
   one harness, written through `Store.record_call`): `SELECT request FROM calls` on the same calls stored whole
   (schema 4's layout, `Store(body_deltas=False)`) against `call_requests` (SQL) and `select_calls` (Python).
3. samples: `samples_for_run` on synthetic rollouts (a `--system`-token system prompt, every call extending
   the last, compact prompts as the recorder stores them), idle and while two busy-loop processes this script
   starts keep both cores busy, against the implementation before (`benchmarks/baselines/samples_before.py`,
   reading a copy of the store with schema 5's INTEGER[] token columns) in the same run. Floor: >= 10,000
   calls/s with both cores busy.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.baselines import samples_before  # noqa: E402
from core.store.bodies import request_of, select_calls  # noqa: E402
from core.store.schema import TOKEN_COLUMNS  # noqa: E402
from core.store.tokens import token_ids_sql  # noqa: E402
from core.store.writer import Store  # noqa: E402
from core.train.samples import samples_for_run  # noqa: E402
from tests.harness_histories import History, bodies  # noqa: E402

FLOOR_RATIO = 2.0
FLOOR_HARNESSES = ("claude-code", "codex", "gemini-cli", "openclaw-chat")
FLOOR_SAMPLES_PER_S = 10_000


# ----------------------------------------------------------------------------- 1. bodies through the proxy
class Proxy:
    """`forgetui proxy` as a subprocess on a free loopback port, recording into `store`."""

    def __init__(self, store: Path, script: Path) -> None:
        exe = Path(sys.executable).with_name("forgetui")
        # a scripted backend runs no model: its context is lifted past the tiny tokenizer's 65,536 for 200-call histories
        cmd = [str(exe), "proxy", "--backend", f"scripted:{script}?context=400000", "--port", "0", "--store", str(store)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.proc.kill()
            raise RuntimeError(f"forgetui proxy did not start (printed {self.url!r})")

    def stop(self) -> None:
        """A clean stop: SIGINT, then the proxy closes (flushes and checkpoints) its store."""
        self.proc.send_signal(signal.SIGINT)
        if self.proc.wait(timeout=120) != 0:
            raise RuntimeError(f"forgetui proxy exited with {self.proc.returncode}")


def through_proxy(harness: str, calls: int, tmp: Path) -> dict[str, Any]:
    """Send one `calls`-call history through a real proxy; the store's size against the distinct content."""
    history = History(harness)
    script = tmp / f"{harness}-{calls}.json"
    script.write_text(json.dumps(history.script(calls)))  # the proxy answers what the history then carries
    store = tmp / f"{harness}-{calls}.duckdb"
    sent: list[bytes] = []
    proxy = Proxy(store, script)
    try:
        with httpx.Client(timeout=300) as client:
            for n in range(calls):
                if n:
                    history.grow()
                body = history.encoded()
                reply = client.post(f"{proxy.url}/r/bench{history.path}", content=body, headers={"content-type": "application/json"})
                if reply.status_code != 200:
                    raise RuntimeError(f"{harness} call {n}: HTTP {reply.status_code}: {reply.text[:300]}")
                sent.append(body)
    finally:
        proxy.stop()
    con = duckdb.connect(str(store), read_only=True)
    try:
        rows = select_calls(con, "SELECT call_id, seq, status, response, {request} FROM calls ORDER BY seq")
        if [r["request"].encode() for r in rows] != sent or any(r["status"] != "ok" for r in rows):
            raise RuntimeError(f"{harness}: the store does not give back every body as sent")
        answers = sum(len(r["response"].encode()) for r in rows)
        forms = dict(con.execute("SELECT request_form, count(*) FROM calls GROUP BY ALL").fetchall())
        (kept,) = con.execute("SELECT coalesce(sum(strlen(request)), 0) + coalesce(sum(strlen(request_new)), 0) FROM calls").fetchone()
    finally:
        con.close()
    wal = Path(f"{store}.wal")
    size = store.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return {"harness": harness, "calls": calls, "sent": sum(map(len, sent)), "final": len(sent[-1]), "answers": answers,
            "store": size, "forms": forms, "path": store, "bodies_kept": kept}


def components(path: Path) -> dict[str, int]:
    """Bytes of a store file by what holds them: DuckDB's header and catalog (metadata blocks), index blocks, free
    blocks, the small tables (a block each), and the calls table's token ids, bodies and other columns (a block's
    unused tail is charged to its last segment)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        _, _, block, total, _, free, *_ = con.execute("PRAGMA database_size").fetchone()
        metadata = {b for (b,) in con.execute("SELECT block_id FROM pragma_metadata_info()").fetchall()}
        segments: dict[int, list[tuple[int, str]]] = {}
        extra: list[tuple[int, str]] = []
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall():
            sql = f"SELECT column_name, block_id, block_offset, additional_block_ids FROM pragma_storage_info('{table}') WHERE persistent AND block_id >= 0"
            for column, block_id, offset, more in con.execute(sql).fetchall():
                part = _part(table, column)
                segments.setdefault(block_id, []).append((offset, part))
                extra += [(b, part) for b in more or []]
    finally:
        con.close()
    out = dict.fromkeys(("token ids", "bodies", "other calls columns", "small tables", "catalog", "indexes", "free"), 0)
    out["catalog"] = 3 * 4096 + len(metadata) * block  # the file's headers, then the metadata blocks
    for segs in segments.values():
        segs.sort()
        for (offset, part), nxt in zip(segs, [*segs[1:], (block, "")], strict=True):
            out[part] += nxt[0] - offset
    for _, part in extra:
        out[part] += block
    out["free"] = free * block
    out["indexes"] = (total - len(metadata) - len(segments) - len(extra) - free) * block
    return out


def token_bytes(path: Path, tmp: Path) -> dict[str, float]:
    """The calls' token ids: how many, and their bytes on disk as stored (token text, zstd) and as schema 5's
    INTEGER[] columns (the same rows copied into files with 32 KB and 16 KB blocks)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        cols = sorted(TOKEN_COLUMNS["calls"])
        (n,) = con.execute("SELECT " + " + ".join(f"coalesce(sum(len({c})), 0)" for c in cols) + " FROM calls").fetchone()
    finally:
        con.close()
    out = {"ids": n, "text": components(path)["token ids"] / max(n, 1)}
    for block in (32768, 16384):
        copy = tmp / f"lists-{block}.duckdb"
        copy.unlink(missing_ok=True)
        con = duckdb.connect(str(copy), config={"default_block_size": str(block)})
        try:
            con.execute(f"ATTACH '{path}' AS src (READ_ONLY)")
            con.execute("CREATE TABLE calls AS SELECT " + ", ".join(f"{token_ids_sql(c)} AS {c}" for c in cols) + " FROM src.calls")
        finally:
            con.close()
        out[f"lists_{block // 1024}k"] = components(copy)["token ids"] / max(n, 1)
    return out


def _part(table: str, column: str) -> str:
    if table != "calls":
        return "small tables"
    if column.endswith("token_ids"):
        return "token ids"
    return "bodies" if column in ("request", "request_new", "response") else "other calls columns"


def empty_store_bytes(tmp: Path) -> int:
    with Store.open(tmp / "empty.duckdb"):
        pass
    return (tmp / "empty.duckdb").stat().st_size


# ----------------------------------------------------------------------------- 2. rebuild cost
def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best seconds of `repeat` runs."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def deep_store(tmp: Path, harness: str, calls: int) -> Path:
    """A store holding one `calls`-call history of `harness`, written through `Store.record_call`."""
    path = tmp / f"deep-{harness}-{calls}.duckdb"
    with Store.open(path) as store:
        for seq, body in enumerate(bodies(harness, calls)):
            store.record_call({"call_id": f"c{seq}", "rollout_id": "r", "seq": seq, "api": History(harness).api, "request": body, "status": "ok"})
    return path


def one_call(store: Path) -> dict[str, float]:
    """ms to read the last call's body back, Python and SQL."""
    con = duckdb.connect(str(store), read_only=True)
    try:
        (last,) = con.execute("SELECT call_id FROM calls ORDER BY seq DESC LIMIT 1").fetchone()
        python = timed(lambda: request_of(con, last), 5)
        sql = timed(lambda: con.execute(f"SELECT request FROM full_request('{last}')").fetchall(), 3)
    finally:
        con.close()
    return {"python_ms": python * 1000, "sql_ms": sql * 1000}


def many_calls(tmp: Path, harness: str, rollouts: int, calls: int) -> dict[str, Any]:
    """Every body of a rollouts x calls store: whole layout against deltas (SQL and Python)."""
    texts = bodies(harness, calls)
    api = History(harness).api
    out: dict[str, Any] = {"calls": rollouts * calls, "bodies_mb": rollouts * sum(map(len, texts)) / 1e6}
    for layout, deltas in (("whole", False), ("delta", True)):
        path = tmp / f"rebuild-{layout}.duckdb"
        with Store.open(path, body_deltas=deltas) as store:
            for r in range(rollouts):
                for seq, body in enumerate(texts):
                    store.record_call({"call_id": f"r{r}-{seq}", "rollout_id": f"r{r}", "seq": seq, "api": api, "request": body, "status": "ok"})
                store.flush() if r % 20 == 19 else None
        out[f"{layout}_mb"] = path.stat().st_size / 1e6
        con = duckdb.connect(str(path), read_only=True)
        try:
            if deltas:
                out["sql_s"] = timed(lambda con=con: con.execute("SELECT call_id, request FROM call_requests").fetchall(), 2)
                out["python_s"] = timed(lambda con=con: select_calls(con, "SELECT call_id, {request} FROM calls"), 2)
                got = select_calls(con, f"SELECT call_id, {{request}} FROM calls WHERE rollout_id = 'r{rollouts - 1}'")
                if sorted(r["request"].encode() for r in got) != sorted(texts):
                    raise RuntimeError("the delta store does not give back the bodies as written")
            else:
                out["whole_s"] = timed(lambda con=con: con.execute("SELECT call_id, request FROM calls").fetchall(), 2)
                (cid,) = con.execute(f"SELECT call_id FROM calls WHERE seq = {calls - 1} LIMIT 1").fetchone()
                out["whole_one_ms"] = timed(lambda con=con, cid=cid: con.execute("SELECT request FROM calls WHERE call_id = ?", [cid]).fetchall(), 5) * 1000
        finally:
            con.close()
    return out


# ----------------------------------------------------------------------------- 3. samples on busy cores
def synthetic(rng: random.Random, rollout_id: str, n_calls: int, system: list[int]) -> list[dict[str, Any]]:
    """One rollout's call rows as the recorder stores them: the first prompt whole, then parent + new ids."""
    rows, prompt, parent = [], [*system, *(rng.randrange(5, 50_000) for _ in range(60))], None
    for seq in range(n_calls):
        completion = [rng.randrange(5, 50_000) for _ in range(rng.randrange(20, 80))]
        row: dict[str, Any] = {"call_id": f"{rollout_id}-{seq}", "rollout_id": rollout_id, "seq": seq, "status": "ok", "attempt": 0,
                               "completion_token_ids": completion, "completion_logprobs": [-rng.random() for _ in completion],
                               "weights_version": 0, "extends_parent": seq > 0, "branch": 0}
        if parent is None:
            row["prompt_token_ids"] = prompt
        else:
            new = [rng.randrange(5, 50_000) for _ in range(rng.randrange(20, 120))]
            row |= {"prompt_new_token_ids": new, "parent_call_id": parent[0], "prefix_tokens": len(parent[1])}
            prompt = parent[1] + new
        rows.append(row)
        parent = (row["call_id"], prompt + completion)
    return rows


def _spin() -> None:
    while True:
        pass


def old_layout(path: Path, into: Path) -> None:
    """A copy of a store's `rollouts` and `calls` with the token columns as INTEGER[] lists (schema 5's layout, what
    the code before this change reads)."""
    con = duckdb.connect(str(into))
    try:
        con.execute(f"ATTACH '{path}' AS src (READ_ONLY)")
        lists = ", ".join(f"{token_ids_sql(c)} AS {c}" for c in TOKEN_COLUMNS["calls"])
        con.execute("CREATE TABLE rollouts AS SELECT * FROM src.rollouts")
        con.execute(f"CREATE TABLE calls AS SELECT * REPLACE ({lists}) FROM src.calls")
    finally:
        con.close()


def samples(tmp: Path, rollouts: int, calls: int, system_tokens: int) -> dict[str, float]:
    rng = random.Random(0)
    system = [rng.randrange(5, 50_000) for _ in range(system_tokens)]
    path = tmp / "samples.duckdb"
    with Store.open(path) as store:
        store.insert_run("bench", {})
        for i in range(rollouts):
            store.upsert_rollout({"rollout_id": f"r{i:03d}", "run_id": "bench", "task_id": "t", "step": 0, "status": "done", "reward": 1.0, "attempt": 0})
            for row in synthetic(rng, f"r{i:03d}", calls, system):
                store.record_call(row)
    old_layout(path, tmp / "samples-lists.duckdb")
    cur, before = duckdb.connect(str(path), read_only=True), duckdb.connect(str(tmp / "samples-lists.duckdb"), read_only=True)
    try:
        new, old = samples_for_run(cur, "bench"), samples_before.samples_for_run(before, "bench")
        if [(s.sample_id, np.asarray(s.token_ids).tolist(), np.asarray(s.loss_mask).tolist()) for s in new] != [
            (s.sample_id, s.token_ids, s.loss_mask) for s in old
        ]:
            raise RuntimeError("samples_for_run builds other samples than before")
        n = rollouts * calls
        out = {"idle_new": n / timed(lambda: samples_for_run(cur, "bench")), "idle_old": n / timed(lambda: samples_before.samples_for_run(before, "bench"))}
        spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(2)]
        for p in spinners:
            p.start()
        try:
            time.sleep(1.0)
            out["busy_new"] = n / timed(lambda: samples_for_run(cur, "bench"), 5)
            out["busy_old"] = n / timed(lambda: samples_before.samples_for_run(before, "bench"), 5)
        finally:
            for p in spinners:
                p.terminate()
                p.join()
    finally:
        cur.close()
        before.close()
    return out


# ----------------------------------------------------------------------------- report
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[40, 200])
    parser.add_argument("--harnesses", nargs="+", default=list(FLOOR_HARNESSES))
    parser.add_argument("--rebuild-rollouts", type=int, default=250)
    parser.add_argument("--rebuild-calls", type=int, default=40)
    parser.add_argument("--rebuild-harness", default="pi")
    parser.add_argument("--sample-rollouts", type=int, default=100)
    parser.add_argument("--sample-calls", type=int, default=50)
    parser.add_argument("--system", type=int, default=50_000)
    parser.add_argument("--only", nargs="+", choices=["bodies", "rebuild", "samples"], default=["bodies", "rebuild", "samples"])
    args = parser.parse_args()
    ok = True
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        longest: Path | None = None
        if "bodies" in args.only:
            empty = empty_store_bytes(tmp)
            print(f"\n1. bodies through `forgetui proxy` (scripted backend); an empty store file is {empty / 1e3:.0f} KB")
            print("   ratio: store file / distinct; growth: (store file - empty store) / distinct; text: the bodies' text the store")
            print("   keeps (whole ones + delta parts) + the answers, / distinct (before DuckDB's compression; token ids not counted)")
            print(f"{'harness':15s} {'calls':>5s} {'sent':>9s} {'final':>8s} {'answers':>8s} {'distinct':>9s} {'store':>8s} {'ratio':>6s} {'growth':>6s} {'text':>6s}  stored as")
            for calls in args.calls:
                for harness in args.harnesses:
                    r = through_proxy(harness, calls, tmp)
                    distinct = r["final"] + r["answers"]
                    ratio = r["store"] / distinct
                    floor = harness in FLOOR_HARNESSES
                    ok = ok and (ratio <= FLOOR_RATIO or not floor)
                    forms = ", ".join(f"{k} {v}" for k, v in sorted(r["forms"].items()))
                    growth, text = (r["store"] - empty) / distinct, (r["bodies_kept"] + r["answers"]) / distinct
                    print(f"{harness:15s} {calls:5d} {r['sent'] / 1e6:7.2f}MB {r['final'] / 1e3:6.1f}KB {r['answers'] / 1e3:6.1f}KB "
                          f"{distinct / 1e3:7.1f}KB {r['store'] / 1e3:6.0f}KB {ratio:5.2f}x {growth:5.2f}x {text:5.2f}x  {forms}{'' if floor else ' (no floor)'}")
                    parts, tok = components(r["path"]), token_bytes(r["path"], tmp)
                    print(" " * 16 + "in the file: " + ", ".join(f"{k} {v / 1e3:.0f} KB" for k, v in parts.items()))
                    print(" " * 16 + f"token ids: {tok['ids']:,}, {tok['text']:.2f} B each as token text; as INTEGER[] (schema 5) "
                          f"{tok['lists_32k']:.2f} B with 32 KB blocks, {tok['lists_16k']:.2f} B with 16 KB blocks")
                    if harness == "claude-code" and calls == max(args.calls):
                        longest = r["path"]
        if "rebuild" in args.only:
            print("\n2. rebuild cost")
            deepest = max(args.calls)
            one = one_call(longest if longest is not None else deep_store(tmp, "claude-code", deepest))
            print(f"one body back (claude-code, call {deepest} of {deepest}): "
                  f"request_of {one['python_ms']:.1f} ms, full_request (SQL) {one['sql_ms']:.0f} ms")
            m = many_calls(tmp, args.rebuild_harness, args.rebuild_rollouts, args.rebuild_calls)
            print(f"{m['calls']:,} calls ({args.rebuild_rollouts} x {args.rebuild_calls} {args.rebuild_harness}, {m['bodies_mb']:.0f} MB of bodies): "
                  f"store whole {m['whole_mb']:.1f} MB, as deltas {m['delta_mb']:.1f} MB")
            print(f"  every body: SELECT request FROM calls (whole) {m['whole_s']:.2f} s; call_requests (SQL) {m['sql_s']:.2f} s "
                  f"({m['sql_s'] / m['whole_s']:.1f}x); select_calls (Python) {m['python_s']:.2f} s ({m['python_s'] / m['whole_s']:.1f}x)")
            print(f"  one body from the whole layout: {m['whole_one_ms']:.1f} ms")
        if "samples" in args.only:
            s = samples(tmp, args.sample_rollouts, args.sample_calls, args.system)
            n = args.sample_rollouts * args.sample_calls
            print(f"\n3. samples_for_run, {n:,} calls ({args.sample_rollouts} rollouts x {args.sample_calls}, {args.system:,}-token system prompt)")
            print(f"idle:              {s['idle_new']:8,.0f} calls/s   before: {s['idle_old']:8,.0f} calls/s   {s['idle_new'] / s['idle_old']:.1f}x")
            print(f"both cores busy:   {s['busy_new']:8,.0f} calls/s   before: {s['busy_old']:8,.0f} calls/s   {s['busy_new'] / s['busy_old']:.1f}x"
                  f"   (floor >= {FLOOR_SAMPLES_PER_S:,})")
            ok = ok and s["busy_new"] >= FLOOR_SAMPLES_PER_S
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
