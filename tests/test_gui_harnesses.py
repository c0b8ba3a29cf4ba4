"""External harnesses on a GUI task: Codex, Claude Code and OpenClaw act through the sandbox's `gui` CLI, told how
by the instruction file each reads (AGENTS.md, CLAUDE.md, a skill), on a MiniWoB++ page in real Chromium, scripted backend.
Claude Code, Codex, opencode, Gemini CLI and OpenClaw also start the task's MCP server (`gui-mcp`) and act through its tools."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from core.env import McpServer, Task
from core.harness import Endpoint
from envs.desktop import DesktopEnv
from envs.miniwob import MiniWoBEnv
from envs.miniwob.image import MCP_PATH
from harnesses.claude_code import MCP_CONFIG_PATH, ClaudeCodeHarness
from harnesses.codex import CONFIG_PATH, CodexHarness
from harnesses.gemini_cli import SETTINGS_PATH as GEMINI_SETTINGS_PATH
from harnesses.gemini_cli import GeminiCliHarness
from harnesses.openclaw import CONFIG_PATH as OPENCLAW_CONFIG_PATH
from harnesses.openclaw import OpenClawHarness
from harnesses.opencode import CONFIG_DIR as OPENCODE_CONFIG_DIR
from harnesses.opencode import OpenCodeHarness

# the scripted policy calls whichever shell tool the harness offers: look, then click the button (id 4 on click-test)
SCRIPT = [
    {"tool": "shell", "command": "gui observe --no-screenshot"},
    {"tool": "shell", "command": "gui click 4"},
    {"text": "I clicked the button; the page ended the episode."},
]


def test_every_task_ships_the_instruction_files_harnesses_read() -> None:
    task = MiniWoBEnv(names="click-test").tasks()[0]
    for name in ("AGENTS.md", "CLAUDE.md", ".agents/skills/gui/SKILL.md"):
        text = str(task.files[name])
        assert "gui observe" in text and "gui click ID" in text and "gui select ID" in text
    assert str(task.files[".agents/skills/gui/SKILL.md"]).startswith("---\nname: gui\ndescription: ")  # a skill's frontmatter


def _run(harness: str, tmp_path: Path, turns: list[dict[str, Any]] = SCRIPT) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    import duckdb

    from core.config import load_config
    from core.run import execute_run

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": turns}))
    sets = [
        "env.name=miniwob", 'env.options.names=["click-test"]', f'harness.name="{harness}"',
        f'policy.backend="scripted:{script}"', "runtime.kind=docker", "run.max_retries=0", "run.timeout_s=300",
    ]  # fmt: skip
    summary = asyncio.run(execute_run(load_config(None, sets)))
    con = duckdb.connect(summary.store, read_only=True)
    try:
        cur = con.execute("SELECT status, reward, passed, error, meta FROM rollouts")
        rollout = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
        cur = con.execute("SELECT seq, status, request FROM calls_full ORDER BY seq")
        calls = [dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()
    return summary, rollout, calls


def _request_text(call: dict[str, Any]) -> str:
    body = call["request"]
    return body if isinstance(body, str) else json.dumps(body)


# what each harness reads into the model's context: its instruction file (the heading is in no prompt), or
# for OpenClaw the skill (its exec mode reads no AGENTS.md; the skill's description is listed in its system prompt)
READS = {"codex": "# Working in this sandbox", "claude-code": "# Working in this sandbox", "openclaw": "with the `gui` shell command"}


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the harness's npm tree
@pytest.mark.parametrize("harness", ["codex", "claude-code", pytest.param("openclaw", marks=pytest.mark.slow)])
def test_external_harness_solves_a_miniwob_task_through_the_gui_cli(harness: str, docker_client, base_image, tmp_path: Path) -> None:
    summary, rollout, calls = _run(harness, tmp_path)
    assert (rollout["status"], rollout["reward"], rollout["passed"]) == ("done", 1.0, True), (rollout["error"], rollout["meta"])
    assert len(calls) == 3 and all(c["status"] == "ok" for c in calls)
    assert READS[harness] in _request_text(calls[0])
    # the harness ran `gui observe` and the model saw the page's text form in the tool result of the next call
    second = _request_text(calls[1])
    assert "task: Click the button." in second and "button#subbtn" in second
    third = _request_text(calls[2])
    assert "clicked [4] button#subbtn" in third and "the episode is over: reward" in third


# the same two actions through the MCP server: both harnesses show its tools to the model as mcp__<server>__<tool>
MCP_SCRIPT = [
    {"tool_call": {"name": "mcp__gui__observe", "arguments": {}}},
    {"tool_call": {"name": "mcp__gui__click", "arguments": {"id": 4}}},
    {"text": "I clicked the button through the gui tools; the page ended the episode."},
]
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok", token="tok")


def test_gui_tasks_offer_the_gui_mcp_server() -> None:
    for task in (MiniWoBEnv(names="click-test").tasks()[0], DesktopEnv(names="term-exit").tasks()[0]):
        assert task.mcp_servers == {"gui": McpServer(command=MCP_PATH)}


def test_claude_code_passes_the_tasks_mcp_servers_and_only_those() -> None:
    task = MiniWoBEnv(names="click-test").tasks()[0]
    spec = ClaudeCodeHarness().launch(task, ENDPOINT, "/workspace")
    assert json.loads(spec.files[MCP_CONFIG_PATH]) == {"mcpServers": {"gui": {"type": "stdio", "command": MCP_PATH, "args": []}}}
    argv = spec.command[5:]
    at = argv.index("--mcp-config")
    assert argv[at + 1 : at + 3] == [MCP_CONFIG_PATH, "--strict-mcp-config"] and "--dangerously-skip-permissions" in argv
    # no servers on the task, or the option off: no config file, no flag
    for off in (ClaudeCodeHarness(mcp=False).launch(task, ENDPOINT, "/w"), ClaudeCodeHarness().launch(Task(id="t", instruction="x"), ENDPOINT, "/w")):
        assert MCP_CONFIG_PATH not in off.files and "--mcp-config" not in off.command


def test_codex_config_toml_starts_the_tasks_mcp_servers() -> None:
    task = MiniWoBEnv(names="click-test").tasks()[0]
    config = tomllib.loads(str(CodexHarness().launch(task, ENDPOINT, "/workspace").files[CONFIG_PATH]))
    assert config["mcp_servers"] == {"gui": {"command": MCP_PATH, "args": [], "startup_timeout_sec": 30, "tool_timeout_sec": 150}}
    assert config["model_providers"]["forge"]["base_url"] == ENDPOINT.openai_base  # the rest of the config is unchanged
    assert "mcp_servers" not in tomllib.loads(str(CodexHarness(mcp=False).launch(task, ENDPOINT, "/w").files[CONFIG_PATH]))


def _body(call: dict[str, Any]) -> dict[str, Any]:
    """A recorded call's request body as the harness sent it."""
    return call["request"] if isinstance(call["request"], dict) else json.loads(call["request"])


