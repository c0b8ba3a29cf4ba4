"""The harness matrix: every real harness on the toy `hello` task in Docker, against the recording proxy.

    .venv/bin/python benchmarks/harness_matrix.py [--harness codex,claude-code,...] [--samples 2] [--markdown]

Per harness: host install size and time (npm/pip into a fresh FORGETUI_HOME; npm's and pip's own
download caches may be warm), image build time cold (image removed, host tree cached) and warm,
time from sandbox start to the first model call, calls per rollout, mean prompt tokens per call,
the prefix-merge rate (share of calls after the first whose prompt extends the previous call token
for token) and the wire protocol. The policy is the scripted backend calling the harness's own shell
tool (`echo hi > hello.txt`) and then answering, so every harness does the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HARNESSES = ["react", "codex", "claude-code", "mini-swe-agent", "gemini-cli", "opencode", "pi", "openclaw"]
BASE = "forgetui/base:bookworm"
HELLO = [{"tool": "shell", "command": "echo hi > hello.txt"}]
DONE = {"text": "I created hello.txt containing hi."}
SCRIPTS = {"mini-swe-agent": [*HELLO, {"tool": "shell", "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]}


def du_mb(paths: list[Path]) -> float:
    if not paths:
        return 0.0
    out = subprocess.run(["du", "-sbc", *map(str, paths)], capture_output=True, text=True).stdout.splitlines()
    return int(out[-1].split()[0]) / 1e6 if out else 0.0


def measure(name: str, samples: int) -> dict:
    import docker
    import duckdb

    from core.config import load_config
    from core.registry import load_env, load_harness
    from core.run import execute_run
    from core.runtime.images import ensure_image, image_tag

    client = docker.from_env()
    harness = load_harness(name)
    t = time.perf_counter()
    layer = harness.image_layer()
    install_s = time.perf_counter() - t
    layers = [x for x in (load_env("toy").image_layer(), layer) if x is not None]
    size_mb = du_mb([d.path for d in layer.dirs.values()]) if layer is not None else 0.0
    size_mb += sum(len(v) for v in layer.files.values()) / 1e6 if layer is not None else 0.0
    tag = image_tag(BASE, layers) if layers else BASE
    if layers:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    t = time.perf_counter()
    ensure_image(client, BASE, layers)
    cold_s = time.perf_counter() - t
    t = time.perf_counter()
    ensure_image(client, BASE, layers)
    warm_s = time.perf_counter() - t
    image_mb = client.images.get(tag).attrs["Size"] / 1e6

    script = Path(os.environ["FORGETUI_HOME"]) / f"{name}.json"
    script.write_text(json.dumps({"turns": [*SCRIPTS.get(name, HELLO), DONE]}))
    config = load_config(None, ["env.name=toy", 'env.tasks=["hello"]', f'harness.name="{name}"', f'policy.backend="scripted:{script}"',
                                "runtime.kind=docker", f"run.n_samples={samples}", "run.concurrency=1", "run.timeout_s=600", "run.max_retries=0"])
    summary = asyncio.run(execute_run(config, ks=[1]))
    con = duckdb.connect(summary.store, read_only=True)
    calls = con.execute("SELECT rollout_id, seq, api, len(prompt_token_ids), extends_parent, started_at FROM calls_full WHERE status = 'ok' ORDER BY rollout_id, seq").fetchall()
    rollouts = con.execute("SELECT rollout_id, started_at, passed, status FROM rollouts").fetchall()
    con.close()
    first_call = {}
    for rid, _seq, _api, _n, _ext, at in calls:
        first_call.setdefault(rid, at)
    to_first = [(first_call[rid] - started).total_seconds() for rid, started, _p, _s in rollouts if rid in first_call]
    later = [c for c in calls if c[1] > 0]
    return {
        "harness": name,
        "version": harness.version,
        "protocol": ",".join(sorted({c[2] for c in calls})) or "-",
        "install_mb": round(size_mb, 1),
        "host_install_s": round(install_s, 1),
        "image_mb": round(image_mb, 1),
        "build_cold_s": round(cold_s, 1),
        "build_warm_s": round(warm_s, 2),
        "start_to_first_call_s": round(sum(to_first) / len(to_first), 2) if to_first else None,
        "calls_per_rollout": round(len(calls) / max(1, len(rollouts)), 2),
        "mean_prompt_tokens": round(sum(c[3] for c in calls) / len(calls)) if calls else None,
        "merge_rate": round(sum(1 for c in later if c[4]) / len(later), 2) if later else None,
        "passed": f"{sum(1 for r in rollouts if r[2])}/{len(rollouts)}",
    }


COLUMNS = ["harness", "version", "protocol", "install_mb", "host_install_s", "image_mb", "build_cold_s", "build_warm_s",
           "start_to_first_call_s", "calls_per_rollout", "mean_prompt_tokens", "merge_rate", "passed"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", default=",".join(HARNESSES))
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (what the README keeps)")
    args = parser.parse_args()
    os.environ["FORGETUI_HOME"] = tempfile.mkdtemp(prefix="forgetui-matrix-")
    rows = []
    for name in args.harness.split(","):
        try:
            rows.append(measure(name.strip(), args.samples))
        except Exception as exc:  # noqa: BLE001 - one broken harness must not hide the others
            rows.append({"harness": name, "version": "-", "protocol": f"ERROR: {type(exc).__name__}: {str(exc)[:80]}"})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * len(COLUMNS))
        for r in rows:
            print("| " + " | ".join(str(r.get(c, "-")) for c in COLUMNS) + " |")
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"harness matrix: toy/hello, {args.samples} rollouts each, scripted policy, Docker")
        for c in COLUMNS:
            table.add_column(c)
        for r in rows:
            table.add_row(*(str(r.get(c, "-")) for c in COLUMNS))
        Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
