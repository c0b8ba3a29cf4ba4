"""What forgetui's recording proxy costs on top of a model server, and how it compares with LiteLLM's proxy.

One run: ``.venv/bin/python benchmarks/proxy_overhead.py [--quick]``. Everything is loopback.

Paths measured, each with the same small OpenAI Chat Completions request (streaming and not):

* ``direct``           load generator → instant fake OpenAI-compatible server
* ``forgetui``         → forgetui proxy, the shipped passthrough ``litellm:openai/fake?api_base=...``
                         (served natively by ``core.backends.openai_compat``) → fake server
* ``forgetui+httpx``   → forgetui proxy (PassthroughPolicy, minimal httpx backend written here) → fake server
* ``forgetui+litellm`` → forgetui proxy, the same spec forced through ``litellm.acompletion`` (the
                         path every non-OpenAI-compatible provider takes) → fake server
* ``litellm-proxy``    → LiteLLM's own proxy server (``litellm --config ...``, one worker) → fake server,
                         run from its own virtual environment (``benchmarks/.venv-baselines``), which the
                         script creates and fills on first use so the project's ``.venv`` is not touched

The floors (PASS/FAIL, exit code) apply to ``forgetui``, the shipped path; the other forgetui rows
are for reference. Every forgetui proxy records every call into a real DuckDB store; after the run the store files
are opened again and their ``calls`` rows counted. Also timed: the token path's own cost per call
(``Continuation.plan`` + ``parse_hermes``) for a ~4k-token prompt with the tiny model's tokenizer, the
spliced plan also by full renders of the history (the path before incremental rendering).
``--token-path-only`` times only the token path, at 4k, 16k and 50k tokens (floor: a spliced plan at
50k tokens within 3 ms, p50).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

EXPECTED = "Hello! This is a fixed answer from the fake backend."
PIECES = ["Hello! ", "This is a fixed ", "answer from the ", "fake backend."]
MODEL = "fake"
FORGETUI_BACKENDS = ("shipped", "httpx", "litellm")
FORGETUI_PATHS = ("forgetui", "forgetui+httpx", "forgetui+litellm")
SHIPPED = "forgetui"  # the floors apply to this path
FLOOR_ADDED_P50_MS = 2.0
FLOOR_THROUGHPUT_RATIO = 2.0
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "LITELLM_TELEMETRY": "False",
    "DISABLE_LITELLM_TELEMETRY": "True",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


# ---------------------------------------------------------------------------------------------
# the instant fake OpenAI-compatible backend (raw ASGI, its own process)
# ---------------------------------------------------------------------------------------------


def _fake_frames(include_usage: bool) -> list[bytes]:
    import orjson

    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL}
    chunks: list[dict[str, Any]] = [
        {
            **base,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
    ]
    chunks += [
        {**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in PIECES
    ]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if include_usage:
        chunks.append(
            {
                **base,
                "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 11, "total_tokens": 23},
            }
        )
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def _fake_app() -> Any:
    import orjson

    from core.serving import read_body

    answer = orjson.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1700000000,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": EXPECTED},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 11, "total_tokens": 23},
        }
    )
    frames = {True: _fake_frames(True), False: _fake_frames(False)}
    json_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    sse_headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(scope, receive, 1 << 30)
        if scope["path"] not in ("/v1/chat/completions", "/chat/completions"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        req = orjson.loads(body) if body else {}
        if req.get("stream"):
            usage = bool((req.get("stream_options") or {}).get("include_usage"))
            await send({"type": "http.response.start", "status": 200, "headers": sse_headers})
            for frame in frames[usage]:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.start", "status": 200, "headers": json_headers})
            await send({"type": "http.response.body", "body": answer})

    return app


def serve_fake(conn: Any) -> None:
    """Child process: the fake backend on uvicorn (uvloop + httptools), port reported through `conn`."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    conn.send(sock.getsockname()[1])
    conn.close()
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    config = uvicorn.Config(
        _fake_app(),
        loop=loop,
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="off",
        backlog=2048,
    )
    uvicorn.Server(config).run(sockets=[sock])


# ---------------------------------------------------------------------------------------------
# a minimal httpx passthrough backend (implements core.backends.base.PassthroughBackend)
# ---------------------------------------------------------------------------------------------