def _tool_names(call: dict[str, Any]) -> list[str]:
    """The names of the tools a recorded request offered (a Codex namespace as namespace/tool)."""
    names = []
    for tool in _body(call).get("tools") or []:
        names += [f"{tool['name']}/{t['name']}" for t in tool.get("tools", [])] if tool.get("type") == "namespace" else [str(tool.get("name"))]
    return names


# what the model saw after each MCP call: gui-mcp's observe text, with the screenshot as an image (stored as a blob:
# the CLI path above observes with --no-screenshot), then the click's result
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_claude_code_solves_a_miniwob_task_through_the_gui_mcp_server(docker_client, base_image, tmp_path: Path) -> None:
    summary, rollout, calls = _run("claude-code", tmp_path, MCP_SCRIPT)
    assert (rollout["status"], rollout["reward"], rollout["passed"]) == ("done", 1.0, True), (rollout["error"], rollout["meta"])
    assert len(calls) == 3 and all(c["status"] == "ok" for c in calls)
    assert {"mcp__gui__observe", "mcp__gui__click", "mcp__gui__type_text", "Bash"} <= set(_tool_names(calls[0]))
    messages = _body(calls[1])["messages"]
    use, result = messages[-2]["content"][0], messages[-1]["content"][0]
    assert (use["type"], use["name"], result["type"], result["tool_use_id"]) == ("tool_use", "mcp__gui__observe", "tool_result", use["id"])
    text, image = result["content"]
    assert "task: Click the button." in text["text"] and "[4] button#subbtn" in text["text"]
    assert image["type"] == "image" and image["source"]["forgetui_blob"].startswith("sha256:")
    messages = _body(calls[2])["messages"]
    use, result = messages[-2]["content"][0], messages[-1]["content"][0]
    assert (use["name"], use["input"], result["tool_use_id"]) == ("mcp__gui__click", {"id": 4}, use["id"])
    assert "clicked [4] button#subbtn" in result["content"][0]["text"] and "the episode is over: reward" in result["content"][0]["text"]


