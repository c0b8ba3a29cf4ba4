"""The codex harness: what launch() generates, how outcome() reads `codex exec --json`, and real runs in Docker."""

from __future__ import annotations

import json
import shlex
import tomllib

import pytest

from core.env import Task
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses import versions
from harnesses.codex import BINARY, CONFIG_PATH, INSTRUCTION_PATH, CodexHarness, codex_outcome
from tests.harness_e2e import run_hello

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")


def flags(argv: list[str]) -> list[tuple[str, str]]:
    """(flag, value) pairs of repeatable flags in argv."""
    return [(a, argv[i + 1]) for i, a in enumerate(argv[:-1]) if a in ("-c", "--disable", "-m", "-C", "-o", "--color")]


def test_registered_with_pinned_version() -> None:
    harness = load_harness("codex")
    assert isinstance(harness, CodexHarness)
    assert harness.protocols == ("responses",)
    assert harness.version == "0.171.0" == versions.version_of(versions.CODEX)


def test_launch_command_is_headless_quiet_and_reads_the_instruction_file() -> None:
    spec = CodexHarness().launch(HELLO, ENDPOINT, "/workspace")
    assert spec.command[:2] == ["sh", "-c"] and spec.workdir == "/workspace"
    script, argv = spec.command[2], spec.command[4:]
    assert script == f'exec codex "$@" < {INSTRUCTION_PATH}'  # stdin is a file: Codex never waits on a terminal
    assert shlex.split(script)[:2] == ["exec", "codex"]
    assert argv[0] == "exec" and argv[-1] == "-"  # prompt from stdin
    for flag in ("--skip-git-repo-check", "--ephemeral", "--dangerously-bypass-approvals-and-sandbox", "--json"):
        assert flag in argv
    pairs = flags(argv)
    assert ("-C", "/workspace") in pairs and ("-m", "policy") in pairs
    assert {v for f, v in pairs if f == "--disable"} >= {"plugins", "remote_plugin", "goals", "apps"}
    overrides = {v for f, v in pairs if f == "-c"}
    assert {"analytics.enabled=false", 'web_search="disabled"', "agents.enabled=false", "model_context_window=32768"} <= overrides
    assert HELLO.instruction not in " ".join(spec.command)
    assert spec.files[INSTRUCTION_PATH] == HELLO.instruction
    assert spec.env["CODEX_HOME"] == CONFIG_PATH.rsplit("/", 1)[0]
    assert spec.env["FORGE_API_KEY"] == "tok-abc"
    assert "OPENAI_BASE_URL" not in spec.env  # Codex ignores it; the provider in config.toml is what counts


def test_config_toml_points_the_forge_provider_at_the_proxy() -> None:
    spec = CodexHarness(context_window=8192, reasoning_effort="low").launch(HELLO, ENDPOINT, "/workspace")
    config = tomllib.loads(spec.files[CONFIG_PATH])
    assert config["model"] == "policy" and config["model_provider"] == "forge"
    assert config["model_context_window"] == 8192 and config["model_reasoning_effort"] == "low"
    provider = config["model_providers"]["forge"]
    assert provider["base_url"] == "http://127.0.0.1:8123/r/tok-abc/v1"
    assert provider["wire_api"] == "responses" and provider["env_key"] == "FORGE_API_KEY"
    assert config["approval_policy"] == "never" and config["sandbox_mode"] == "danger-full-access"
    assert config["analytics"]["enabled"] is False and config["check_for_update_on_startup"] is False
    assert config["web_search"] == "disabled" and config["agents"]["enabled"] is False
    assert not any(config["features"].values())
    assert "-c" in spec.command and "model_context_window=8192" in spec.command


def test_config_toml_escapes_odd_model_names() -> None:
    odd = Endpoint(base_url="http://127.0.0.1:1/r/t", token="t", model='we"ird\\name')
    config = tomllib.loads(CodexHarness().config_toml(odd))
    assert config["model"] == 'we"ird\\name'


def test_image_layer_links_the_native_binary(monkeypatch, tmp_path) -> None:
    import core.runtime.recipes as recipes

    asked: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(recipes, "npm_tree", lambda name, packages, node_bin=None: asked.append((name, packages)) or tmp_path / name)
    layer = CodexHarness().image_layer()
    assert layer.name == "codex"
    assert f"ln -sf /opt/forgetui/codex/{BINARY} /usr/local/bin/codex" in layer.dockerfile
    assert "node" not in layer.dockerfile.replace("node_modules", "")  # native: no Node at run time
    assert asked == [("codex", [versions.CODEX])]


def events(*objs: dict) -> str:
    return "\n".join(json.dumps(o) for o in objs) + "\n"


def test_outcome_reads_the_event_stream() -> None:
    good = events(
        {"type": "thread.started", "thread_id": "t"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "error", "message": "Model metadata for `policy` not found."}},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "Done."}},
        {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}},
    )
    ok = codex_outcome(ExecResult(0, good, ""))
    assert ok.ok and "Done." in ok.detail
    failed = events({"type": "turn.started"}, {"type": "error", "message": "stream disconnected"}, {"type": "turn.failed", "error": {"message": "Incomplete response returned"}})
    bad = codex_outcome(ExecResult(1, failed, "boom"))
    assert not bad.ok and "Incomplete response returned" in bad.detail and "stream disconnected" in bad.detail
    assert not codex_outcome(ExecResult(0, events({"type": "turn.started"}), "")).ok  # exit 0 without a completed turn
    assert not codex_outcome(ExecResult(0, "not json\n", "")).ok
    assert not codex_outcome(ExecResult(-1, good, "", timed_out=True)).ok


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the 424 MB npm tree
def test_scripted_hello_end_to_end(docker_client, base_image, tmp_path) -> None:
    res = run_hello("codex", "scripted", tmp_path)
    res.assert_solved("responses")
    first = res.first_request
    assert first["stream"] is True
    assert {t.get("name") for t in first["tools"]} >= {"exec_command"}
    assert not {"web_search", "namespace"} & {t.get("type") for t in first["tools"]}
    print(f"codex scripted: {len(res.calls)} calls, call 2 extends call 1: {res.merged}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_tiny_model_keeps_the_protocol(docker_client, base_image, tmp_path) -> None:
    res = run_hello("codex", "builtin:tiny", tmp_path, options={"context_window": 65536}, timeout_s=600)
    res.assert_protocol_kept("responses")
    print(f"codex tiny: status {res.rollout['status']}, {len(res.calls)} calls, merged {res.merged}")