class HttpxPassthroughBackend:
    """Streams an OpenAI-compatible server's chat completion with one shared httpx client (no LiteLLM)."""

    def __init__(self, base_url: str, model: str = MODEL, api_key: str = "sk-fake") -> None:
        from core.backends.kinds import Capabilities

        self.capabilities = Capabilities()  # text in, text out
        self.name = "httpx-bench"
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
        self._client: Any = None

    def _http(self) -> Any:
        if self._client is None:  # created lazily inside the server's event loop
            import httpx

            limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
            self._client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0))
        return self._client

    async def _lines(self, payload: bytes) -> AsyncIterator[str]:
        from core.errors import BackendError

        async with self._http().stream("POST", self.url, content=payload, headers=self.headers) as resp:
            if resp.status_code != 200:
                raise BackendError(f"{self.name}: upstream answered {resp.status_code}")
            async for line in resp.aiter_lines():
                yield line

    async def complete(self, request: Any, context: Any) -> AsyncIterator[Any]:
        import orjson

        from core.chat import Completion, Finished, TextDelta
        from core.errors import BackendError

        payload: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for key in ("max_tokens", "temperature", "top_p"):
            value = getattr(request, key)
            if value is not None:
                payload[key] = value
        if request.tools:
            payload["tools"] = request.tools
        text: list[str] = []
        usage: dict[str, Any] = {}
        finish = "stop"
        try:
            async for line in self._lines(orjson.dumps(payload)):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        text.append(piece)
                        yield TextDelta(piece)
                    finish = choice.get("finish_reason") or finish
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - every upstream failure is a backend error
            raise BackendError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        yield Finished(
            Completion(
                text="".join(text),
                finish_reason="length" if finish == "length" else "stop",
                prompt_tokens=usage.get("prompt_tokens", 0),
                completion_tokens=usage.get("completion_tokens", 0),
            )
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


# ---------------------------------------------------------------------------------------------
# forgetui's proxy (its own process, wired like tests/conftest.py `live_proxy`)
# ---------------------------------------------------------------------------------------------


def name_threads() -> None:
    """Give this process's threads their Python names in the kernel too, so /proc can split CPU per thread."""
    import threading

    for thread in threading.enumerate():
        if thread.native_id is not None:
            try:
                Path(f"/proc/self/task/{thread.native_id}/comm").write_text(thread.name[:15])
            except OSError:
                pass


def serve_forgetui(conn: Any, backend: str, fake_url: str, store_path: str, proxy_loop: str = "default") -> None:
    """Child process: ProxyApp + BackgroundServer + a real Store; on 'stop' reports the store's row counts."""
    import core.proxy.server
    from core.backends.spec import PolicySpec
    from core.proxy.app import ProxyApp
    from core.proxy.factory import make_policy
    from core.proxy.policy import PassthroughPolicy
    from core.proxy.server import BackgroundServer
    from core.proxy.sessions import SessionRegistry
    from core.store.writer import Store

    if proxy_loop == "asyncio":  # measure the stdlib loop instead of uvloop
        core.proxy.server.new_event_loop = asyncio.new_event_loop
    spec = f"litellm:openai/{MODEL}?api_base={fake_url}/v1&api_key=sk-fake"
    if backend == "httpx":
        policy = PassthroughPolicy(HttpxPassthroughBackend(fake_url + "/v1"))
    else:
        policy = make_policy(PolicySpec.parse(spec))
        if backend == "litellm":  # force LiteLLM's client for the same upstream (what other providers use)
            policy.backend._native = None
    store = Store.open(store_path)
    store.insert_run("run-bench", {"bench": "proxy_overhead", "backend": backend})
    sessions = SessionRegistry(run_id="run-bench", adhoc=False)
    session = sessions.register("rollout-bench")
    store.upsert_rollout(
        {"rollout_id": "rollout-bench", "run_id": "run-bench", "status": "running", "token": session.token}
    )
    server = BackgroundServer(ProxyApp(policy, sessions, store))
    url = server.start()
    name_threads()
    conn.send({"url": url, "token": session.token})
    conn.recv()  # "stop"
    if server.loop is not None:  # close the backend's HTTP client on its own loop
        asyncio.run_coroutine_threadsafe(policy.aclose(), server.loop).result(timeout=10)
    server.stop()
    store.flush()
    rows = store.handle_query("SELECT status, count(*) FROM calls GROUP BY status")["rows"]
    store.close()
    conn.send(
        {"rows": {r[0]: r[1] for r in rows}, "dead_letter": len(store.dead_letter), "commits": store.commits}
    )
    conn.close()


# ---------------------------------------------------------------------------------------------
# LiteLLM's own proxy (a subprocess)
# ---------------------------------------------------------------------------------------------

_LITELLM_LAUNCH = "import sys\nfrom litellm_cli.main import proxy_server\nsys.argv[0] = 'litellm'\nsys.exit(proxy_server())\n"
_QUIET_LOGS = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"default": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
    "loggers": {
        "uvicorn": {"handlers": ["default"], "level": "WARNING"},
        "uvicorn.error": {"level": "WARNING"},
        "uvicorn.access": {"handlers": ["default"], "level": "WARNING", "propagate": False},
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiteLLMProxy:
    proc: subprocess.Popen | None
    url: str
    key: str
    log: Path
    error: str | None = None


# ---------------------------------------------------------------------------------------------
# the baselines' own virtual environment (LiteLLM's proxy and what it imports)
# ---------------------------------------------------------------------------------------------

BASELINES_VENV = REPO / "benchmarks" / ".venv-baselines"
# `litellm[proxy]` pins `litellm-proxy`, which is not on PyPI; the proxy's modules ship inside the
# `litellm` wheel and run once these imports are present
LITELLM_PROXY_EXTRAS = (
    "uvicorn>=0.33",
    "uvloop>=0.22.1",
    "gunicorn>=23",
    "fastapi>=0.136.3",
    "starlette>=1.0.1",
    "backoff>=2.2.1",
    "rq>=2.7",
    "websockets>=15.0.1,<16",
    "apscheduler>=3.11.2,<4",
    "pyjwt>=2.13",
    "cryptography>=49,<51",
    "python-multipart",
    "pynacl",
    "semver",
    "expression",
    "fastapi-sso",
    "mcp",
    "soundfile",
    "orjson",
)


def baseline_requirements() -> list[str]:
    """LiteLLM at the version forgetui's own venv runs, plus its proxy's imports."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        litellm = f"litellm=={version('litellm')}"
    except PackageNotFoundError:
        litellm = "litellm"
    return [litellm, *LITELLM_PROXY_EXTRAS]


def venv_python(venv: Path) -> Path:
    """The interpreter of a virtual environment."""
    return venv / "bin" / "python"


def install_command(venv: Path) -> str:
    """The one shell command that creates the baselines' venv by hand."""
    pip = shlex.join([str(venv_python(venv)), "-m", "pip", "install", *baseline_requirements()])
    return f"python3 -m venv {shlex.quote(str(venv))} && {pip}"


def ensure_baselines(venv: Path) -> str | None:
    """Creates or updates the baselines' venv when its requirements changed; returns why it failed, or None."""
    reqs = baseline_requirements()
    stamp = venv / ".installed"
    if stamp.exists() and stamp.read_text() == "\n".join(reqs):
        return None
    print(
        f"Installing the LiteLLM proxy baseline into {venv} (once; about a minute with pip's cache) ...",
        flush=True,
    )
    fd, name = tempfile.mkstemp(prefix="forgetui-baselines-install-", suffix=".log")
    log = Path(name)
    steps = [[sys.executable, "-m", "venv", str(venv)]] if not venv_python(venv).exists() else []
    steps.append([str(venv_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs])
    with os.fdopen(fd, "w") as out:
        for cmd in steps:
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                out.flush()
                tail = [ln for ln in log.read_text(errors="replace").splitlines() if "WARNING" not in ln][-2:]
                return (
                    f"installing it failed ({' / '.join(tail)}; log: {log}); by hand: {install_command(venv)}"
                )
    stamp.write_text("\n".join(reqs))
    log.unlink(missing_ok=True)
    return None


def litellm_proxy_problem(python: Path) -> str | None:
    """Why LiteLLM's proxy cannot run in this interpreter, or None."""
    if not python.exists():
        return f"{python} does not exist"
    check = subprocess.run(
        [str(python), "-c", "import litellm.proxy.proxy_server, litellm_cli.main"],
        capture_output=True,
        text=True,
        env={**os.environ, **OFFLINE_ENV},
        timeout=180,
    )
    if check.returncode == 0:
        return None
    last = (check.stderr.strip().splitlines() or ["(no output)"])[-1]
    return f"`import litellm.proxy.proxy_server` fails in {python}: {last}; reinstall: {install_command(python.parents[1])}"


def start_litellm_proxy(fake_url: str, workdir: Path, python: Path) -> LiteLLMProxy:
    key = "sk-bench-" + secrets.token_hex(16)
    log = workdir / "litellm-proxy.log"
    problem = litellm_proxy_problem(python)
    if problem:
        return LiteLLMProxy(None, "", key, log, problem)
    config = workdir / "litellm-config.json"  # JSON is valid YAML
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": f"openai/{MODEL}",
                            "api_base": f"{fake_url}/v1",
                            "api_key": "sk-fake",
                        },
                    }
                ],
                "litellm_settings": {"telemetry": False, "drop_params": True},
            }
        )
    )
    log_config = workdir / "litellm-logging.json"
    log_config.write_text(json.dumps(_QUIET_LOGS))
    port = free_port()
    cmd = [
        str(python),
        "-c",
        _LITELLM_LAUNCH,
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
        "--log_config",
        str(log_config),
    ]
    env = {**os.environ, **OFFLINE_ENV, "LITELLM_MASTER_KEY": key, "LITELLM_LOG": "ERROR"}
    env.pop("DATABASE_URL", None)
    out = log.open("wb")
    proc = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
    )
    return LiteLLMProxy(proc, f"http://127.0.0.1:{port}", key, log)