def _codex_call(call: dict[str, Any], name: str) -> tuple[dict[str, Any], str]:
    """The function_call item of MCP tool `name` in a recorded Codex request, and the text of its output."""
    items = _body(call)["input"]
    use = next(i for i in items if i.get("type") == "function_call" and name in (f"{i.get('namespace')}__{i.get('name')}", i.get("name")))
    output = next(i["output"] for i in items if i.get("type") == "function_call_output" and i.get("call_id") == use["call_id"])
    return use, output if isinstance(output, str) else json.dumps(output)


# Codex offers MCP tools as one Responses `namespace` tool (mcp__gui, its tools observe, click, ...) and runs a call
# only when it names the namespace: the proxy flattens the namespace for the policy and splits the name back


@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_codex_solves_a_miniwob_task_through_the_gui_mcp_server(docker_client, base_image, tmp_path: Path) -> None:
    summary, rollout, calls = _run("codex", tmp_path, MCP_SCRIPT)
    assert calls and all(c["status"] == "ok" for c in calls)
    assert {"mcp__gui/observe", "mcp__gui/click", "mcp__gui/type_text", "exec_command"} <= set(_tool_names(calls[0]))
    assert (rollout["status"], rollout["reward"], rollout["passed"]) == ("done", 1.0, True), (rollout["error"], rollout["meta"])
    assert len(calls) == 3
    use, output = _codex_call(calls[1], "mcp__gui__observe")
    assert "task: Click the button." in output and "[4] button#subbtn" in output and "screenshot: /tmp/forgetui-gui/" in output
    use, output = _codex_call(calls[2], "mcp__gui__click")
    assert json.loads(use["arguments"]) == {"id": 4} and "clicked [4] button#subbtn" in output and "the episode is over: reward" in output


def test_opencode_config_starts_the_tasks_mcp_servers() -> None:
    task = MiniWoBEnv(names="click-test").tasks()[0]
    path = f"{OPENCODE_CONFIG_DIR}/opencode.json"
    config = json.loads(OpenCodeHarness().launch(task, ENDPOINT, "/workspace").files[path])
    assert config["mcp"] == {"gui": {"type": "local", "command": [MCP_PATH], "enabled": True, "timeout": 150_000}}
    assert config["provider"]["forge"]["options"]["baseURL"] == ENDPOINT.openai_base  # the rest of the config is unchanged
    for off in (OpenCodeHarness(mcp=False).launch(task, ENDPOINT, "/w"), OpenCodeHarness().launch(Task(id="t", instruction="x"), ENDPOINT, "/w")):
        assert "mcp" not in json.loads(off.files[path])


def test_gemini_cli_settings_start_and_trust_the_tasks_mcp_servers() -> None:
    task = MiniWoBEnv(names="click-test").tasks()[0]
    spec = GeminiCliHarness().launch(task, ENDPOINT, "/workspace")
    settings = json.loads(spec.files[GEMINI_SETTINGS_PATH])
    assert settings["mcpServers"] == {"gui": {"command": MCP_PATH, "args": [], "timeout": 150_000, "trust": True}}
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key" and "--yolo" in spec.command
    for off in (GeminiCliHarness(mcp=False).launch(task, ENDPOINT, "/w"), GeminiCliHarness().launch(Task(id="t", instruction="x"), ENDPOINT, "/w")):
        assert "mcpServers" not in json.loads(off.files[GEMINI_SETTINGS_PATH])


