"""The mini-swe-agent harness: what launch() generates, how outcome() reads the trajectory status, and real runs in Docker."""

from __future__ import annotations

import subprocess

import pytest

from core.env import Task
from core.harness import Endpoint
from core.registry import load_harness
from core.runtime.base import ExecResult
from harnesses import versions
from harnesses.mini_swe_agent import (
    CLI_MODULE,
    LAUNCHER,
    PROXY_MODEL_CLASS,
    PROXY_MODEL_CONTEXT,
    PROXY_MODEL_FILE,
    SITE,
    STATUS_MARK,
    TRAJECTORY_PATH,
    MiniSweAgentHarness,
    exit_status,
)
from tests.harness_e2e import run_hello

HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace", timeout_s=120)
ENDPOINT = Endpoint(base_url="http://127.0.0.1:8123/r/tok-abc", token="tok-abc", model="policy")
# mini-swe-agent only finishes when the model runs the submit command on its own
SCRIPT = [
    {"tool": "shell", "command": "echo hi > hello.txt"},
    {"tool": "shell", "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
    {"text": "Done."},
]


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def python_in_image(docker_client, base_image, code: str, **env: str) -> list[str]:
    """`code` run by python3 in a fresh container of the harness's image (mini's packages on the path, no network): its output lines."""
    from core.runtime.images import ensure_image

    tag = ensure_image(docker_client, base_image, [MiniSweAgentHarness().image_layer()])
    out = docker_client.containers.run(
        tag, ["python3", "-c", code], remove=True, network_mode="none", environment={"PYTHONPATH": SITE, **env},
    )  # fmt: skip
    return out.decode().strip().splitlines()


def test_registered_with_pinned_version() -> None:
    harness = load_harness("mini-swe-agent")
    assert isinstance(harness, MiniSweAgentHarness)
    assert harness.protocols == ("chat",)
    assert harness.version == "2.4.6" == versions.version_of(versions.MINI_SWE_AGENT)


def test_launch_command_is_headless_and_points_at_the_proxy() -> None:
    spec = MiniSweAgentHarness(step_limit=7, command_timeout=20).launch(HELLO, ENDPOINT, "/workspace")
    assert spec.command[:3] == ["sh", "-c", LAUNCHER] and spec.command[3] == "mini"
    argv = spec.command[4:]
    assert pairs(argv, "-m") == ["policy"]  # forgetui's model class: no LiteLLM provider prefix
    assert pairs(argv, "-t") == [HELLO.instruction]
    assert {"--yolo", "--exit-immediately"} <= set(argv)
    assert pairs(argv, "--cost-limit") == ["0"] and pairs(argv, "-o") == [TRAJECTORY_PATH]
    specs = pairs(argv, "-c")
    assert specs[0] == "mini.yaml"  # the built-in config first: -c replaces the default
    assert "model.model_kwargs.api_base=http://127.0.0.1:8123/r/tok-abc/v1" in specs
    assert {"environment.cwd=/workspace", "environment.timeout=20", "agent.step_limit=7", "agent.wall_time_limit_seconds=120"} <= set(specs)
    assert f"model.model_class={PROXY_MODEL_CLASS}" in specs
    assert spec.workdir == "/workspace" and spec.files == {}
    env = spec.env
    assert env["OPENAI_API_KEY"] == "tok-abc"
    assert env["MSWEA_CONFIGURED"] == "true" and env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"  # no cost-map fetch from GitHub
    assert env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] == "3"


def test_the_litellm_client_keeps_minis_own_model() -> None:
    """client = "litellm": mini's default LiteLLM model, the `openai/` provider prefix, no model_class spec."""
    argv = MiniSweAgentHarness(client="litellm").launch(HELLO, ENDPOINT, "/workspace").command[4:]
    assert pairs(argv, "-m") == ["openai/policy"]
    specs = pairs(argv, "-c")
    assert not any(s.startswith("model.model_class=") for s in specs)
    assert "model.model_kwargs.api_base=http://127.0.0.1:8123/r/tok-abc/v1" in specs
    # auto: forgetui's client on mini 2.x (the pinned release), LiteLLM on 1.x (text-based models, no BASH_TOOL to reuse)
    assert MiniSweAgentHarness().client() == "requests" == MiniSweAgentHarness(version="2.0.0").client()
    old = MiniSweAgentHarness(version="1.17.3")
    assert old.client() == "litellm" and pairs(old.launch(HELLO, ENDPOINT, "/w").command[4:], "-m") == ["openai/policy"]
    assert MiniSweAgentHarness(version="1.17.3", client="requests").client() == "requests"  # asked for: kept
    # a user's own spec comes after ours, so it wins (mini applies -c specs in order)
    mine = MiniSweAgentHarness(extra_config=["model.model_class=mypkg.MyModel"]).launch(HELLO, ENDPOINT, "/w").command[4:]
    classes = [s for s in pairs(mine, "-c") if s.startswith("model.model_class=")]
    assert classes == [f"model.model_class={PROXY_MODEL_CLASS}", "model.model_class=mypkg.MyModel"]


