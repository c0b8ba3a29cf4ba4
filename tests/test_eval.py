"""`forgetui eval`: pass@k / pass^k / mean score per env × harness, breakdowns, timeouts and infra errors apart, JSON + PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.eval.passk import pass_at_k, pass_hat_k
from core.eval.report import build_report


def row(task, status, passed, reward, family="f1"):
    return {"task_id": task, "env": "toy", "harness": "h", "status": status, "passed": passed, "reward": reward, "meta": {"task_meta": {"family": family}}}


def test_report_excludes_infra_errors_and_counts_timeouts():
    rows = [
        row("a", "done", True, 1.0), row("a", "done", False, 0.5), row("a", "infra_error", None, None),
        row("b", "timeout", False, 0.0, "f2"), row("b", "done", True, 1.0, "f2"),
    ]
    report = build_report(rows, [1, 2], model="m")
    (g,) = report["groups"]
    assert g["samples"] == 4 and g["infra_errors"] == 1 and g["timeouts"] == 1
    assert g["pass_at_k"]["1"] == pytest.approx((pass_at_k(2, 1, 1) + pass_at_k(2, 1, 1)) / 2)
    assert g["pass_hat_k"]["2"] == pytest.approx((pass_hat_k(2, 1, 2) + pass_hat_k(2, 1, 2)) / 2) == 0.0
    assert g["mean_score"] == pytest.approx(2.5 / 4)
    assert set(g["breakdown"]["family"]) == {"f1", "f2"} and g["breakdown"]["family"]["f1"]["samples"] == 2


def test_eval_cli_writes_json_and_plot_with_timeouts_apart(tmp_path, docker_client, base_image):
    cfg = tmp_path / "eval.toml"
    cfg.write_text(
        '[env]\nname = "toy"\ntasks = ["hello", "write-file-000"]\n[harness]\nname = "tests.harness_fixtures:HangingHarness"\n'
        '[harness.options]\nhang_on = "write-file"\ncommand = "echo hi > hello.txt"\n[runtime]\nkind = "docker"\n'
        '[policy]\nbackend = "builtin:tiny"\n[run]\nn_samples = 2\nconcurrency = 4\ntimeout_s = 3\n'
    )
    env = {**os.environ, "FORGETUI_HOME": str(tmp_path / "home"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-m", "forgetui.cli", "eval", str(cfg), "--no-ui", "-k", "1,2"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["timeouts"] == 2 and summary["passed"] == 2 and summary["failed"] == 0
    assert summary["pass_at_k"] == {"1": 0.5, "2": 0.5} and summary["pass_hat_k"] == {"1": 0.5, "2": 0.5}
    report = json.loads(Path(summary["eval_json"]).read_text())
    (g,) = report["groups"]
    assert g["pass_at_k"] == summary["pass_at_k"] and g["timeouts"] == 2 and g["model"] == "builtin:tiny"
    png = Path(summary["eval_plot"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_bad_k_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "forgetui.cli", "eval", "examples/local.toml", "--no-ui", "-k", "x"], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=60)
    assert out.returncode == 2 and "-k expects" in out.stderr


def test_eval_report_names_the_model_without_its_key(tmp_path):
    from core.config import load_config
    from core.eval.summary import summarize, write_eval_report
    from core.store.writer import Store

    store = Store.open(tmp_path / "store.duckdb")
    store.insert_run("r", {})
    store.upsert_rollout({"rollout_id": "r/hello/0", "run_id": "r", "env": "toy", "task_id": "hello", "harness": "react", "sample_index": 0, "status": "done", "passed": True, "reward": 1.0, "attempt": 0})
    cfg = load_config(None, ['policy.backend="litellm:openai/gpt-x?api_key=sk-secret-9"'])
    summary = summarize(store, "r", tmp_path / "store.duckdb", [1])
    write_eval_report(store, "r", tmp_path, summary, cfg.policy.backend)
    store.close()
    text = (tmp_path / "eval.json").read_text()
    assert "sk-secret-9" not in text and "litellm:openai/gpt-x?api_key=***" in text