def test_openclaw_config_starts_the_tasks_mcp_servers() -> None:
    task = MiniWoBEnv(names="click-test").tasks()[0]
    config = json.loads(OpenClawHarness().launch(task, ENDPOINT, "/workspace").files[OPENCLAW_CONFIG_PATH])
    assert config["mcp"] == {"servers": {"gui": {"command": MCP_PATH, "args": [], "requestTimeoutMs": 150_000}}}
    assert config["tools"] == {"toolSearch": False}  # the MCP tools as direct schemas, not deferred behind tool_search
    assert config["models"]["providers"]["forge"]["baseUrl"] == ENDPOINT.openai_base
    for off in (OpenClawHarness(mcp=False).launch(task, ENDPOINT, "/w"), OpenClawHarness().launch(Task(id="t", instruction="x"), ENDPOINT, "/w")):
        assert "mcp" not in (off_config := json.loads(off.files[OPENCLAW_CONFIG_PATH])) and "tools" not in off_config
    searched = json.loads(OpenClawHarness(tool_search={"mode": "directory"}).launch(task, ENDPOINT, "/w").files[OPENCLAW_CONFIG_PATH])
    assert searched["tools"] == {"toolSearch": {"mode": "directory"}}


# the tool names opencode, Gemini CLI and OpenClaw show the model for gui-mcp's tools (read from their recorded first
# requests), and each one's own shell tool next to them
MCP_NAMES = {"opencode": "gui_{}", "gemini-cli": "mcp_gui_{}", "openclaw": "gui__{}"}
SHELL_TOOLS = {"opencode": "bash", "gemini-cli": "run_shell_command", "openclaw": "exec"}


def _mcp_script(harness: str) -> list[dict[str, Any]]:
    """MCP_SCRIPT under the tool names `harness` gives gui-mcp's tools."""
    name = MCP_NAMES[harness].format
    return [
        {"tool_call": {"name": name("observe"), "arguments": {}}},
        {"tool_call": {"name": name("click"), "arguments": {"id": 4}}},
        {"text": "I clicked the button through the gui tools; the page ended the episode."},
    ]


def _offered(call: dict[str, Any]) -> set[str]:
    """The tool names a recorded chat-completions or Gemini request offered."""
    tools = _body(call).get("tools") or []
    return {t["function"]["name"] for t in tools if "function" in t} | {f["name"] for t in tools for f in t.get("functionDeclarations", [])}


def _chat_exchange(call: dict[str, Any], name: str) -> tuple[dict[str, Any], str, list[Any]]:
    """The arguments of tool call `name` in a recorded chat request, the text of its result, and no images."""
    messages = _body(call)["messages"]
    use = next(c for m in messages for c in m.get("tool_calls") or [] if c["function"]["name"] == name)
    result = next(m["content"] for m in messages if m.get("role") == "tool" and m.get("tool_call_id") == use["id"])
    return json.loads(use["function"]["arguments"]), result if isinstance(result, str) else json.dumps(result), []


def _gemini_exchange(call: dict[str, Any], name: str) -> tuple[dict[str, Any], str, list[Any]]:
    """The arguments of function call `name` in a recorded Gemini request, its response text, and the images after it."""
    contents = _body(call)["contents"]
    use = next(p["functionCall"] for c in contents for p in c["parts"] if p.get("functionCall", {}).get("name") == name)
    turn = next(c["parts"] for c in contents if any(p.get("functionResponse", {}).get("id") == use["id"] for p in c["parts"]))
    response = next(p["functionResponse"]["response"] for p in turn if "functionResponse" in p)
    return use["args"], json.dumps(response), [p["inlineData"] for p in turn if "inlineData" in p]


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("harness", ["opencode", "gemini-cli", "openclaw"])
def test_harness_solves_a_miniwob_task_through_the_gui_mcp_server(harness: str, docker_client, base_image, tmp_path: Path) -> None:
    summary, rollout, calls = _run(harness, tmp_path, _mcp_script(harness))
    assert calls and all(c["status"] == "ok" for c in calls)
    name = MCP_NAMES[harness].format
    assert {name("observe"), name("click"), name("type_text"), SHELL_TOOLS[harness]} <= _offered(calls[0])
    assert (rollout["status"], rollout["reward"], rollout["passed"]) == ("done", 1.0, True), (rollout["error"], rollout["meta"])
    assert len(calls) == 3
    exchange = _gemini_exchange if harness == "gemini-cli" else _chat_exchange
    args, text, images = exchange(calls[1], name("observe"))
    assert args == {} and "task: Click the button." in text and "[4] button#subbtn" in text
    if harness == "gemini-cli":  # the screenshot follows the function response (opencode and OpenClaw declare a text-only model)
        assert images and images[0]["forgetui_blob"].startswith("sha256:")
    args, text, _ = exchange(calls[2], name("click"))
    assert args == {"id": 4} and "clicked [4] button#subbtn" in text and "the episode is over: reward" in text
