"""claw-bench: the loader (222 tasks, domains, levels, filters), the report parser, and oracle/noop runs in Docker."""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import pytest

from core.errors import ConfigError
from envs.claw_bench import STAGE, ClawBenchEnv, instruction_text
from envs.claw_bench.loader import find_tasks_dir
from envs.claw_bench.report import parse_junit
from envs.oracle import NoopHarness, OracleHarness, solution_files

DOMAINS = {
    "calendar", "code-assistance", "communication", "cross-domain", "data-analysis", "document-editing", "email",
    "file-operations", "memory", "multimodal", "security", "system-admin", "web-browsing", "workflow-automation",
}  # fmt: skip
# One to three tasks per domain whose reference solution passes (checked with benchmarks/claw_bench_oracle.py).
SAMPLE = [
    "cal-001", "cal-009",
    "code-001", "code-010",
    "comm-001", "comm-010",
    "xdom-008", "xdom-013",
    "data-001", "data-008",
    "doc-001", "doc-010",
    "eml-001", "eml-015",
    "file-001", "file-007",
    "mem-001", "mem-005",
    "mm-001", "mm-004",
    "sec-003", "sec-006",
    "sys-001", "sys-007",
    "web-001", "web-008",
    "wfl-001", "wfl-005",
]  # fmt: skip


@pytest.fixture(scope="module")
def env() -> ClawBenchEnv:
    return ClawBenchEnv()


def test_all_222_tasks_in_14_domains_and_4_levels(env: ClawBenchEnv) -> None:
    tasks = env.tasks()
    assert len(tasks) == 222
    assert {t.meta["domain"] for t in tasks} == DOMAINS
    assert collections.Counter(t.meta["level"] for t in tasks) == {"L1": 40, "L2": 81, "L3": 76, "L4": 25}
    ids = [t.id for t in tasks]
    assert len(set(ids)) == 222 and "cal-001" in ids
    assert all(t.instruction.strip() and t.setup and t.timeout_s and t.timeout_s > 0 for t in tasks)
    assert all(Path(t.solution).name == "solve.sh" and Path(t.solution).is_file() and "solution" not in t.meta for t in tasks)


def test_task_content(env: ClawBenchEnv) -> None:
    (task,) = ClawBenchEnv(ids=["cal-001"]).tasks()
    assert task.meta["name"] == "cal-001-create-meeting" and task.meta["domain"] == "calendar" and task.meta["level"] == "L1"
    assert task.timeout_s == 120.0
    assert "/workspace/meeting.json" in task.instruction and "Weekly Sync" in task.instruction
    assert task.instruction.startswith("Your workspace is /workspace/")
    assert set(task.files) == {f"{STAGE}/environment/setup.sh"}
    assert "/opt/claw-bench/calendar/cal-001-create-meeting" in (task.setup or "")
    # a task with data: every data file is staged, nothing from solution/ or verifier/ is
    (data_task,) = ClawBenchEnv(ids=["file-001"]).tasks()
    assert any(k.startswith(f"{STAGE}/environment/data/") for k in data_task.files)
    assert not any("solution" in k or "verifier" in k or "__pycache__" in k for t in env.tasks() for k in t.files)


def test_instruction_rewrite_makes_workspace_paths_absolute() -> None:
    text = instruction_text("Write `workspace/a.json` and workspace/b/c.txt; leave /workspace/x and my_workspace/y.", "/ws")
    assert "`/ws/a.json`" in text and "/ws/b/c.txt" in text
    assert "/workspace/x" in text and "my_workspace/y" in text  # already absolute or another word: untouched


def test_filters(env: ClawBenchEnv) -> None:
    cal = ClawBenchEnv(domains=["calendar"]).tasks()
    assert len(cal) == 15 and {t.meta["domain"] for t in cal} == {"calendar"}
    two = ClawBenchEnv(domains="calendar,email", levels=["l1"]).tasks()
    assert {t.meta["domain"] for t in two} == {"calendar", "email"} and {t.meta["level"] for t in two} == {"L1"}
    by_id = ClawBenchEnv(ids=["cal-001", "eml-001"]).tasks()
    by_name = ClawBenchEnv(ids="cal-001-create-meeting").tasks()
    assert [t.id for t in by_id] == ["cal-001", "eml-001"] and [t.id for t in by_name] == ["cal-001"]
    assert len(ClawBenchEnv(levels="L4").tasks()) == 25
    for bad in ({"domains": ["nope"]}, {"levels": ["L9"]}, {"ids": ["zzz-999"]}):
        with pytest.raises(ConfigError):
            ClawBenchEnv(**bad)


