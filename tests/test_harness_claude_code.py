"""The claude-code harness: what launch() generates, how outcome() reads `--output-format json`, and real runs in Docker."""

from __future__ import annotations

import json

import pytest

from core.env import Task
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses import versions
from harnesses.claude_code import BINARY, INSTRUCTION_PATH, SETTINGS_PATH, ClaudeCodeHarness, claude_outcome
from tests.harness_e2e import run_hello

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")


def test_registered_with_pinned_version() -> None:
    harness = load_harness("claude-code")
    assert isinstance(harness, ClaudeCodeHarness)
    assert harness.protocols == ("messages",)
    assert harness.version == "2.1.197" == versions.version_of(versions.CLAUDE_CODE)


def test_launch_command_runs_headless_in_the_workspace() -> None:
    spec = ClaudeCodeHarness(max_turns=7, tools=["Bash", "Read"]).launch(HELLO, ENDPOINT, "/workspace")
    assert spec.command[:2] == ["sh", "-c"] and spec.workdir == "/workspace"
    script, argv = spec.command[2], spec.command[4:]
    assert script.endswith(f'exec claude "$@" < {INSTRUCTION_PATH}')  # stdin is a file, never a terminal
    assert argv[0] == "/workspace"  # cd'ed into first: Claude Code works in its cwd
    argv = argv[1:]
    for flag in ("-p", "--dangerously-skip-permissions", "--no-session-persistence"):
        assert flag in argv
    pairs = dict(zip(argv, argv[1:], strict=False))
    assert pairs["--output-format"] == "json" and pairs["--model"] == "claude-sonnet-4-5"
    assert pairs["--max-turns"] == "7" and pairs["--tools"] == "Bash,Read"
    assert pairs["--settings"] == SETTINGS_PATH
    assert HELLO.instruction not in " ".join(spec.command)
    assert spec.files[INSTRUCTION_PATH] == HELLO.instruction
    settings = json.loads(spec.files[SETTINGS_PATH])
    assert settings["autoUpdates"] is False and settings["permissions"]["defaultMode"] == "bypassPermissions"


def test_env_points_at_the_proxy_with_a_plain_body_and_no_traffic() -> None:
    env = ClaudeCodeHarness().launch(HELLO, ENDPOINT, "/workspace").env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123/r/tok-abc"  # no /v1: Claude Code adds it
    assert env["ANTHROPIC_API_KEY"] == "tok-abc"
    models = {env[k] for k in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")}
    assert models == {"claude-sonnet-4-5"}
    assert env["IS_SANDBOX"] == "1"  # root + --dangerously-skip-permissions
    for key in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING", "DISABLE_AUTOUPDATER",
                "CLAUDE_CODE_DISABLE_THINKING", "DISABLE_PROMPT_CACHING", "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS"):  # fmt: skip
        assert env[key] == "1", key
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    assert env["CLAUDE_CONFIG_DIR"] == SETTINGS_PATH.rsplit("/", 1)[0]
    custom = ClaudeCodeHarness(model="claude-opus-4-1", max_output_tokens=2048).launch(HELLO, ENDPOINT, "/w").env
    assert custom["ANTHROPIC_MODEL"] == "claude-opus-4-1" and custom["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "2048"


def test_image_layer_links_the_native_binary(monkeypatch, tmp_path) -> None:
    import core.runtime.recipes as recipes

    asked: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(recipes, "npm_tree", lambda name, packages, node_bin=None: asked.append((name, packages)) or tmp_path / name)
    layer = ClaudeCodeHarness().image_layer()
    assert layer.name == "claude-code" and asked == [("claude-code", [versions.CLAUDE_CODE])]
    assert f"ln -sf /opt/forgetui/claude-code/{BINARY} /usr/local/bin/claude" in layer.dockerfile
    assert "node" not in layer.dockerfile.replace("node_modules", "")  # native: no Node at run time


def result(**fields) -> str:
    return json.dumps({"type": "result", "subtype": "success", "is_error": False, "num_turns": 2, "result": "Done.", **fields}) + "\n"


def test_outcome_reads_the_json_result() -> None:
    ok = claude_outcome(ExecResult(0, result(), ""))
    assert ok.ok and "success after 2 turns: Done." == ok.detail
    api_error = claude_outcome(ExecResult(1, result(is_error=True, result="API Error: 500 boom"), ""))
    assert not api_error.ok and "API Error: 500 boom" in api_error.detail
    turns = claude_outcome(ExecResult(1, result(subtype="error_max_turns", is_error=True, result=None), ""))
    assert not turns.ok and "error_max_turns" in turns.detail
    assert not claude_outcome(ExecResult(0, result(is_error=True), "")).ok
    missing = claude_outcome(ExecResult(1, "", "Error: Invalid API key"))
    assert not missing.ok and "Invalid API key" in missing.detail
    assert not claude_outcome(ExecResult(-1, result(), "", timed_out=True)).ok


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the 235 MB npm tree
def test_scripted_hello_end_to_end(docker_client, base_image, tmp_path) -> None:
    res = run_hello("claude-code", "scripted", tmp_path)
    res.assert_solved("messages")
    first = res.first_request
    assert first["model"] == "claude-sonnet-4-5" and first["stream"] is True
    assert "thinking" not in first and "Bash" in {t["name"] for t in first["tools"]}
    assert all(m["role"] in ("user", "assistant") for m in first["messages"])  # the plain body: system apart
    print(f"claude-code scripted: {len(res.calls)} calls, call 2 extends call 1: {res.merged}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_tiny_model_keeps_the_protocol(docker_client, base_image, tmp_path) -> None:
    # fewer tools and a small output cap keep the CPU model's work small; the protocol is the same.
    # The random model runs into max_tokens: Claude Code asks it to continue (3 times), then gives up.
    options = {"tools": ["Bash", "Read", "Write"], "max_turns": 2, "max_output_tokens": 64}
    res = run_hello("claude-code", "builtin:tiny", tmp_path, options=options, timeout_s=600)
    res.assert_protocol_kept("messages")
    print(f"claude-code tiny: status {res.rollout['status']}, {len(res.calls)} calls, merged {res.merged}")
