"""harbor: loading harbor-format task folders, reading rewards, and the shipped examples run in Docker (oracle, noop)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.runtime.base import ExecResult
from envs.harbor import EXAMPLES, HarborEnv, image_workdir, read_reward
from envs.oracle import OracleHarness


def test_examples_load_with_their_own_images() -> None:
    tasks = HarborEnv().tasks()
    assert [t.id for t in tasks] == ["count-harbor", "region-totals"]
    count, totals = tasks
    assert count.image is not None and count.image.dockerfile.startswith("FROM forgetui/base:bookworm")
    assert count.image.context == EXAMPLES / "count-harbor" / "environment"
    assert count.timeout_s == 120.0 and totals.timeout_s == 180.0
    assert count.meta["workdir"] == "/app" and count.meta["verifier_timeout_s"] == 60.0
    assert count.meta["metadata"]["difficulty"] == "easy" and "/app/count.txt" in count.instruction
    assert count.files == {} and count.setup is None
    assert count.content_hash == HarborEnv(path=str(EXAMPLES)).tasks()[0].content_hash != totals.content_hash


def test_oracle_ships_the_whole_solution_folder() -> None:
    totals = HarborEnv(path=str(EXAMPLES / "region-totals")).tasks()[0]  # one task folder works too
    spec = OracleHarness().launch(totals, endpoint=None, workdir="/workspace")  # type: ignore[arg-type]
    assert set(spec.files) == {"/solution/solve.sh", "/solution/totals.py"}
    assert spec.command[-2:] == ["/solution/solve.sh", "/app"] and spec.workdir == "/app"


def _task(root: Path, name: str, *, dockerfile: str | None = "FROM x\n", toml: str = "", test_sh: bool = True) -> Path:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "task.toml").write_text(toml)
    (folder / "instruction.md").write_text(f"do {name}")
    if dockerfile is not None:
        (folder / "environment" / "Dockerfile").write_text(dockerfile)
    if test_sh:
        (folder / "tests").mkdir()
        (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return folder


def test_loader_edge_cases(tmp_path: Path) -> None:
    _task(tmp_path, "b-task", dockerfile=None, toml='[environment]\ndocker_image = "ghcr.io/x/y:1"\n')
    _task(tmp_path, "a-task", dockerfile="FROM python:3.11\nWORKDIR /srv\nRUN true\nWORKDIR /srv/app\n")
    (tmp_path / "not-a-task").mkdir()
    a, b = HarborEnv(path=str(tmp_path)).tasks()
    assert (a.id, b.id) == ("a-task", "b-task")
    assert a.meta["workdir"] == "/srv/app" and a.solution is None and a.timeout_s is None
    assert b.image is not None and b.image.dockerfile == "FROM ghcr.io/x/y:1\n" and b.image.context is None and "workdir" not in b.meta
    with pytest.raises(ConfigError, match="no tasks"):
        HarborEnv(path=str(tmp_path / "not-a-task"))
    with pytest.raises(ConfigError, match="not a folder"):
        HarborEnv(path=str(tmp_path / "missing"))
    _task(tmp_path / "other", "c", test_sh=False)
    with pytest.raises(ConfigError, match="no task of .* loads:\n  c: c: no tests/test.sh"):
        HarborEnv(path=str(tmp_path / "other"))
    _task(tmp_path / "third", "d", dockerfile=None)
    with pytest.raises(ConfigError, match="neither environment/Dockerfile"):
        HarborEnv(path=str(tmp_path / "third")).tasks()
    with pytest.raises(ConfigError, match="has no reference solution"):
        OracleHarness().launch(a, endpoint=None, workdir="/workspace")  # type: ignore[arg-type]


def test_rewards_and_workdir_parsing() -> None:
    assert read_reward("1\n", "txt") == 1.0 and read_reward(" 0.25 ", "txt") == 0.25
    assert read_reward('{"reward": 0.5, "detail": 3}', "json") == 0.5 and read_reward("0.75", "json") == 0.75
    assert read_reward('{"score": 1}', "json") == 1.0
    for text, kind in (("", "txt"), ("pass", "txt"), ('{"a": 1, "b": 2}', "json"), ("[]", "json")):
        with pytest.raises((ValueError, IndexError)):
            read_reward(text, kind)
    assert image_workdir("FROM a\nworkdir /x\n") == "/x" and image_workdir("FROM a\nWORKDIR rel\n") is None


class FakeSandbox:
    """Just enough of a sandbox for verify(): files in a dict, exec answers from a script."""

    def __init__(self, reward: dict[str, bytes], exit_code: int = 0, timed_out: bool = False) -> None:
        self.files: dict[str, bytes] = {}
        self.reward = reward
        self.commands: list[tuple[object, str | None]] = []
        self.result = ExecResult(exit_code, "test output", "", timed_out)

    async def exec(self, cmd, *, timeout_s, env=None, workdir=None, stdin=None) -> ExecResult:  # noqa: ANN001
        self.commands.append((cmd, workdir))
        if cmd[:2] == ["bash", "/tests/test.sh"]:
            self.files.update(self.reward)
            return self.result
        return ExecResult(0, "", "")

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.files[path] = data

    async def get_file(self, path: str) -> bytes:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]


@pytest.mark.parametrize(
    ("reward", "score", "passed", "detail"),
    [
        ({"/logs/verifier/reward.txt": b"1\n"}, 1.0, True, "reward 1"),
        ({"/logs/verifier/reward.txt": b"0.5\n"}, 0.5, False, "reward 0.5"),
        ({"/logs/verifier/reward.json": b'{"reward": 1.0}'}, 1.0, True, "reward 1"),
        ({"/logs/verifier/reward.txt": b"7"}, 1.0, True, "reward 7"),  # clamped into [0, 1]
        ({"/logs/verifier/reward.txt": b"garbage"}, 0.0, False, "unreadable"),
        ({}, 0.0, False, "wrote no /logs/verifier/reward.txt"),
    ],
)
async def test_verify_reads_the_reward(reward: dict, score: float, passed: bool, detail: str) -> None:
    env = HarborEnv()
    task = env.tasks()[1]
    sandbox = FakeSandbox(reward)
    got = await env.verify(sandbox, task, "/workspace")  # type: ignore[arg-type]
    assert (got.score, got.passed) == (score, passed) and detail in got.detail
    assert {"/tests/test.sh", "/tests/check_totals.py"} <= set(sandbox.files)
    assert sandbox.commands[0][0][-1].startswith("rm -rf /tests /logs/verifier")  # a reward planted by the agent is gone
    assert (["bash", "/tests/test.sh"], "/app") in sandbox.commands


async def test_verify_timeout_scores_zero() -> None:
    env = HarborEnv()
    got = await env.verify(FakeSandbox({"/logs/verifier/reward.txt": b"1"}, -1, timed_out=True), env.tasks()[0], "/workspace")  # type: ignore[arg-type]
    assert got.score == 0.0 and "ran past 60 s" in got.detail


# --- the real engine, in Docker --------------------------------------------------------------


def _run(harness: str, path: Path, *extra: str) -> tuple[object, dict[str, tuple]]:
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    cfg = load_config(None, ["env.name=harbor", f"env.path={json.dumps(str(path))}", f'harness.name="{harness}"', "runtime.kind=docker", "run.concurrency=2", "run.max_retries=0", *extra])
    summary = asyncio.run(execute_run(cfg))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        got = {r[0]: r[1:] for r in con.execute("SELECT task_id, status, reward, passed, meta->>'verifier' FROM rollouts").fetchall()}
    finally:
        con.close()
    return summary, got


@pytest.mark.docker
def test_examples_oracle_passes_noop_fails_in_docker(docker_client, base_image) -> None:
    # a policy that cannot load: oracle and noop call no model, so the run must not load one, nor report it
    no_such_model = 'policy.backend="builtin:/nonexistent/model"'
    summary, got = _run("oracle", EXAMPLES, no_such_model)
    assert summary.infra_errors == 0 and set(got) == {"count-harbor", "region-totals"}
    assert [g["model"] for g in summary.report["groups"]] == ["none"]
    assert all(row[:3] == ("done", 1.0, True) for row in got.values()), got
    summary, got = _run("noop", EXAMPLES, no_such_model)
    assert summary.infra_errors == 0 and summary.report["groups"][0]["model"] == "none"
    assert (summary.below_threshold, summary.harness_failed) == (2, 0)
    assert all(row[:3] == ("done", 0.0, False) for row in got.values()), got
    assert "expected 4" in got["count-harbor"][3]


def test_content_hash_is_the_same_wherever_the_suite_lives(tmp_path: Path) -> None:
    """A task's identity is its content: a copy of the suite elsewhere (another machine) hashes the same."""
    import shutil

    here = HarborEnv(path=str(EXAMPLES / "region-totals")).tasks()[0]
    copy = tmp_path / "elsewhere" / "region-totals"
    shutil.copytree(EXAMPLES / "region-totals", copy)
    there = HarborEnv(path=str(copy)).tasks()[0]
    assert here.solution != there.solution and here.content_hash == there.content_hash