def test_config_specs_parse_as_mini_does() -> None:
    """mini reads `key=value` specs with json.loads on the value: numbers must come out as numbers."""
    import json

    specs = MiniSweAgentHarness().config_specs(HELLO, ENDPOINT, "/workspace")
    values = {s.split("=", 1)[0]: s.split("=", 1)[1] for s in specs if "=" in s}
    assert json.loads(values["environment.timeout"]) == 60
    assert json.loads(values["agent.step_limit"]) == 0
    assert values["model.model_kwargs.api_base"].endswith("/v1")
    no_timeout = MiniSweAgentHarness().config_specs(Task(id="t", instruction="x"), ENDPOINT, "/w")
    assert not any(s.startswith("agent.wall_time_limit_seconds") for s in no_timeout)


def test_image_layer_wraps_the_console_script_module(monkeypatch, tmp_path) -> None:
    import core.runtime.recipes as recipes

    asked: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(recipes, "pip_tree", lambda name, reqs: asked.append((name, reqs)) or tmp_path / name)
    layer = MiniSweAgentHarness().image_layer()
    assert asked == [("mini-swe-agent", [versions.MINI_SWE_AGENT])]
    assert f"python3 -m {CLI_MODULE}" in layer.dockerfile and "/usr/local/bin/mini" in layer.dockerfile
    # the proxy model class is copied next to mini's packages, before the layer compiles them
    assert layer.files[PROXY_MODEL_CONTEXT] == PROXY_MODEL_FILE.read_bytes()
    copy, compile_ = layer.dockerfile.index(f"COPY {PROXY_MODEL_CONTEXT} "), layer.dockerfile.index("compileall")
    assert copy < compile_


def test_launcher_reports_the_trajectory_exit_status(tmp_path) -> None:
    """The launcher runs mini, then prints the trajectory's exit status and keeps mini's exit code."""
    traj = tmp_path / "traj.json"
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "mini").write_text(f"#!/bin/sh\necho '{{\"info\": {{\"exit_status\": \"Submitted\"}}}}' > {traj}\nexit 3\n")
    (fake_bin / "mini").chmod(0o755)
    script = LAUNCHER.replace(TRAJECTORY_PATH, str(traj))
    out = subprocess.run(["sh", "-c", script, "mini"], capture_output=True, text=True, env={"PATH": f"{fake_bin}:/usr/bin:/bin"})
    assert out.returncode == 3 and exit_status(out.stdout) == "Submitted"
    traj.unlink()
    (fake_bin / "mini").write_text("#!/bin/sh\nexit 0\n")
    out = subprocess.run(["sh", "-c", script, "mini"], capture_output=True, text=True, env={"PATH": f"{fake_bin}:/usr/bin:/bin"})
    assert out.returncode == 0 and exit_status(out.stdout) == "NoTrajectory"


def test_outcome_needs_a_submitted_trajectory() -> None:
    h = MiniSweAgentHarness()
    assert h.outcome(ExecResult(0, f"...\n{STATUS_MARK} Submitted\n", "")).ok
    limits = h.outcome(ExecResult(0, f"{STATUS_MARK} LimitsExceeded\n", ""))
    assert not limits.ok and "LimitsExceeded" in limits.detail
    assert not h.outcome(ExecResult(0, f"{STATUS_MARK} RepeatedFormatError\n", "")).ok
    assert not h.outcome(ExecResult(1, f"{STATUS_MARK} APIConnectionError\n", "Traceback")).ok
    assert not h.outcome(ExecResult(0, "no status line", "")).ok
    assert not h.outcome(ExecResult(-1, f"{STATUS_MARK} Submitted\n", "", timed_out=True)).ok
    assert exit_status("") is None


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the ~550 MB pip tree
def test_the_image_carries_bytecode_so_a_fresh_container_compiles_nothing(docker_client, base_image) -> None:
    """LiteLLM's modules are imported from .pyc files built into the image (a fresh container used to compile them: ~25-45 s)."""
    probe = (
        "import os, litellm, minisweagent.run.mini as m, forgetui_mini_model as f; "
        "print(all(os.path.exists(x.__cached__) for x in (litellm, m, f)))"
    )
    out = python_in_image(docker_client, base_image, probe, PYTHONDONTWRITEBYTECODE="1", LITELLM_LOCAL_MODEL_COST_MAP="True")
    assert out[-1] == "True"