def wait_litellm_ready(proxy: LiteLLMProxy, timeout: float = 180.0) -> None:
    import httpx

    if proxy.proc is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proxy.proc.poll() is not None:
            tail = proxy.log.read_text(errors="replace").strip().splitlines()[-15:]
            proxy.error = (
                f"LiteLLM proxy exited with code {proxy.proc.returncode} at startup; log tail:\n    "
                + "\n    ".join(tail)
            )
            return
        try:
            if httpx.get(proxy.url + "/health/liveliness", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proxy.error = f"LiteLLM proxy did not answer /health/liveliness within {timeout:.0f} s (log: {proxy.log})"


def stop_litellm_proxy(proxy: LiteLLMProxy) -> None:
    if proxy.proc is None or proxy.proc.poll() is not None:
        return
    pgid = proxy.proc.pid  # its own session, started above: the group is ours
    os.killpg(pgid, signal.SIGTERM)
    try:
        proxy.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        proxy.proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------
# CPU accounting from /proc (a process and its descendants)
# ---------------------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK  # ppid, utime+stime


def cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by `pid` and its live descendants."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := _stat(int(entry))) is not None:
            stats[int(entry)] = s
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        total += stats[p][1]
        todo.extend(c for c, (ppid, _) in stats.items() if ppid == p)
    return total


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of one process (names as the kernel keeps them: 15 characters)."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TICK
    return out


# ---------------------------------------------------------------------------------------------
# the load generator
# ---------------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    url: str  # the chat completions URL
    headers: dict[str, str]
    server_pid: int  # the process whose CPU is charged to this path
    sent: int = 0  # requests sent (warm-up included), for the store check


@dataclass
class Result:
    mode: str
    conc: int
    path: str
    n: int
    errors: int
    wall_s: float
    lat_ms: list[float] = field(default_factory=list)
    cpu_ms_per_req: float = 0.0
    loadgen_cpu_ms_per_req: float = 0.0
    thread_ms_per_req: dict[str, float] = field(default_factory=dict)
    first_error: str = ""

    def pct(self, q: float) -> float:
        import numpy as np

        return float(np.percentile(self.lat_ms, q)) if self.lat_ms else float("nan")

    @property
    def rps(self) -> float:
        return self.n / self.wall_s if self.wall_s > 0 else float("nan")


def request_body(stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello."},
        ],
        "max_tokens": 32,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def answer_text(raw: bytes, stream: bool) -> str:
    """The assistant text in a chat completion response body (JSON or SSE)."""
    import orjson

    if not stream:
        return orjson.loads(raw)["choices"][0]["message"]["content"] or ""
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            for choice in orjson.loads(line[6:]).get("choices") or ():
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


class LoadClient:
    """The load generator's HTTP client: aiohttp (default, ~10× less CPU per request) or httpx."""

    def __init__(self, kind: str, conc: int) -> None:
        self.kind = kind
        if kind == "httpx":
            import httpx

            limits = httpx.Limits(max_connections=conc + 8, max_keepalive_connections=conc + 8)
            self.client: Any = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0), trust_env=False)
        else:
            import aiohttp

            self.client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=conc + 8), timeout=aiohttp.ClientTimeout(total=60)
            )

    async def post(self, url: str, body: bytes, headers: dict[str, str], stream: bool) -> tuple[int, bytes]:
        """(status, whole body) — for a stream, read to its last byte."""
        if self.kind == "httpx":
            if stream:
                async with self.client.stream("POST", url, content=body, headers=headers) as resp:
                    return resp.status_code, b"".join([chunk async for chunk in resp.aiter_raw()])
            resp = await self.client.post(url, content=body, headers=headers)
            return resp.status_code, resp.content
        async with self.client.post(url, data=body, headers=headers) as resp:
            return resp.status, await resp.read()

    async def aclose(self) -> None:
        await (self.client.aclose() if self.kind == "httpx" else self.client.close())


