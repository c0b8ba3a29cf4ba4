"""The pi harness: what launch() generates, how outcome() reads the json events, and real runs in Docker."""

from __future__ import annotations

import json

import pytest

from core.env import Task
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses import versions
from harnesses.pi import AGENT_DIR, CLI_PATH, PiHarness, run_verdict
from tests.harness_e2e import run_hello

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")


def events(*objs: dict) -> str:
    return "\n".join(json.dumps(o) for o in objs) + "\n"


def assistant(stop: str, error: str | None = None) -> dict:
    message = {"role": "assistant", "content": [], "stopReason": stop}
    if error:
        message["errorMessage"] = error
    return {"type": "message_end", "message": message}


def test_registered_with_pinned_version() -> None:
    harness = load_harness("pi")
    assert isinstance(harness, PiHarness) and harness.protocols == ("chat",)
    assert harness.version == "0.70.0" == versions.version_of(versions.PI)


def test_launch_is_headless_json_offline_and_filters_stream_updates() -> None:
    spec = PiHarness().launch(HELLO, ENDPOINT, "/workspace")
    assert spec.command[:2] == ["bash", "-c"] and spec.workdir == "/workspace"
    script, argv0, argv = spec.command[2], spec.command[3], spec.command[4:]
    assert argv0 == "pi" and 'pi "$@"' in script and "pipefail" in script
    assert '/^{"type":"message_update"/d' in script  # bulky partial-message updates never reach stdout
    assert argv[-1] == HELLO.instruction
    for flag in ("-p", "--no-session", "--offline", "--no-extensions"):
        assert flag in argv
    pairs = set(zip(argv, argv[1:], strict=False))
    assert ("--mode", "json") in pairs and ("--model", "forge/policy") in pairs
    assert spec.env["PI_CODING_AGENT_DIR"] == AGENT_DIR
    assert spec.env["PI_OFFLINE"] == "1" and spec.env["PI_TELEMETRY"] == "0"


def test_models_json_points_the_forge_provider_at_the_proxy() -> None:
    spec = PiHarness(context_window=8192, max_tokens=1024).launch(HELLO, ENDPOINT, "/workspace")
    models = json.loads(spec.files[f"{AGENT_DIR}/models.json"])
    provider = models["providers"]["forge"]
    assert provider["baseUrl"] == "http://127.0.0.1:8123/r/tok-abc/v1"
    assert provider["api"] == "openai-completions" and provider["apiKey"] == "tok-abc"
    assert provider["models"] == [{"id": "policy", "contextWindow": 8192, "maxTokens": 1024}]


def test_thinking_option_is_passed_through() -> None:
    argv = PiHarness(thinking="off").launch(HELLO, ENDPOINT, "/w").command
    assert ("--thinking", "off") in set(zip(argv, argv[1:], strict=False))
    assert "--thinking" not in PiHarness().launch(HELLO, ENDPOINT, "/w").command


def test_image_layer_puts_node_first_then_links_pi(monkeypatch, tmp_path) -> None:
    import core.runtime.recipes as recipes

    asked: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(
        recipes, "npm_tree", lambda name, packages, node_bin=None: asked.append((name, packages)) or tmp_path / name
    )
    layer = PiHarness().image_layer()
    assert layer.name == "pi"
    assert asked == [("node", [versions.NODE]), ("pi", [versions.PI])]
    node_line = layer.dockerfile.index("/usr/local/bin/node")
    pi_line = layer.dockerfile.index(f"ln -sf /opt/forgetui/pi/{CLI_PATH} /usr/local/bin/pi")
    assert node_line < pi_line
    assert set(layer.dirs) == {"npm-node", "npm-pi"}


def test_outcome_reads_the_json_events() -> None:
    pi = PiHarness()
    good = events({"type": "agent_start"}, assistant("toolUse"), assistant("stop"), {"type": "agent_end"})
    assert pi.outcome(ExecResult(0, good, "")).ok
    # exit 0 although every call failed: pi retried, then gave up
    failed = events(assistant("error", "Connection error."), {"type": "auto_retry_start", "attempt": 1},
                    assistant("error", "Connection error."), {"type": "auto_retry_end", "success": False, "finalError": "Connection error."})  # fmt: skip
    out = pi.outcome(ExecResult(0, failed, ""))
    assert not out.ok and "Connection error." in out.detail
    # a retry that worked
    retried = events(
        assistant("error", "boom"),
        {"type": "auto_retry_start"},
        assistant("stop"),
        {"type": "auto_retry_end", "success": True},
    )
    assert pi.outcome(ExecResult(0, retried, "")).ok
    assert not pi.outcome(ExecResult(0, events(assistant("aborted")), "")).ok
    assert not pi.outcome(ExecResult(0, "not json\n", "")).ok
    assert not pi.outcome(ExecResult(1, good, "crash")).ok
    assert not pi.outcome(ExecResult(-1, good, "", timed_out=True)).ok
    assert run_verdict([]) == (False, "pi produced no assistant message")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_scripted_hello_end_to_end(docker_client, base_image, tmp_path) -> None:
    res = run_hello("pi", "scripted", tmp_path)
    res.assert_solved("chat")
    first = res.first_request
    assert first["stream"] is True and first["model"] == "policy"
    assert "bash" in {t["function"]["name"] for t in first["tools"]}
    print(f"pi scripted: {len(res.calls)} calls, call 2 extends call 1: {res.merged}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_tiny_model_keeps_the_protocol(docker_client, base_image, tmp_path) -> None:
    res = run_hello("pi", "builtin:tiny", tmp_path, timeout_s=300)
    res.assert_protocol_kept("chat")
    print(f"pi tiny: status {res.rollout['status']}, {len(res.calls)} calls, merged {res.merged}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_a_policy_that_never_stops_ends_at_run_max_calls(docker_client, base_image, tmp_path) -> None:
    """pi has no cap on its turns: run.max_calls refuses the third call, pi ends on it (no retry), the verifier still scores."""
    loop = [{"tool": "shell", "command": f"echo {i} >> turns.txt"} for i in range(8)]
    res = run_hello("pi", "scripted", tmp_path, script=loop, overrides=("run.max_calls=2",))
    assert [c["seq"] for c in res.calls] == [0, 1] and all(c["status"] == "ok" for c in res.calls)
    assert res.rollout["status"] in ("done", "failed"), res.rollout["error"]  # ended by pi, not by the wall clock
    assert res.rollout["passed"] is False and res.rollout["reward"] == 0.0  # scored: hello.txt was never written
    meta = json.loads(res.rollout["meta"]) if isinstance(res.rollout["meta"], str) else res.rollout["meta"]
    assert meta["calls_refused"] == 1  # a 403 is not retried
    assert "run.max_calls" in meta["stdout_tail"] + meta["stderr_tail"]  # pi says why it stopped
