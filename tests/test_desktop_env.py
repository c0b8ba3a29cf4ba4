"""desktop: the dozen tasks and their parameters, and real X desktops in Docker (oracle passes, noop scores 0,
sandboxes on the host network never see each other's windows, a dead X server is an infra error)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from core.env import Task
from core.errors import ConfigError
from core.harness import Endpoint, Harness, LaunchSpec
from envs.desktop import DesktopEnv
from envs.desktop.tasks import HOME, KINDS

PROGRAMS = ("xterm", "mousepad", "gnumeric")


def test_thirteen_tasks_over_three_real_programs_with_seeded_parameters() -> None:
    tasks = DesktopEnv().tasks()
    assert len(tasks) == 13 == len(KINDS)
    assert {next(p for p in PROGRAMS if p in KINDS[t.meta["task"]].app) for t in tasks} == set(PROGRAMS)
    for task in tasks:
        assert task.workdir == HOME and task.solution and task.meta["gui"] == "desktop"
        assert "gui start --app" in (task.setup or "") and "gui observe" in task.instruction
        assert "AGENTS.md" in task.files and "CLAUDE.md" in task.files
    a = {t.id: t.meta["params"] for t in DesktopEnv(seed=3, instances=2).tasks()}
    b = {t.id: t.meta["params"] for t in DesktopEnv(seed=3, instances=2).tasks()}
    c = {t.id: t.meta["params"] for t in DesktopEnv(seed=4, instances=2).tasks()}
    assert a == b and a != c and a["sheet-fill-cell.0"] != a["sheet-fill-cell.1"]
    assert [t.id for t in DesktopEnv(names="sheet-*").tasks()] == ["sheet-fill-cell.0", "sheet-sum-column.0", "sheet-header.0"]
    with pytest.raises(ConfigError, match="no task matches"):
        DesktopEnv(names="paint-*").names()


def _run(harness: str, names: list[str] | None, *extra: str) -> tuple[Any, list[tuple]]:
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    sets = ["env.name=desktop", f'harness.name="{harness}"', "runtime.kind=docker", "runtime.network=host", "run.concurrency=2", "run.max_retries=0", *extra]
    if names:
        sets.append(f"env.options.names={json.dumps(names)}")
    summary = asyncio.run(execute_run(load_config(None, sets)))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        rows = con.execute("SELECT task_id, status, reward, passed, error, meta->>'verifier', meta->>'stdout_tail' FROM rollouts ORDER BY task_id").fetchall()
    finally:
        con.close()
    return summary, [tuple(r) for r in rows]


@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_oracle_passes_and_noop_scores_zero_on_every_task(docker_client, base_image) -> None:
    summary, rows = _run("oracle", None)
    assert summary.infra_errors == 0 and len(rows) == 13
    assert all(r[1] == "done" and r[2] == 1.0 and r[3] for r in rows), [r for r in rows if not r[3]]
    summary, rows = _run("noop", None)
    assert summary.infra_errors == 0 and len(rows) == 13
    assert all(r[1] == "done" and r[2] == 0.0 and r[3] is False for r in rows), [r for r in rows if r[2]]


class TitledTerminalHarness(Harness):
    """Opens a terminal titled after the rollout's token, waits, then lists the windows it can see."""

    name = "desktop-titled"
    protocols = ()

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        title = f"term-{endpoint.token[:8]}"
        script = f"DISPLAY=:99 xterm -T {title} & sleep 4; gui observe --no-screenshot; echo mine={title}"
        return LaunchSpec(command=["bash", "-c", script])


@pytest.mark.docker
def test_sandboxes_on_the_host_network_never_share_an_x_server(docker_client, base_image) -> None:
    # four desktops at once on the host's network namespace: each must see only its own windows
    summary, rows = _run("tests.test_desktop_env:TitledTerminalHarness", ["term-exit"], "env.options.instances=4", "run.concurrency=4")
    assert summary.infra_errors == 0 and len(rows) == 4
    for *_, stdout in rows:
        mine = stdout.rsplit("mine=", 1)[1].strip()
        titles = [line.split('"')[1] for line in stdout.splitlines() if line.startswith("[")]
        assert sorted(titles) == sorted(["xterm", mine]), stdout


class KillXHarness(Harness):
    name = "desktop-kill-x"
    protocols = ()

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        return LaunchSpec(command=["bash", "-c", "pkill -KILL Xvfb; sleep 1; gui observe; echo observe-rc=$?"])


@pytest.mark.docker
def test_an_x_server_that_dies_is_an_infra_error(docker_client, base_image) -> None:
    summary, rows = _run("tests.test_desktop_env:KillXHarness", ["editor-clear-file"])
    ((_task, status, _reward, _passed, error, _verifier, _stdout),) = rows
    assert summary.infra_errors == 1 and status == "infra_error" and "X server" in error, rows