async def one_call(client: LoadClient, target: Target, body: bytes, stream: bool) -> tuple[float, str | None]:
    """(latency to the last byte in ms, error or None) for one request."""
    target.sent += 1
    t0 = time.perf_counter()
    try:
        status, raw = await client.post(target.url, body, target.headers, stream)
    except Exception as exc:  # noqa: BLE001 - counted as an error of this path
        return (time.perf_counter() - t0) * 1000.0, f"{type(exc).__name__}: {exc}"
    elapsed = (time.perf_counter() - t0) * 1000.0
    if status != 200:
        return elapsed, f"HTTP {status}: {raw[:200]!r}"
    try:
        text = answer_text(raw, stream)
    except Exception as exc:  # noqa: BLE001
        return elapsed, f"unparseable body ({exc}): {raw[:200]!r}"
    if text != EXPECTED:
        return elapsed, f"wrong answer text {text!r}"
    return elapsed, None


async def run_phase(
    target: Target, mode: str, conc: int, n: int, warmup: int, client_kind: str, max_s: float
) -> Result:
    """`n` requests at concurrency `conc` after `warmup` unmeasured ones; stops early after `max_s` seconds."""
    stream = mode == "stream"
    body = request_body(stream)
    client = LoadClient(client_kind, conc)
    try:
        result = Result(mode, conc, target.name, n, 0, 0.0)

        deadline = float("inf")

        async def worker(todo: list[int], record: bool) -> None:
            while todo and time.perf_counter() < deadline:
                todo.pop()
                lat, err = await one_call(client, target, body, stream)
                if not record:
                    continue
                result.lat_ms.append(lat)
                if err:
                    result.errors += 1
                    result.first_error = result.first_error or err

        warm = list(range(warmup))
        await asyncio.gather(*(worker(warm, False) for _ in range(conc)))
        todo = list(range(n))
        cpu0, threads0, gen0 = (
            cpu_seconds(target.server_pid),
            thread_cpu(target.server_pid),
            time.process_time(),
        )
        t0 = time.perf_counter()
        deadline = t0 + max_s
        await asyncio.gather(*(worker(todo, True) for _ in range(conc)))
        result.wall_s = time.perf_counter() - t0
        n = result.n = len(result.lat_ms)
        result.loadgen_cpu_ms_per_req = (time.process_time() - gen0) * 1000.0 / n
        result.cpu_ms_per_req = (cpu_seconds(target.server_pid) - cpu0) * 1000.0 / n
        threads1 = thread_cpu(target.server_pid)
        result.thread_ms_per_req = {k: (v - threads0.get(k, 0.0)) * 1000.0 / n for k, v in threads1.items()}
    finally:
        await client.aclose()
    return result


