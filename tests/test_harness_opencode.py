"""The opencode harness: what launch() generates, how outcome() reads the events, and real runs in Docker."""

from __future__ import annotations

import json

import pytest

from core.env import Task
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses import versions
from harnesses.opencode import BINARY_PATH, CONFIG_DIR, CONFIG_HOME, OpenCodeHarness
from tests.harness_e2e import run_hello

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi")
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")


def events(*objs: dict) -> str:
    return "\n".join(json.dumps(o) for o in objs) + "\n"


def test_registered_with_pinned_version() -> None:
    harness = load_harness("opencode")
    assert isinstance(harness, OpenCodeHarness) and harness.protocols == ("chat",)
    assert harness.version == "1.18.33" == versions.version_of(versions.OPENCODE)


def test_launch_runs_headless_auto_approved_in_the_workdir() -> None:
    spec = OpenCodeHarness().launch(HELLO, ENDPOINT, "/workspace")
    argv = spec.command
    assert argv[:2] == ["opencode", "run"] and argv[-1] == HELLO.instruction
    assert "--auto" in argv and spec.workdir == "/workspace"
    pairs = set(zip(argv, argv[1:], strict=False))
    assert {
        ("--format", "json"),
        ("-m", "forge/policy"),
        ("--dir", "/workspace"),
        ("--title", "forgetui"),
    } <= pairs
    assert spec.env["XDG_CONFIG_HOME"] == CONFIG_HOME
    for var in ("OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_DISABLE_DEFAULT_PLUGINS",
                "OPENCODE_DISABLE_LSP_DOWNLOAD", "OPENCODE_DISABLE_SHARE"):  # fmt: skip
        assert spec.env[var] == "1"


def test_title_call_option_drops_the_title_flag() -> None:
    assert "--title" not in OpenCodeHarness(title_call=True).launch(HELLO, ENDPOINT, "/w").command


def test_config_points_the_forge_provider_at_the_proxy() -> None:
    spec = OpenCodeHarness(context_window=8192, max_tokens=1024).launch(HELLO, ENDPOINT, "/workspace")
    config = json.loads(spec.files[f"{CONFIG_DIR}/opencode.json"])
    provider = config["provider"]["forge"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8123/r/tok-abc/v1", "apiKey": "tok-abc"}
    assert provider["models"]["policy"]["limit"] == {"context": 8192, "output": 1024}
    assert (
        config["model"] == "forge/policy" and config["autoupdate"] is False and config["share"] == "disabled"
    )


def test_plugin_install_is_preempted_by_node_modules_and_lockfile() -> None:
    files = OpenCodeHarness().launch(HELLO, ENDPOINT, "/w").files
    assert f"{CONFIG_DIR}/node_modules/.keep" in files
    lock = json.loads(files[f"{CONFIG_DIR}/package-lock.json"])
    assert "@opencode-ai/plugin" in lock["packages"][""]["dependencies"]


def test_image_layer_links_the_native_binary(monkeypatch, tmp_path) -> None:
    import core.runtime.recipes as recipes

    asked: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(
        recipes, "npm_tree", lambda name, packages, node_bin=None: asked.append((name, packages)) or tmp_path / name
    )
    layer = OpenCodeHarness().image_layer()
    assert asked == [("opencode", [versions.OPENCODE])]
    assert f"ln -sf /opt/forgetui/opencode/{BINARY_PATH} /usr/local/bin/opencode" in layer.dockerfile
    assert "/usr/local/bin/node" not in layer.dockerfile  # a Bun binary: no Node at run time


def test_outcome_reads_error_events() -> None:
    oc = OpenCodeHarness()
    good = events(
        {"type": "step_start"},
        {"type": "text", "part": {"text": "done"}},
        {"type": "step_finish", "part": {"reason": "stop"}},
    )
    assert oc.outcome(ExecResult(0, good, "")).ok
    err = {"type": "error", "error": {"name": "APIError", "data": {"message": "Cannot connect to API"}}}
    out = oc.outcome(ExecResult(1, events(err), ""))
    assert not out.ok and "APIError: Cannot connect to API" in out.detail
    assert not oc.outcome(ExecResult(0, events(err), "")).ok  # an error event fails the run even on exit 0
    assert not oc.outcome(ExecResult(-1, good, "", timed_out=True)).ok


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_scripted_hello_end_to_end(docker_client, base_image, tmp_path) -> None:
    res = run_hello("opencode", "scripted", tmp_path)
    res.assert_solved("chat")
    first = res.first_request
    assert first["stream"] is True and "bash" in {
        t["function"]["name"] for t in first["tools"]
    }  # no title call
    print(f"opencode scripted: {len(res.calls)} calls, call 2 extends call 1: {res.merged}")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_tiny_model_keeps_the_protocol(docker_client, base_image, tmp_path) -> None:
    res = run_hello("opencode", "builtin:tiny", tmp_path, timeout_s=300)
    res.assert_protocol_kept("chat")
    print(f"opencode tiny: status {res.rollout['status']}, {len(res.calls)} calls, merged {res.merged}")