def test_content_hash_is_stable_and_distinct(env: ClawBenchEnv) -> None:
    first = {t.id: t.content_hash for t in env.tasks()}
    again = {t.id: t.content_hash for t in ClawBenchEnv().tasks()}
    assert first == again and len(set(first.values())) == 222


def test_tasks_dir_is_found_and_validated(tmp_path: Path) -> None:
    root = find_tasks_dir()
    assert (root / "conftest.py").is_file() and (root / "calendar").is_dir()
    assert len(ClawBenchEnv(tasks_dir=str(root), domains=["memory"]).tasks()) == 15
    with pytest.raises(ConfigError, match="not a claw-bench tasks folder"):
        ClawBenchEnv(tasks_dir=str(tmp_path))


def test_verifier_is_never_in_the_workspace_and_oracle_ships_the_solution(env: ClawBenchEnv) -> None:
    (task,) = ClawBenchEnv(ids=["cal-001"]).tasks()
    spec = OracleHarness().launch(task, endpoint=None, workdir="/workspace")  # type: ignore[arg-type]
    assert spec.command[-2:] == ["/solution/solve.sh", "/workspace"] and spec.workdir == "/workspace"
    assert b"meeting.json" in spec.files["/solution/solve.sh"]  # type: ignore[operator]
    assert set(solution_files(task)) == {"/solution/solve.sh"}
    assert NoopHarness().launch(task, endpoint=None, workdir="/workspace").command == ["true"]  # type: ignore[arg-type]
    task.solution = None
    with pytest.raises(ConfigError, match="no reference solution"):
        OracleHarness().launch(task, endpoint=None, workdir="/workspace")  # type: ignore[arg-type]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5">
<testcase classname="t" name="test_ok"/><testcase classname="t" name="test_ok2"/>
<testcase classname="t" name="test_bad"><failure message="AssertionError: assert 1 == 2">long text</failure></testcase>
<testcase classname="t" name="test_err"><error message="failed on setup with &quot;FileNotFoundError&quot;">x</error></testcase>
<testcase classname="t" name="test_skip"><skipped message="skip"/></testcase>
</testsuite></testsuites>"""


def test_junit_report_counts_and_reasons() -> None:
    report = parse_junit(JUNIT)
    assert (report.total, report.passed) == (4, 2) and report.fraction == 0.5 and not report.all_passed
    assert report.failures[0].startswith("test_bad (failure): AssertionError") and "FileNotFoundError" in report.failures[1]
    assert report.summary().startswith("2/4 tests passed")
    assert parse_junit('<testsuite tests="1"><testcase name="a"/></testsuite>').all_passed
    empty = parse_junit("<testsuite tests='0'></testsuite>")
    assert empty.fraction == 0.0 and not empty.all_passed
    with pytest.raises(ValueError):
        parse_junit("not xml")


# --- the real engine, in Docker --------------------------------------------------------------


def _run(harness: str, ids: list[str]) -> tuple[object, dict[str, tuple]]:
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    cfg = load_config(None, ["env.name=claw-bench", f"env.tasks={json.dumps(ids)}", f'harness.name="{harness}"', "runtime.kind=docker", "run.concurrency=2", "run.max_retries=0"])
    summary = asyncio.run(execute_run(cfg))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        got = {r[0]: r[1:] for r in con.execute("SELECT task_id, status, reward, passed, error, meta->>'verifier' FROM rollouts").fetchall()}
    finally:
        con.close()
    return summary, got


def test_sample_covers_every_domain(env: ClawBenchEnv) -> None:
    by_id = {t.id: t for t in env.tasks()}
    assert len(SAMPLE) >= 20 and {by_id[i].meta["domain"] for i in SAMPLE} == DOMAINS


@pytest.mark.docker
def test_oracle_passes_and_noop_fails_in_docker(docker_client, base_image) -> None:
    summary, got = _run("oracle", SAMPLE)
    assert summary.infra_errors == 0 and set(got) == set(SAMPLE)
    failed = {tid: row for tid, row in got.items() if not row[2]}
    assert not failed, f"oracle failed: {failed}"
    assert all(row[0] == "done" and row[1] == 1.0 and "tests passed" in row[4] for row in got.values())
    summary, got = _run("noop", SAMPLE)
    assert summary.infra_errors == 0 and set(got) == set(SAMPLE)
    assert all(row[0] == "done" and row[2] is False and row[1] < 1.0 for row in got.values()), got