# ---------------------------------------------------------------------------------------------
# the token path's own cost (runs in this process before any load)
# ---------------------------------------------------------------------------------------------


def _words(rng: Any, k: int) -> str:
    vocab = (
        "the file folder read write edit run command output error test pass fail user tool call result "
        "model agent code python function class return import value string list dict json key name line "
        "config install build check fix bug change update search find grep open close start stop status"
    ).split()
    return " ".join(rng.choice(vocab) for _ in range(k))


def token_path_cost(iterations: int, target_tokens: int = 4000) -> dict[str, Any]:
    """Time Continuation.plan (fresh, spliced, and spliced by full renders as before) and parse_hermes on a
    conversation of about `target_tokens` tokens."""
    import random
    import statistics

    from transformers import AutoTokenizer

    from core.models.resolve import resolve_model
    from core.tokens.continuation import Continuation
    from core.tokens.template import encode, render_chat
    from core.tokens.toolparse import parse_hermes

    tok = AutoTokenizer.from_pretrained(str(resolve_model("tiny")))
    rng = random.Random(7)
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": _words(rng, 12),
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": _words(rng, 6)}},
                    "required": ["arg"],
                },
            },
        }
        for n in ("bash", "read_file", "write_file", "search")
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + _words(rng, 80)}
    ]
    i = 0
    while len(encode(tok, render_chat(tok, messages, tools, True))) < target_tokens:
        i += 1
        messages.append({"role": "user", "content": _words(rng, 40)})
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": f"grep -rn item{i} ."})},
        }
        messages.append({"role": "assistant", "content": _words(rng, 10), "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": _words(rng, 120)})
    # the last answered turn and its tool result: the spliced plan continues `head` + answer
    head, answer, result = messages[:-2], messages[-2], messages[-1]
    prompt_tokens = len(encode(tok, render_chat(tok, messages, tools, True)))
    answer_text_ = (
        answer["content"]
        + '\n<tool_call>\n{"name": "bash", "arguments": {"command": "grep -rn item ."}}\n</tool_call>'
    )
    answer_ids = encode(tok, answer_text_) + [tok.eos_token_id]

    def timed(fn: Any, reps: int) -> list[float]:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1000.0)
        return out

    fresh = timed(lambda: Continuation(tok).plan(messages, tools), iterations)
    cont = Continuation(tok)
    first = cont.plan(head, tools)
    cont.remember("call-0", first, head, tools, answer, answer_ids)
    plan = cont.plan(head + [answer, result], tools)
    if not plan.extends_parent or plan.prefix_tokens == 0:
        raise RuntimeError(
            "the spliced-continuation case did not splice; the benchmark's conversation is wrong"
        )

    def spliced() -> None:
        cont.plan(head + [answer, result], tools)

    splice = timed(spliced, iterations)
    if cont.plan_full(head + [answer, result], tools) != cont.plan(head + [answer, result], tools):
        raise RuntimeError("the incremental spliced plan differs from the full-render plan")
    before = timed(lambda: cont.plan_full(head + [answer, result], tools), max(3, iterations // 4))
    completion = (
        _words(rng, 30)
        + '\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la && cat README.md"}}\n</tool_call>'
    )
    if not parse_hermes(completion).tool_calls:
        raise RuntimeError("parse_hermes found no tool call in the benchmark's completion")
    parse = timed(lambda: parse_hermes(completion), iterations * 50)

    def stats(xs: list[float]) -> tuple[float, float]:
        return statistics.fmean(xs), statistics.median(xs)

    return {
        "prompt_tokens": prompt_tokens,
        "messages": len(messages),
        "tokenizer": type(tok).__name__,
        "rows": [
            ("Continuation.plan, fresh (render + encode all)", *stats(fresh)),
            ("Continuation.plan, spliced onto last turn", *stats(splice)),
            ("  the same by full renders (before)", *stats(before)),
            ("parse_hermes (1 tool call)", *stats(parse)),
            (
                "plan fresh + parse (per call)",
                stats(fresh)[0] + stats(parse)[0],
                stats(fresh)[1] + stats(parse)[1],
            ),
            (
                "plan spliced + parse (per call)",
                stats(splice)[0] + stats(parse)[0],
                stats(splice)[1] + stats(parse)[1],
            ),
        ],
    }


# ---------------------------------------------------------------------------------------------
# orchestration and report
# ---------------------------------------------------------------------------------------------


def _fmt(x: float, nd: int = 2) -> str:
    return "n/a" if x != x else f"{x:.{nd}f}"  # NaN → n/a


def print_results(results: list[Result]) -> None:
    by = {(r.mode, r.conc, r.path): r for r in results}
    head = f"{'mode':<7} {'c':>3} {'path':<17} {'n':>5} {'err':>4} {'p50 ms':>7} {'p99 ms':>7} {'+p50 ms':>8} {'+p99 ms':>8} {'req/s':>7} {'srvCPU ms/req':>13} {'÷ litellm-proxy':>15}"
    print(head)
    print("-" * len(head))
    for r in results:
        d = by.get((r.mode, r.conc, "direct"))
        lp = by.get((r.mode, r.conc, "litellm-proxy"))
        add50 = r.pct(50) - d.pct(50) if d and r.path != "direct" else float("nan")
        add99 = r.pct(99) - d.pct(99) if d and r.path != "direct" else float("nan")
        ratio = r.rps / lp.rps if lp and r.path.startswith("forgetui") and lp.errors < lp.n else float("nan")
        print(
            f"{r.mode:<7} {r.conc:>3} {r.path:<17} {r.n:>5} {r.errors:>4} {_fmt(r.pct(50)):>7} {_fmt(r.pct(99)):>7} "
            f"{_fmt(add50):>8} {_fmt(add99):>8} {_fmt(r.rps, 0):>7} {_fmt(r.cpu_ms_per_req):>13} {_fmt(ratio) + ('×' if ratio == ratio else ''):>15}"
        )
        if r.errors:
            print(f"{'':>12}first error: {r.first_error[:160]}")


def print_threads(results: list[Result]) -> None:
    """Where the forgetui proxies' CPU went, per thread, and what the load generator spent."""
    print(
        "\nforgetui proxy CPU per request by thread (ms; 'forgetui-proxy' = the event loop serving HTTP + the backend client,"
    )
    print("'store-writer:*' = the DuckDB writer), and the load generator's own CPU per request")
    print(
        f"  {'mode':<7} {'c':>3} {'path':<17} {'event loop':>10} {'store writer':>12} {'other':>7} {'loadgen':>8}"
    )
    for r in results:
        if not r.path.startswith("forgetui"):
            continue
        loop = sum(v for k, v in r.thread_ms_per_req.items() if k.startswith("forgetui-proxy"))
        writer = sum(v for k, v in r.thread_ms_per_req.items() if k.startswith("store-writer"))
        other = sum(r.thread_ms_per_req.values()) - loop - writer
        print(
            f"  {r.mode:<7} {r.conc:>3} {r.path:<17} {loop:>10.2f} {writer:>12.2f} {other:>7.2f} {r.loadgen_cpu_ms_per_req:>8.2f}"
        )


def check_floors(
    results: list[Result], stores: dict[str, dict[str, Any]], sent: dict[str, int], litellm_error: str | None
) -> bool:
    """Print every forgetui path against the floors; the verdict (exit code) is the shipped path's alone."""
    by = {(r.mode, r.conc, r.path): r for r in results}
    per_path = dict.fromkeys(FORGETUI_PATHS, True)

    def verdict(ok: bool | None, path: str) -> str:
        word = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        return word if path == SHIPPED else word.lower()  # lower case: a reference row, not a floor

    print(f"\nFloors (they apply to {SHIPPED!r}, the shipped passthrough; lower-case verdicts are reference rows)")
    for path in FORGETUI_PATHS:
        for mode in ("json", "stream"):
            r, d = by.get((mode, 1, path)), by.get((mode, 1, "direct"))
            if r and d:
                added = r.pct(50) - d.pct(50)
                ok = added <= FLOOR_ADDED_P50_MS and r.errors == 0
                per_path[path] &= ok
                print(
                    f"  [{verdict(ok, path)}] {path:<17} {mode:<6} added p50 at c=1: {added:.2f} ms (floor ≤ {FLOOR_ADDED_P50_MS:g} ms)"
                )
    for path in FORGETUI_PATHS:
        for mode in ("json", "stream"):
            r, lp = by.get((mode, 64, path)), by.get((mode, 64, "litellm-proxy"))
            if r is None:
                continue
            if lp is None or lp.errors == lp.n:
                print(
                    f"  [{verdict(None, path)}] {path:<17} {mode:<6} throughput at c=64 vs LiteLLM proxy: no LiteLLM proxy numbers ({litellm_error or 'not measured'})"
                )
                continue
            ratio = r.rps / lp.rps
            ok = ratio >= FLOOR_THROUGHPUT_RATIO and r.errors == 0
            per_path[path] &= ok
            print(
                f"  [{verdict(ok, path)}] {path:<17} {mode:<6} throughput at c=64: {r.rps:.0f} vs {lp.rps:.0f} req/s = {ratio:.2f}× LiteLLM proxy (floor ≥ {FLOOR_THROUGHPUT_RATIO:g}×)"
            )
    for path, counts in stores.items():
        rows = sum(counts.get("rows", {}).values())
        ok = rows == sent.get(path, -1) == counts.get("reopened") and counts.get("dead_letter", 0) == 0
        per_path[path] &= ok
        detail = ", ".join(f"{k}={v}" for k, v in sorted(counts.get("rows", {}).items()))
        print(
            f"  [{verdict(ok, path)}] {path:<17} calls rows in the store after flush+close: {rows} of {sent.get(path, 0)} requests sent "
            f"({detail}; reopened file: {counts.get('reopened')}; dead letters {counts.get('dead_letter')})"
        )
    print("\nSummary per forgetui variant (all floors together)")
    notes = {
        "forgetui": "SHIPPED: litellm:openai/...?api_base= served natively (core.backends.openai_compat, aiohttp)",
        "forgetui+httpx": "reference: the same proxy with a minimal httpx upstream client (httpcore's pool costs CPU)",
        "forgetui+litellm": "reference: the same spec through litellm.acompletion (what non-OpenAI-compatible providers use)",
    }
    for path, ok in per_path.items():
        print(f"  [{verdict(ok, path)}] {path:<17} {notes[path]}")
    return per_path[SHIPPED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--skip-litellm-proxy", action="store_true", help="do not start LiteLLM's proxy")
    parser.add_argument(
        "--token-path-only", action="store_true", help="only the token path's cost per call, at 4k, 16k and 50k tokens"
    )
    parser.add_argument(
        "--baselines-venv",
        type=Path,
        default=BASELINES_VENV,
        help="the virtual environment LiteLLM's proxy runs from (created and filled when missing)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (stores, logs) after the run"
    )
    parser.add_argument(
        "--client", choices=("aiohttp", "httpx"), default="aiohttp", help="the load generator's HTTP client"
    )
    parser.add_argument(
        "--proxy-loop",
        choices=("default", "asyncio"),
        default="default",
        help="the forgetui proxies' event loop: the shipped choice (uvloop when installed) or the stdlib one",
    )
    args = parser.parse_args(argv)
    if args.token_path_only:
        return token_path_report(10 if args.quick else 40)
    counts = {1: 100, 16: 400, 64: 400} if args.quick else {1: 300, 16: 2000, 64: 2000}
    token_iters = 10 if args.quick else 40
    phase_s = 15.0 if args.quick else 40.0  # a slow path gets fewer requests rather than a long run
    workdir = Path(tempfile.mkdtemp(prefix="forgetui-bench-"))
    os.environ.setdefault("FORGETUI_HOME", str(workdir / "home"))
    os.environ.setdefault("TQDM_DISABLE", "1")  # building the tiny model draws progress bars
    os.environ.update(OFFLINE_ENV)
    limit_s = 420 if args.quick else 900
    install_error = None if args.skip_litellm_proxy else ensure_baselines(args.baselines_venv)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"benchmark ran past its own limit of {limit_s} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit_s)

    ctx = mp.get_context("spawn")
    children: list[Any] = []
    litellm: LiteLLMProxy | None = None
    started = time.perf_counter()
    try:
        print(
            f"forgetui proxy overhead benchmark ({'quick' if args.quick else 'full'}); work dir {workdir}; FORGETUI_HOME={os.environ['FORGETUI_HOME']}"
        )
        recv, send = ctx.Pipe(duplex=False)
        fake = ctx.Process(target=serve_fake, args=(send,), name="fake-backend", daemon=True)
        fake.start()
        children.append(fake)
        fake_url = f"http://127.0.0.1:{recv.recv()}"

        proxies: dict[str, tuple[Any, Any, dict[str, Any], str]] = {}
        for backend, path in zip(FORGETUI_BACKENDS, FORGETUI_PATHS, strict=True):
            parent, child = ctx.Pipe()
            store_path = str(workdir / f"forgetui-{backend}.duckdb")
            proc = ctx.Process(
                target=serve_forgetui,
                args=(child, backend, fake_url, store_path, args.proxy_loop),
                name=f"forgetui-{backend}",
                daemon=True,
            )
            proc.start()
            children.append(proc)
            proxies[path] = (proc, parent, {}, store_path)
        if not args.skip_litellm_proxy:
            litellm = start_litellm_proxy(fake_url, workdir, venv_python(args.baselines_venv))
            if install_error and litellm.error:
                litellm.error = install_error
        for _name, (proc, parent, info, _) in proxies.items():
            if not parent.poll(120):
                raise RuntimeError(f"{proc.name} did not start within 120 s")
            info.update(parent.recv())

        # the token path first, while the servers idle (LiteLLM's proxy may still be importing)
        tp = token_path_cost(token_iters)
        if litellm is not None:
            wait_litellm_ready(litellm)
        litellm_error = "skipped with --skip-litellm-proxy" if litellm is None else litellm.error

        targets = [
            Target(
                "direct", f"{fake_url}/v1/chat/completions", {"content-type": "application/json"}, fake.pid
            )
        ]
        for name, (proc, _, info, _) in proxies.items():
            targets.append(
                Target(
                    name,
                    f"{info['url']}/r/{info['token']}/v1/chat/completions",
                    {"content-type": "application/json"},
                    proc.pid,
                )
            )
        if litellm is not None and litellm.error is None:
            targets.append(
                Target(
                    "litellm-proxy",
                    f"{litellm.url}/v1/chat/completions",
                    {"content-type": "application/json", "authorization": f"Bearer {litellm.key}"},
                    litellm.proc.pid,
                )
            )

        print(
            "\nProcess layout (loopback only; CPUs available to this run: "
            f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()})"
        )
        print(
            f"  load generator    pid {os.getpid():>7}  this process: asyncio{'+uvloop' if _has_uvloop() else ''}, one {args.client} client per phase (connections = c + 8), c worker tasks"
        )
        print(
            f"  fake backend      pid {fake.pid:>7}  own process: raw ASGI app on uvicorn (uvloop, httptools), 1 worker"
        )
        proxy_loop = "stdlib asyncio" if args.proxy_loop == "asyncio" or not _has_uvloop() else "uvloop"
        for name, (proc, _, _, store_path) in proxies.items():
            print(
                f"  {name:<17} pid {proc.pid:>7}  own process: ProxyApp on core.proxy.server.BackgroundServer (uvicorn/httptools, {proxy_loop} loop) + Store writer thread → {Path(store_path).name}"
            )
        if litellm is not None and litellm.proc is not None:
            print(
                f"  litellm-proxy     pid {litellm.proc.pid:>7}  own process: `litellm --config ... --num_workers 1` (uvicorn), access log off"
            )
        print(
            "  All servers stay up for the whole run; only one path is loaded at a time. srvCPU = CPU of the server under"
        )
        print("  test (for the proxies: the proxy process only, not the fake backend) per measured request.")
        print(
            f"  Load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on this machine skews every number)"
        )
        if litellm_error:
            print(f"  LiteLLM proxy NOT measured: {litellm_error}")

        results: list[Result] = []

        async def load() -> None:
            for mode in ("json", "stream"):
                for conc, n in counts.items():
                    for target in targets:
                        warmup = max(20, 2 * conc) if not args.quick else max(10, conc)
                        results.append(await run_phase(target, mode, conc, n, warmup, args.client, phase_s))
                        print(
                            f"  .. {mode:<6} c={conc:<3} {target.name:<17} {results[-1].rps:7.0f} req/s  p50 {results[-1].pct(50):6.2f} ms  errors {results[-1].errors}",
                            flush=True,
                        )

        print("\nLoad (json = non-streaming, stream = SSE; latency = request start to last byte)")
        _run_async(load())

        stores: dict[str, dict[str, Any]] = {}
        for name, (proc, parent, _, store_path) in proxies.items():
            parent.send("stop")
            stores[name] = parent.recv() if parent.poll(60) else {"rows": {}, "dead_letter": "no answer"}
            proc.join(30)
            stores[name]["reopened"] = _count_rows(store_path)
        sent = {t.name: t.sent for t in targets}

        print(
            "\nResults  (+p50/+p99 = that percentile minus the direct path's at the same mode and concurrency; ÷ litellm-proxy = req/s ratio;"
            f"\n n = measured requests: {counts} per concurrency, fewer where a phase hit its {phase_s:g} s cap)\n"
        )
        print_results(results)
        print_threads(results)

        print(
            f"\nToken path cost per call (not in the passthrough numbers above): {tp['prompt_tokens']}-token prompt, {tp['messages']} messages, 4 tools, tiny model's tokenizer ({tp['tokenizer']})"
        )
        print(f"  {'step':<48} {'mean ms':>9} {'p50 ms':>9}")
        for label, mean, p50 in tp["rows"]:
            print(f"  {label:<48} {mean:>9.3f} {p50:>9.3f}")

        ok = check_floors(results, stores, sent, litellm_error)
        print(
            f"\nOverall: {'PASS' if ok else 'FAIL'}  (wall time {time.perf_counter() - started:.0f} s; load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())})"
        )
        return 0 if ok else 1
    finally:
        signal.alarm(0)
        if litellm is not None:
            stop_litellm_proxy(litellm)
        for proc in children:
            if proc.is_alive():
                proc.terminate()
                proc.join(15)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


FLOOR_SPLICED_50K_MS = 3.0


def token_path_report(iterations: int) -> int:
    """The token path's cost per call at 4k, 16k and 50k tokens; floor: a spliced plan at 50k within 3 ms (p50)."""
    os.environ.update(OFFLINE_ENV)
    os.environ.setdefault("TQDM_DISABLE", "1")
    spliced_50k = None
    for target in (4000, 16000, 50000):
        tp = token_path_cost(iterations, target)
        print(f"\nToken path cost per call: {tp['prompt_tokens']}-token prompt, {tp['messages']} messages, tiny model's tokenizer")
        print(f"  {'step':<48} {'mean ms':>9} {'p50 ms':>9}")
        for label, mean, p50 in tp["rows"]:
            print(f"  {label:<48} {mean:>9.3f} {p50:>9.3f}")
        spliced_50k = tp["rows"][1][2]
    ok = spliced_50k is not None and spliced_50k <= FLOOR_SPLICED_50K_MS
    print(f"\n{'PASS' if ok else 'FAIL'}: spliced plan at 50k tokens p50 {spliced_50k:.3f} ms (floor <= {FLOOR_SPLICED_50K_MS:g} ms)")
    return 0 if ok else 1


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def _run_async(coro: Any) -> Any:
    if _has_uvloop():
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def _count_rows(store_path: str) -> int | str:
    """Rows in `calls`, counted by opening the closed store file again (read-only)."""
    import duckdb

    try:
        con = duckdb.connect(store_path, read_only=True)
        try:
            return con.execute("SELECT count(*) FROM calls").fetchone()[0]
        finally:
            con.close()
    except duckdb.Error as exc:
        return f"error: {exc}"


if __name__ == "__main__":
    sys.exit(main())
