"""miniwob: the task list, seeds and filters, the `gui` CLI's text form, and real Chromium runs in Docker
(oracle ≥ 0.9 and noop = 0 on the oracle tasks, one instance per group, bad ids, a crashed browser)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from core.env import Task
from core.errors import ConfigError
from core.harness import Endpoint, Harness, LaunchSpec
from envs.miniwob import ORACLE_TASKS, MiniWoBEnv, instance_seed
from envs.miniwob.image import GUI_SOURCE
from envs.oracle import OracleHarness

REQUIRED_ORACLE = ("click-button", "enter-text", "click-checkboxes", "choose-list", "navigate-tree")


def _gui_module() -> Any:
    spec = importlib.util.spec_from_file_location("forgetui_gui_cli", GUI_SOURCE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheel_ships_over_100_tasks_and_names_filter_by_glob() -> None:
    every = MiniWoBEnv().names()
    assert len(every) >= 100 and "click-button" in every and "navigate-tree" in every
    assert not any(n.startswith("flight") for n in every)
    env = MiniWoBEnv(names="click-check*,enter-text", instances=2)
    assert env.names() == ["click-checkboxes", "click-checkboxes-large", "click-checkboxes-soft", "click-checkboxes-transfer", "enter-text"]
    assert [t.id for t in env.tasks()][:2] == ["click-checkboxes.0", "click-checkboxes.1"]
    with pytest.raises(ConfigError, match="no task matches 'click-nothing-such'"):
        MiniWoBEnv(names=["click-nothing-such"]).names()
    with pytest.raises(ConfigError, match="instances"):
        MiniWoBEnv(instances=0)


def test_seed_is_fixed_per_instance_and_differs_between_instances() -> None:
    a = MiniWoBEnv(names="click-button", instances=3, seed=5).tasks()
    b = MiniWoBEnv(names="click-button", instances=3, seed=5).tasks()
    c = MiniWoBEnv(names="click-button", instances=3, seed=6).tasks()
    assert [t.meta["seed"] for t in a] == [t.meta["seed"] for t in b]
    assert len({t.meta["seed"] for t in a}) == 3 and a[0].meta["seed"] != c[0].meta["seed"]
    assert a[1].meta["seed"] == instance_seed(5, "click-button", 1)
    assert f"--seed {a[1].meta['seed']}" in (a[1].setup or "") and "click-button.html" in (a[1].setup or "")
    assert a[0].content_hash == b[0].content_hash != a[1].content_hash


def test_oracle_tasks_ship_a_solution_and_others_none() -> None:
    tasks = {t.id: t for t in MiniWoBEnv(names=list(ORACLE_TASKS) + ["drag-box"]).tasks()}
    assert set(REQUIRED_ORACLE) <= set(ORACLE_TASKS)
    assert all(Path(str(tasks[f"{n}.0"].solution)).is_file() for n in ORACLE_TASKS)
    assert tasks["drag-box.0"].solution is None


def test_text_form_prunes_containers_and_shows_ids_values_and_options() -> None:
    gui = _gui_module()
    obs = {
        "utterance": 'Select Bob from the list and click Submit.', "done": False,
        "screenshot": {"path": "/tmp/forgetui-gui/screen-0001.png"},
        "elements": [
            {"ref": 1, "tag": "BODY", "depth": 0, "left": 0, "top": 0, "width": 160, "height": 210},
            {"ref": 2, "tag": "DIV", "id": "wrap", "depth": 1, "left": 0, "top": 0, "width": 160, "height": 210},
            {"ref": 3, "tag": "DIV", "depth": 2, "left": 0, "top": 50, "width": 160, "height": 100},
            {"ref": 4, "tag": "SELECT", "depth": 3, "left": 2, "top": 55, "width": 60, "height": 20, "options": ["Ann", "Bob"]},
            {"ref": 5, "tag": "INPUT_checkbox", "value": True, "depth": 3, "left": 2, "top": 80, "width": 10, "height": 10, "focused": True},
            {"ref": -1, "tag": "t", "text": "hello", "depth": 3, "left": 20, "top": 80, "width": 30, "height": 10},
            {"ref": 6, "tag": "BUTTON", "text": "Submit", "depth": 3, "left": 2, "top": 100, "width": 50, "height": 20},
        ],
    }  # fmt: skip
    text = gui.render(obs)
    assert text.splitlines()[:3] == ["task: Select Bob from the list and click Submit.", "done: false", "screenshot: /tmp/forgetui-gui/screen-0001.png"]
    assert "[1] body" not in text and "[3] div" not in text  # containers with nothing of their own are pruned
    assert "  [4] select options=[\"Ann\", \"Bob\"] @ 32,65" in text
    assert "  [5] input_checkbox checked=true (focused) @ 7,85" in text
    assert '  [-1] text "hello" @ 35,85' in text and '  [6] button "Submit" @ 27,110' in text
    assert "[2] div#wrap @ 80,105" in text


# --- real Chromium in Docker ----------------------------------------------------------------


class ProbeHarness(Harness):
    """Looks at the page, tries a bad id and a bad option, then runs the oracle (through the `gui` CLI only)."""

    name = "miniwob-probe"
    protocols = ()

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        oracle = OracleHarness().launch(task, endpoint, workdir)
        script = (
            "gui observe --no-screenshot; echo observe-rc=$?; gui click 9999; echo click-rc=$?; "
            'gui type "hi" --into 9999; echo type-rc=$?; gui screenshot; '
            "gui drag 4 4 30 12; echo drag-rc=$?; gui drag 4 4 99999 12; echo dragout-rc=$?; "  # the text area at the top: harmless
            '"$@"; echo oracle-rc=$?; gui click 1; echo after-rc=$?'
        )
        return LaunchSpec(command=["bash", "-c", script, "probe", *oracle.command], files=oracle.files, workdir=oracle.workdir)


class CrashOnceHarness(Harness):
    """Kills the sandbox's Chromium on its first launch (a crash mid-episode); runs the oracle after that."""

    name = "miniwob-crash-once"
    protocols = ()
    launches = 0

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        type(self).launches += 1
        if type(self).launches == 1:
            return LaunchSpec(command=["bash", "-c", "gui observe --no-screenshot >/dev/null; pkill -KILL -f chromium; sleep 1; gui status; echo status-rc=$?"])
        return OracleHarness().launch(task, endpoint, workdir)


