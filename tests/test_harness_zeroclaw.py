"""The zeroclaw harness: the config.toml, command and env it generates, and its image layer from a user binary.

ZeroClaw is on no registry reachable here, so nothing runs the real binary in these tests.
"""

from __future__ import annotations

import tomllib

import pytest

from core.env import Task
from core.errors import ConfigError
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses.zeroclaw import CONFIG_DIR, CONFIG_PATH, IMAGE_BINARY, ZeroClawHarness, config_toml

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")


@pytest.fixture
def fake_binary(tmp_path):
    path = tmp_path / "zeroclaw"
    path.write_bytes(b"\x7fELF fake zeroclaw")
    path.chmod(0o755)
    return path


def test_registered_and_versioned_by_binary_content(fake_binary) -> None:
    harness = load_harness("zeroclaw", binary=str(fake_binary))
    assert isinstance(harness, ZeroClawHarness) and harness.protocols == ("chat",)
    assert harness.version.startswith("binary-") and len(harness.version) == len("binary-") + 12
    fake_binary.write_bytes(b"another build")
    assert ZeroClawHarness(binary=str(fake_binary)).version != harness.version
    assert ZeroClawHarness().version == "user-binary"


def test_config_toml_has_provider_agent_and_risk_profile() -> None:
    spec = ZeroClawHarness().launch(HELLO, ENDPOINT, "/workspace")
    config = tomllib.loads(spec.files[CONFIG_PATH])
    assert config["schema_version"] == 3
    provider = config["providers"]["models"]["custom"]["forge"]
    assert provider["uri"] == "http://127.0.0.1:8123/r/tok-abc/v1"
    assert provider["api_key"] == "tok-abc" and provider["model"] == "policy"
    assert provider["wire_api"] == "chat_completions" and provider["native_tools"] is True
    agent = config["agents"]["main"]
    assert agent == {"model_provider": "custom.forge", "risk_profile": "yolo"}
    assert config["risk_profiles"]["yolo"]["level"] == "full"


def test_config_toml_escapes_odd_values_and_takes_options() -> None:
    odd = Endpoint(base_url="http://127.0.0.1:1/r/t", token='k"e\\y', model="we\nird")
    config = tomllib.loads(config_toml(odd, wire_api="responses", timeout_secs=90))
    provider = config["providers"]["models"]["custom"]["forge"]
    assert provider["api_key"] == 'k"e\\y' and provider["model"] == "we\nird"
    assert provider["wire_api"] == "responses" and provider["timeout_secs"] == 90
    assert ZeroClawHarness(wire_api="responses").protocols == ("responses",)
    with pytest.raises(ConfigError, match="wire_api"):
        ZeroClawHarness(wire_api="messages")


def test_command_and_env() -> None:
    spec = ZeroClawHarness().launch(HELLO, ENDPOINT, "/workspace")
    assert spec.command == ["zeroclaw", "agent", "-a", "main", "-m", HELLO.instruction]
    assert spec.workdir == "/workspace"
    assert spec.env["ZEROCLAW_CONFIG_DIR"] == CONFIG_DIR and CONFIG_PATH == f"{CONFIG_DIR}/config.toml"
    assert spec.env["ZEROCLAW_API_KEY"] == "tok-abc"


def test_image_layer_copies_the_user_binary(fake_binary) -> None:
    layer = ZeroClawHarness(binary=str(fake_binary)).image_layer()
    assert layer.name == "zeroclaw"
    assert layer.files == {"zeroclaw": b"\x7fELF fake zeroclaw"}
    assert f"COPY zeroclaw {IMAGE_BINARY}" in layer.dockerfile and f"chmod 755 {IMAGE_BINARY}" in layer.dockerfile


def test_image_layer_without_a_binary_says_how_to_give_one(tmp_path) -> None:
    with pytest.raises(ConfigError, match="harness.binary"):
        ZeroClawHarness().image_layer()
    with pytest.raises(ConfigError, match="does not exist"):
        ZeroClawHarness(binary=str(tmp_path / "missing")).image_layer()


def test_outcome() -> None:
    h = ZeroClawHarness()
    assert h.outcome(ExecResult(0, "hello.txt created", "")).ok
    assert not h.outcome(ExecResult(0, "", "Error: LLM request failed")).ok
    assert not h.outcome(ExecResult(1, "", "boom")).ok
    assert not h.outcome(ExecResult(-1, "", "", timed_out=True)).ok
