"""The react harness: its agent script runs for real against a live recording proxy."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import pytest_asyncio

from core.env import Task
from core.harness import Endpoint, LaunchSpec
from core.registry import load_harness
from core.runtime import make_runtime
from core.runtime.base import ExecResult, SandboxSpec
from core.runtime.images import image_tag
from envs.toy import ToyEnv
from harnesses.react import AGENT_PATH, IMAGE_AGENT_PATH, INSTRUCTION_PATH, ReactHarness, agent_source

WORKDIR = "/workspace"
HELLO = Task(id="hello", instruction="Create a file hello.txt containing hi in the workspace")
CALLS_SQL = "SELECT seq, extends_parent, status, request FROM calls_full ORDER BY seq"


@pytest_asyncio.fixture
async def box(tmp_path) -> AsyncIterator[Any]:
    runtime = make_runtime("local", base_dir=tmp_path / "sandboxes")
    sandbox = runtime.create(SandboxSpec(image="none", run_id="test-react", rollout_id=uuid.uuid4().hex[:8]))
    await sandbox.start()
    yield sandbox
    await sandbox.stop()


async def launch(sandbox: Any, spec: LaunchSpec, timeout_s: float = 120) -> ExecResult:
    """Run a LaunchSpec the way the orchestrator does: write its files, then exec its command."""
    for path, data in spec.files.items():
        await sandbox.put_file(path, data.encode() if isinstance(data, str) else data, 0o644)
    return await sandbox.exec(spec.command, timeout_s=timeout_s, env=spec.env, workdir=spec.workdir)


def endpoint(base: str, token: str = "tok") -> Endpoint:
    return Endpoint(base_url=base, token=token)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_registered_launch_spec_and_image_layer() -> None:
    harness = load_harness("react", max_steps=7, temperature=0.5, max_tokens=64)
    assert isinstance(harness, ReactHarness) and harness.protocols == ("chat",)
    spec = harness.launch(HELLO, Endpoint(base_url="http://127.0.0.1:9/r/abc", token="abc"), WORKDIR)
    argv = spec.command
    assert argv[:2] == ["sh", "-c"]
    flags = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert flags["--base-url"] == "http://127.0.0.1:9/r/abc/v1"
    assert flags["--api-key"] == "abc" and flags["--model"] == "policy"
    assert flags["--max-steps"] == "7" and flags["--workdir"] == WORKDIR
    assert flags["--temperature"] == "0.5" and flags["--max-tokens"] == "64"
    assert flags["--instruction-file"] == INSTRUCTION_PATH
    assert HELLO.instruction not in " ".join(argv)  # passed through a file, not argv
    assert spec.files[INSTRUCTION_PATH] == HELLO.instruction
    assert spec.files[AGENT_PATH] == agent_source() and spec.workdir == WORKDIR
    layer = harness.image_layer()
    assert layer.name == "react" and IMAGE_AGENT_PATH in layer.dockerfile
    assert layer.files["react_agent.py"] == agent_source()
    assert image_tag("forgetui/base:bookworm", [layer]).startswith("forgetui/react:")


def test_outcome_explains_exit_codes() -> None:
    h = ReactHarness()
    assert h.outcome(ExecResult(0, "Done.\n", "")).ok
    limit = h.outcome(ExecResult(3, "", "[react] step limit"))
    assert not limit.ok and "step limit" in limit.detail
    assert "model endpoint" in h.outcome(ExecResult(4, "", "x")).detail
    assert not h.outcome(ExecResult(-1, "", "", timed_out=True)).ok


async def test_scripted_hello_end_to_end(box: Any, live_proxy, script_file) -> None:
    proxy = live_proxy(
        f"scripted:{script_file([{'tool': 'shell', 'command': 'echo hi > hello.txt'}, {'text': 'Done.'}])}"
    )
    res = await launch(box, ReactHarness().launch(HELLO, endpoint(proxy.base, proxy.token), WORKDIR))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == "Done."
    assert (await box.get_file(f"{WORKDIR}/hello.txt")).decode().strip() == "hi"
    env = ToyEnv()
    score = await env.verify(box, next(t for t in env.tasks() if t.id == "hello"), WORKDIR)
    assert score.passed and score.score == 1.0
    rows = proxy.rows(CALLS_SQL)
    assert [(r[0], r[2]) for r in rows] == [(0, "ok"), (1, "ok")]
    assert rows[1][1] is True
    second = json.loads(rows[1][3]) if isinstance(rows[1][3], str) else rows[1][3]
    tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and tool_msgs[0]["content"].startswith("exit code: 0")
    assert {t["function"]["name"] for t in second["tools"]} == {
        "bash",
        "read_file",
        "write_file",
        "edit_file",
    }


async def test_streaming_write_file_tool(box: Any, live_proxy, script_file) -> None:
    script = script_file([{"tool": "write_file", "path": "notes/a.txt", "content": "alpha"}, {"text": "ok"}])
    proxy = live_proxy(f"scripted:{script}")
    spec = ReactHarness(stream=True).launch(HELLO, endpoint(proxy.base, proxy.token), WORKDIR)
    res = await launch(box, spec)
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == "ok"
    assert (await box.get_file(f"{WORKDIR}/notes/a.txt")).decode() == "alpha"
    rows = proxy.rows("SELECT stream, extends_parent FROM calls ORDER BY seq")
    assert [r[0] for r in rows] == [True, True] and rows[1][1] is True


async def test_bad_tool_calls_are_fed_back(box: Any, live_proxy, script_file) -> None:
    turns = [
        {"tool_call": {"name": "teleport", "arguments": {"where": "moon"}}},
        {"tool_call": {"name": "edit_file", "arguments": {"path": "missing.txt", "old": "a", "new": "b"}}},
        {"tool_call": {"name": "bash", "arguments": {"cmd": "ls"}}},
        {"text": "gave up"},
    ]
    proxy = live_proxy(f"scripted:{script_file(turns)}")
    res = await launch(box, ReactHarness().launch(HELLO, endpoint(proxy.base, proxy.token), WORKDIR))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == "gave up"
    last = proxy.rows(CALLS_SQL)[-1][3]
    last = json.loads(last) if isinstance(last, str) else last
    results = [m["content"] for m in last["messages"] if m["role"] == "tool"]
    assert len(results) == 3
    assert "unknown tool 'teleport'" in results[0]
    assert results[1].startswith("error:") and "missing.txt" in results[1]
    assert "bad arguments for bash" in results[2]


async def test_step_limit(box: Any, live_proxy, script_file) -> None:
    script = script_file([])
    script.write_text(
        json.dumps({"turns": [{"tool": "shell", "command": "echo again >> log.txt"}], "loop": True})
    )
    proxy = live_proxy(f"scripted:{script}")
    res = await launch(
        box, ReactHarness(max_steps=3).launch(HELLO, endpoint(proxy.base, proxy.token), WORKDIR)
    )
    assert res.exit_code == 3
    assert "step limit of 3" in res.stderr
    assert len(proxy.rows(CALLS_SQL)) == 3
    assert (await box.get_file(f"{WORKDIR}/log.txt")).decode().splitlines() == ["again"] * 3


async def test_tiny_model_does_not_crash(box: Any, live_proxy) -> None:
    proxy = live_proxy("builtin:tiny")
    spec = ReactHarness(max_steps=3, max_tokens=32).launch(HELLO, endpoint(proxy.base, proxy.token), WORKDIR)
    res = await launch(box, spec)
    assert res.exit_code in (0, 3), res.stderr
    assert "Traceback" not in res.stderr
    assert 1 <= len(proxy.rows(CALLS_SQL)) <= 3


async def test_unreachable_proxy_exits_4(box: Any) -> None:
    base = f"http://127.0.0.1:{free_port()}/r/nobody"
    res = await launch(box, ReactHarness().launch(HELLO, endpoint(base), WORKDIR))
    assert res.exit_code == 4
    assert "react agent: the model endpoint" in res.stderr and "failed after 3 attempts" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.fixture
def flaky_server() -> Iterator[tuple[str, list[int]]]:
    """An endpoint that answers 503 twice, then a final answer; records the status of each hit."""
    hits: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = 503 if len(hits) < 2 else 200
            hits.append(status)
            body = (
                b'{"error": "busy"}'
                if status != 200
                else json.dumps({"choices": [{"message": {"role": "assistant", "content": "fine"}}]}).encode()
            )
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/r/t", hits
    server.shutdown()
    server.server_close()


async def test_retries_5xx_then_succeeds(box: Any, flaky_server) -> None:
    base, hits = flaky_server
    res = await launch(box, ReactHarness().launch(HELLO, endpoint(base), WORKDIR))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip() == "fine"
    assert hits == [503, 503, 200]


async def test_client_error_is_not_retried(box: Any, live_proxy, script_file) -> None:
    proxy = live_proxy(f"scripted:{script_file([{'text': 'x'}])}")
    bad = Endpoint(base_url=f"{proxy.url}/r/not-a-token", token="not-a-token")
    res = await launch(box, ReactHarness().launch(HELLO, bad, WORKDIR))
    assert res.exit_code == 4
    assert "refused the request (HTTP 4" in res.stderr


@pytest.mark.docker
async def test_agent_in_docker(
    docker_client: Any, docker_runtime: Any, base_image: str, run_id: str, live_proxy, script_file
) -> None:
    from core.runtime.images import ensure_image

    harness = ReactHarness()
    tag = ensure_image(docker_client, base_image, [harness.image_layer()])
    proxy = live_proxy(
        f"scripted:{script_file([{'tool': 'shell', 'command': 'echo hi > hello.txt'}, {'text': 'Done.'}])}"
    )
    sandbox = docker_runtime.create(SandboxSpec(image=tag, run_id=run_id, rollout_id="react", network="host"))
    await sandbox.start()
    try:
        assert (await sandbox.exec(["test", "-f", IMAGE_AGENT_PATH], timeout_s=30)).exit_code == 0
        res = await launch(sandbox, harness.launch(HELLO, endpoint(proxy.base, proxy.token), WORKDIR))
        assert res.exit_code == 0, res.stderr
        assert res.stdout.strip() == "Done."
        assert (await sandbox.get_file(f"{WORKDIR}/hello.txt")).decode().strip() == "hi"
        rows = proxy.rows(CALLS_SQL)
        assert len(rows) == 2 and rows[1][1] is True
    finally:
        await sandbox.stop()
