"""The gemini-cli harness: what launch() generates, how outcome() reads `-o json`, and real runs in Docker."""

from __future__ import annotations

import json

import pytest

from core.env import Task
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses import versions
from harnesses.gemini_cli import BIN_PATH, HOME_DIR, SETTINGS_PATH, GeminiCliHarness, parse_json_output
from tests.harness_e2e import run_hello

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")


def test_registered_with_pinned_version() -> None:
    harness = load_harness("gemini-cli")
    assert isinstance(harness, GeminiCliHarness)
    assert harness.protocols == ("gemini",)
    assert harness.version == "0.61.0" == versions.version_of(versions.GEMINI_CLI)


def test_launch_command_is_headless_yolo_json() -> None:
    spec = GeminiCliHarness().launch(HELLO, ENDPOINT, "/workspace")
    argv = spec.command
    assert argv[0] == "gemini" and spec.workdir == "/workspace"
    assert argv[argv.index("-p") + 1] == HELLO.instruction
    assert argv[argv.index("-m") + 1] == "policy"
    assert argv[argv.index("-o") + 1] == "json"
    assert {"--yolo", "--skip-trust"} <= set(argv)


def test_env_points_at_the_proxy_without_v1_and_turns_telemetry_off() -> None:
    env = GeminiCliHarness().launch(HELLO, ENDPOINT, "/workspace").env
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:8123/r/tok-abc"  # the CLI adds /v1beta/models/...
    assert env["GEMINI_API_KEY"] == "tok-abc"
    assert env["GEMINI_CLI_HOME"] == HOME_DIR and SETTINGS_PATH == f"{HOME_DIR}/.gemini/settings.json"
    assert env["GEMINI_TELEMETRY_ENABLED"] == "false"
    assert env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"


def test_settings_select_api_key_auth_and_disable_phoning_home() -> None:
    spec = GeminiCliHarness(max_session_turns=12).launch(HELLO, ENDPOINT, "/workspace")
    settings = json.loads(spec.files[SETTINGS_PATH])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"  # else exit 41
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False and settings["general"]["enableAutoUpdateNotification"] is False
    assert settings["model"]["maxSessionTurns"] == 12
    assert "model" not in json.loads(GeminiCliHarness().launch(HELLO, ENDPOINT, "/w").files[SETTINGS_PATH])


def test_image_layer_puts_node_first_and_links_the_cli(monkeypatch, tmp_path) -> None:
    import core.runtime.recipes as recipes

    asked: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(recipes, "npm_tree", lambda name, packages, node_bin=None: asked.append((name, packages)) or tmp_path / name)
    layer = GeminiCliHarness().image_layer()
    assert asked == [("node", [versions.NODE]), ("gemini-cli", [versions.GEMINI_CLI])]
    assert layer.name == "gemini-cli" and set(layer.dirs) == {"npm-node", "npm-gemini-cli"}
    lines = layer.dockerfile.splitlines()
    node_link = next(i for i, line in enumerate(lines) if line.endswith("/usr/local/bin/node"))
    cli_link = lines.index(f"RUN ln -sf /opt/forgetui/gemini-cli/{BIN_PATH} /usr/local/bin/gemini")
    assert node_link < cli_link


def test_outcome_reads_the_json_report() -> None:
    h = GeminiCliHarness()
    good = json.dumps({"session_id": "s", "response": "I created hello.txt", "stats": {"models": {}}})
    ok = h.outcome(ExecResult(0, "YOLO mode is enabled.\n" + good, ""))
    assert ok.ok and "I created hello.txt" in ok.detail
    bad = json.dumps({"response": None, "error": {"type": "ApiError", "message": "400 Bad Request", "code": 1}})
    failed = h.outcome(ExecResult(1, bad, "Attempt 1 failed"))
    assert not failed.ok and "400 Bad Request" in failed.detail
    assert not h.outcome(ExecResult(0, json.dumps({"response": "x", "error": {"message": "boom"}}), "")).ok
    auth = h.outcome(ExecResult(41, "", "Please set an Auth method"))
    assert not auth.ok and "authentication" in auth.detail
    assert not h.outcome(ExecResult(-1, good, "", timed_out=True)).ok
    assert parse_json_output("no json here") == {}
    assert parse_json_output('warn {oops\n{"response": "r"}') == {"response": "r"}


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_scripted_hello_end_to_end(docker_client, base_image, tmp_path) -> None:
    res = run_hello("gemini-cli", "scripted", tmp_path)
    res.assert_solved("gemini")
    print(f"gemini-cli: {len(res.calls)} calls, merged={res.merged}, meta={res.rollout['meta']}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_tiny_model_plumbing_holds(docker_client, base_image, tmp_path) -> None:
    res = run_hello("gemini-cli", "builtin:tiny", tmp_path, timeout_s=240)
    res.assert_protocol_kept("gemini")
    print(f"gemini-cli tiny: {len(res.calls)} calls, merged={res.merged}, meta={res.rollout['meta']}")