def test_content_hash_follows_the_files_the_dockerfile_copies(tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "region-totals"
    shutil.copytree(EXAMPLES / "region-totals", copy)
    before = HarborEnv(path=str(copy)).tasks()[0].content_hash
    (copy / "environment" / "extra.csv").write_text("region,total\n")
    assert HarborEnv(path=str(copy)).tasks()[0].content_hash != before


# --- suites at scale: bad tasks, provenance, thresholds, metadata, options, timeouts --------------


def test_bad_tasks_are_skipped_with_a_warning_naming_each(tmp_path: Path, caplog) -> None:
    _task(tmp_path, "good", toml='[metadata]\ncategory = "c"\n')
    _task(tmp_path, "no-tests", test_sh=False)
    _task(tmp_path, "bad-toml", toml="this is = = not toml")
    (tmp_path / "no-instruction").mkdir()
    (tmp_path / "no-instruction" / "task.toml").write_text("")
    with caplog.at_level("WARNING", logger="envs.harbor"):
        env = HarborEnv(path=str(tmp_path))
    assert [t.id for t in env.tasks()] == ["good"]
    assert set(env.skipped) == {"no-tests", "bad-toml", "no-instruction"}
    assert "no tests/test.sh" in env.skipped["no-tests"] and "cannot read task.toml" in env.skipped["bad-toml"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "skipped 3 task(s)" in warning and all(name in warning for name in env.skipped)
    with pytest.raises(ConfigError, match="env.strict.*bad-toml"):
        HarborEnv(path=str(tmp_path), strict=True)


def test_unknown_env_options_are_an_error_naming_the_accepted_ones() -> None:
    from core.config import load_config
    from core.registry import load_env
    from core.session.setup import env_kwargs

    with pytest.raises(ConfigError, match=r"env 'harbor' has no option 'seed', 'split'; it accepts: path, strict, threshold"):
        load_env("harbor", split="train", seed=3)
    cfg = load_config(None, ["env.name=harbor", "env.strict=true", "env.options.threshold=0.5"])
    env = load_env("harbor", **env_kwargs(cfg))
    assert env.opts.strict and env.opts.threshold == 0.5


def test_task_hash_covers_the_verifier(tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "region-totals"
    shutil.copytree(EXAMPLES / "region-totals", copy)
    before = HarborEnv(path=str(copy)).tasks()[0]
    (copy / "tests" / "test.sh").write_text((copy / "tests" / "test.sh").read_text() + "\n# stricter now\n")
    after = HarborEnv(path=str(copy)).tasks()[0]
    assert after.verifier != before.verifier and after.content_hash != before.content_hash
    (copy / "tests" / "helper.py").write_text("x = 1\n")  # any file of tests/, not only test.sh
    assert HarborEnv(path=str(copy)).tasks()[0].content_hash != after.content_hash


async def test_a_task_declares_its_own_pass_threshold(tmp_path: Path) -> None:
    _task(tmp_path, "lenient", toml="[verifier]\npass_threshold = 0.8\n")
    _task(tmp_path, "strict")
    env = HarborEnv(path=str(tmp_path))
    lenient, strict = sorted(env.tasks(), key=lambda t: t.id)
    assert (lenient.threshold, strict.threshold) == (0.8, None) and lenient.content_hash != HarborEnv(path=str(tmp_path)).tasks()[1].content_hash
    reward = {"/logs/verifier/reward.txt": b"0.8\n"}
    got = await env.verify(FakeSandbox(reward), lenient, "/workspace")  # type: ignore[arg-type]
    assert (got.score, got.passed) == (0.8, True)
    got = await env.verify(FakeSandbox(reward), strict, "/workspace")  # type: ignore[arg-type]
    assert (got.score, got.passed) == (0.8, False)  # the env's threshold (1.0)
    suite_wide = HarborEnv(path=str(tmp_path), threshold=0.5)
    got = await suite_wide.verify(FakeSandbox(reward), next(t for t in suite_wide.tasks() if t.id == "strict"), "/workspace")  # type: ignore[arg-type]
    assert got.passed and next(t for t in suite_wide.tasks() if t.id == "lenient").threshold == 0.8  # the task's own wins


def test_metadata_feeds_the_eval_breakdown() -> None:
    from core.eval.report import build_report

    count, totals = HarborEnv().tasks()
    assert (count.meta["category"], count.meta["difficulty"], count.meta["tags"]) == ("text-processing", "easy", ["grep", "files"])
    rows = [
        {"task_id": t.id, "env": "harbor", "harness": "h", "status": "done", "passed": ok, "reward": float(ok), "meta": {"task_meta": t.meta}}
        for t, ok in ((count, True), (totals, False))
    ]
    (group,) = build_report(rows, [1], model="m")["groups"]
    by = group["breakdown"]
    assert by["category"]["text-processing"]["pass_at_k"]["1"] == 1.0 and by["category"]["data-processing"]["pass_at_k"]["1"] == 0.0
    assert by["tags"]["grep"]["samples"] == 1 and by["tags"]["files"]["samples"] == 1  # a task counts once under each tag
    assert sum(v["samples"] for v in by["difficulty"].values()) == 2


@pytest.mark.parametrize(
    ("task_s", "run_s", "scale", "expected"),
    [(120.0, None, 1.0, 120.0), (120.0, 60.0, 1.0, 60.0), (120.0, 600.0, 2.0, 240.0), (120.0, 200.0, 2.0, 200.0),
     (None, None, 3.0, 600.0), (None, 30.0, 1.0, 30.0)],
)
def test_run_timeout_caps_and_scale_scales(task_s, run_s, scale, expected) -> None:
    from core.rollout.attempt import rollout_timeout

    assert rollout_timeout(task_s, run_s, scale) == expected


def test_images_build_loads_the_env_as_a_run_does_with_its_path(tmp_path: Path, caplog) -> None:
    """`forgetui images build` passes env.path and env.strict to the env, as `forgetui run` does: a strict suite
    with a broken task is refused (without them it would build the bundled examples and say nothing)."""
    from forgetui.cli import main

    suite = tmp_path / "suite"
    _task(suite, "good")
    _task(suite, "bad-toml", toml="this is = = not toml")
    config = tmp_path / "harbor.toml"
    config.write_text(f'[env]\nname = "harbor"\npath = "{suite}"\nstrict = true\n[runtime]\nkind = "local"\n')
    assert main(["images", "build", str(config)]) == 2
    assert "env.strict" in caplog.text and "bad-toml" in caplog.text