def _run(harness: str, names: list[str], *extra: str) -> tuple[Any, list[tuple]]:
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    sets = [
        "env.name=miniwob", f"env.options.names={json.dumps(names)}", f'harness.name="{harness}"',
        "runtime.kind=docker", "run.concurrency=2", "run.max_retries=0", *extra,
    ]  # fmt: skip
    summary = asyncio.run(execute_run(load_config(None, sets)))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        rows = con.execute(
            "SELECT task_id, status, reward, passed, error, meta->>'verifier', meta->>'stdout_tail', attempt FROM rollouts ORDER BY task_id, sample_index"
        ).fetchall()
    finally:
        con.close()
    return summary, [tuple(r) for r in rows]


@pytest.mark.docker
def test_oracle_scores_and_noop_scores_zero_in_real_chromium(docker_client, base_image) -> None:
    names = list(ORACLE_TASKS)
    summary, rows = _run("oracle", names, "env.options.instances=2")
    assert summary.infra_errors == 0 and len(rows) == 2 * len(names)
    by_task: dict[str, list[float]] = {}
    for task_id, status, reward, passed, error, verifier, *_ in rows:
        assert status == "done" and passed, (task_id, status, reward, error, verifier)
        by_task.setdefault(task_id.split(".")[0], []).append(reward)
    assert all(sum(r) / len(r) >= 0.9 for r in by_task.values()), by_task
    assert set(REQUIRED_ORACLE) <= set(by_task)
    summary, rows = _run("noop", names)
    assert summary.infra_errors == 0 and len(rows) == len(names)
    assert all(r[1] == "done" and r[2] == 0.0 and r[3] is False and "not done" in r[5] for r in rows), rows


@pytest.mark.docker
def test_a_group_sees_one_instance_and_bad_actions_are_messages(docker_client, base_image) -> None:
    summary, rows = _run("tests.test_miniwob:ProbeHarness", ["choose-list"], "run.n_samples=2", "env.options.instances=2")
    assert summary.infra_errors == 0 and len(rows) == 4
    pages = {}
    for task_id, status, reward, _passed, _error, _verifier, stdout, _attempt in rows:
        assert status == "done" and reward == 1.0, (task_id, stdout)
        assert "observe-rc=0" in stdout and "click-rc=1" in stdout and "type-rc=1" in stdout and "oracle-rc=0" in stdout
        assert "dragged from (4, 4) to (30, 12)" in stdout and "drag-rc=0" in stdout and "dragout-rc=1" in stdout
        assert "after-rc=1" in stdout  # acting after the page judged the episode is refused
        assert "/tmp/forgetui-gui/screen-" in stdout
        pages.setdefault(task_id, set()).add(stdout.split("observe-rc")[0])
    assert all(len(seen) == 1 for seen in pages.values()), pages  # both samples of a group: the same page
    assert len({next(iter(v)) for v in pages.values()}) == 2  # the two instances differ
    assert all(next(iter(v)).startswith("task: Select ") for v in pages.values())