@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_the_default_client_never_imports_litellm(docker_client, base_image) -> None:
    """mini with forgetui's model class loads no LiteLLM module: the ~3 CPU-s import is gone from every sandbox."""
    probe = (
        "import sys, minisweagent.run.mini; from minisweagent.models import get_model_class; "
        f"cls = get_model_class('policy', {PROXY_MODEL_CLASS!r}); "
        "m = cls(model_name='policy', model_kwargs={'api_base': 'http://127.0.0.1:9/r/t/v1', 'temperature': 0.5}); "
        "print(cls.__name__, m._api_url, m.config.model_kwargs, m.timeout_s, any(k.split('.')[0] == 'litellm' for k in sys.modules))"
    )
    out = python_in_image(docker_client, base_image, probe, PYTHONDONTWRITEBYTECODE="1")
    assert out[-1] == "ProxyModel http://127.0.0.1:9/r/t/v1/chat/completions {'temperature': 0.5} 600.0 False"


# Run inside the image: a loopback server answering 403 (as the proxy does past run.max_calls) on /refuse and one
# tool call on /ok; ProxyModel must stop at the 403 after one request and parse the tool call from /ok.
REFUSAL_PROBE = r"""
import json, threading, http.server
from forgetui_mini_model import ProxyModel, ProxyRejected
hits = []
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        hits.append((self.path, body["model"], sorted(body), self.headers["Authorization"]))
        if self.path.startswith("/refuse"):
            out, code = {"error": {"message": "every model call run.max_calls allows", "type": "permission"}}, 403
        else:
            call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})}}
            out, code = {"choices": [{"message": {"role": "assistant", "content": "", "tool_calls": [call]}, "finish_reason": "tool_calls"}], "usage": {}}, 200
        data = json.dumps(out).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
base = f"http://127.0.0.1:{srv.server_port}"
try:
    ProxyModel(model_name="policy", model_kwargs={"api_base": base + "/refuse/v1"}).query([{"role": "user", "content": "hi"}])
    print("no error")
except ProxyRejected as e:
    print("rejected", "403" in str(e), len(hits))
msg = ProxyModel(model_name="policy", model_kwargs={"api_base": base + "/ok/v1", "temperature": 0.5}).query([{"role": "user", "content": "hi"}])
print("ok", msg["extra"]["actions"], hits[-1])
"""


@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_the_proxy_model_stops_at_a_refusal_and_parses_a_tool_call(docker_client, base_image) -> None:
    out = python_in_image(docker_client, base_image, REFUSAL_PROBE, OPENAI_API_KEY="tok-x", MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT="3",
                          MSWEA_COST_TRACKING="ignore_errors")
    assert out[-2] == "rejected True 1"  # one request: a 403 is not retried
    assert out[-1] == ("ok [{'command': 'ls', 'tool_call_id': 'c1'}] "
                       "('/ok/v1/chat/completions', 'policy', ['messages', 'model', 'temperature', 'tools'], 'Bearer tok-x')")


@pytest.mark.docker
@pytest.mark.timeout(1200)  # a cold image build copies the ~550 MB pip tree
def test_scripted_hello_end_to_end_the_same_tokens_with_either_client(docker_client, base_image, tmp_path) -> None:
    """Both clients solve it in one merged sample, and the model sees the same tokens: the client changes no training data."""
    runs = {}
    for client in ("requests", "litellm"):
        (tmp_path / client).mkdir()
        res = run_hello("mini-swe-agent", "scripted", tmp_path / client, script=SCRIPT, options={"client": client})
        res.assert_solved("chat")
        res.assert_one_sample()
        assert res.body(0, "request")["model"] == "policy"  # what the proxy saw, LiteLLM's prefix stripped or never added
        runs[client] = res
        print(f"mini-swe-agent ({client}): {len(res.calls)} calls, merged={res.merged}, meta={res.rollout['meta']}")
    mine, theirs = runs["requests"].samples[0], runs["litellm"].samples[0]
    assert list(mine.token_ids) == list(theirs.token_ids) and list(mine.loss_mask) == list(theirs.loss_mask)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_tiny_model_plumbing_holds(docker_client, base_image, tmp_path) -> None:
    res = run_hello("mini-swe-agent", "builtin:tiny", tmp_path, timeout_s=240)
    res.assert_protocol_kept("chat")
    print(f"mini-swe-agent tiny: {len(res.calls)} calls, merged={res.merged}, meta={res.rollout['meta']}")