@pytest.mark.docker
def test_a_browser_that_crashes_is_an_infra_error_and_is_retried(docker_client, base_image) -> None:
    CrashOnceHarness.launches = 0
    summary, rows = _run("tests.test_miniwob:CrashOnceHarness", ["click-button"], "run.max_retries=1")
    assert CrashOnceHarness.launches == 2
    ((task_id, status, reward, passed, error, _verifier, _stdout, attempt),) = rows
    assert (status, reward, passed, attempt) == ("done", 1.0, True, 1), (status, error)
    CrashOnceHarness.launches = 0
    summary, rows = _run("tests.test_miniwob:CrashOnceHarness", ["click-button"], "run.max_retries=0")
    assert summary.infra_errors == 1 and rows[0][1] == "infra_error" and "browser" in rows[0][4], rows


class NeverLoadsEnv(MiniWoBEnv):
    """click-button whose page URL points at nothing: the page never loads."""

    def make_task(self, name: str, index: int) -> Task:
        task = super().make_task(name, index)
        task.setup = (task.setup or "").replace(f"/{name}.html", "/no-such-page.html") + " --load-timeout 3"
        return task


@pytest.mark.docker
def test_a_page_that_never_loads_is_an_infra_error(docker_client, base_image) -> None:
    summary, rows = _run("oracle", ["click-button"], "env.name=tests.test_miniwob:NeverLoadsEnv", "run.max_retries=1")
    ((_task, status, reward, _passed, error, _verifier, _stdout, attempt),) = rows
    assert summary.infra_errors == 1 and status == "infra_error" and reward is None and attempt == 1, rows
    assert "task setup failed" in error and "did not load within 3" in error, error


class McpHarness(Harness):
    """Speaks MCP to the sandbox's `gui-mcp` over stdio: initialize, list the tools, observe, click the button."""

    name = "miniwob-mcp"
    protocols = ()

    def launch(self, task: Task, endpoint: Endpoint, workdir: str) -> LaunchSpec:
        messages = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "observe", "arguments": {}}},
            {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "click", "arguments": {"id": 4}}},
        ]
        # the screenshot's base64 is shortened to its length, so the whole exchange fits the recorded stdout tail
        shorten = (
            "import json, sys\n"
            "for line in sys.stdin:\n"
            "    r = json.loads(line)\n"
            "    for c in (r.get('result') or {}).get('content') or []:\n"
            "        if c.get('type') == 'image': c['data'] = len(c['data'])\n"
            "    print(json.dumps(r))\n"
        )
        script = f"printf '%s\\n' \"$@\" | gui-mcp | python3 -c {shlex.quote(shorten)}"
        return LaunchSpec(command=["bash", "-c", script, "mcp", *(json.dumps(m) for m in messages)])


@pytest.mark.docker
def test_the_mcp_server_lists_the_gui_tools_and_acts(docker_client, base_image) -> None:
    summary, rows = _run("tests.test_miniwob:McpHarness", ["click-test"])
    ((_task, status, reward, _passed, error, _verifier, stdout, _attempt),) = rows
    assert (status, reward) == ("done", 1.0), (error, stdout)
    replies = {r["id"]: r for r in map(json.loads, stdout.strip().splitlines())}
    assert replies[1]["result"]["capabilities"] == {"tools": {}}
    names = {t["name"] for t in replies[2]["result"]["tools"]}
    assert {"observe", "click", "click_xy", "drag", "type_text", "press_key", "scroll", "select_option"} == names
    observed = replies[3]["result"]["content"]
    assert "task: Click the button." in observed[0]["text"] and observed[1]["type"] == "image" and observed[1]["mimeType"] == "image/png" and observed[1]["data"] > 1000
    assert replies[4]["result"]["isError"] is False and "clicked [4] button#subbtn" in replies[4]["result"]["content"][0]["text"]
