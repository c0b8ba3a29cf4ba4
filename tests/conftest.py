"""Shared fixtures: an isolated FORGETUI_HOME (models cached across runs) and a live recording proxy."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_plugins = ["tests.docker_fixtures"]  # docker_client, base_image, docker_runtime, run_id

REPO = Path(__file__).resolve().parents[1]
# the first requests real harness binaries sent (see its README): part of the repository, nothing outside it
HARNESS_REQUESTS = Path(__file__).resolve().parent / "fixtures" / "harness-requests"
if not sorted(HARNESS_REQUESTS.glob("*.jsonl")):
    raise RuntimeError(f"no harness request fixtures in {HARNESS_REQUESTS}: the checkout is incomplete")
# one home for the whole test session: the tiny model and converted SmolLM2 are built once and reused
os.environ.setdefault("FORGETUI_HOME", str(REPO / ".test-home"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def harness_requests() -> list[tuple[str, dict]]:
    """(harness, request) for every first request real harness binaries sent."""
    out = []
    for path in sorted(HARNESS_REQUESTS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.append((path.stem, json.loads(line)))
    return out


@dataclass
class LiveProxy:
    url: str
    token: str
    store: object
    sessions: object
    app: object

    @property
    def base(self) -> str:
        """The rollout's base URL, as a harness is given it."""
        return f"{self.url}/r/{self.token}"

    def rows(self, sql: str) -> list[tuple]:
        self.store.flush()
        return [tuple(r) for r in self.store.handle_query(sql)["rows"]]


@pytest.fixture
def script_file(tmp_path: Path):
    """Write a scripted-backend script and return its path."""

    def write(turns: list[dict]) -> Path:
        path = tmp_path / "script.json"
        path.write_text(json.dumps({"turns": turns}))
        return path

    return write


@pytest.fixture
def live_proxy(tmp_path: Path):
    """Start a proxy for a backend spec with one registered rollout; stop it (and close its store) after."""
    from core.backends.spec import PolicySpec
    from core.proxy.app import ProxyApp
    from core.proxy.factory import make_policy
    from core.proxy.server import BackgroundServer
    from core.proxy.sessions import SessionRegistry
    from core.store.writer import Store

    started: list[tuple[BackgroundServer, Store]] = []

    def start(spec: str, *, adhoc: bool = False, policy=None, **app_kwargs) -> LiveProxy:
        store = Store.open(tmp_path / f"store{len(started)}.duckdb")
        store.insert_run("run-test", {"spec": spec})
        sessions = SessionRegistry(run_id="run-test", adhoc=adhoc)
        session = sessions.register("rollout-1")
        store.upsert_rollout({"rollout_id": "rollout-1", "run_id": "run-test", "status": "running", "token": session.token})
        app = ProxyApp(policy or make_policy(PolicySpec.parse(spec)), sessions, store, **app_kwargs)
        server = BackgroundServer(app)
        server.start()
        started.append((server, store))
        return LiveProxy(url=server.url, token=session.token, store=store, sessions=sessions, app=app)

    yield start
    import asyncio
    import contextlib

    for server, store in started:
        if server.loop is not None and server.loop.is_running():  # its HTTP sessions live on the proxy's loop: close them there
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(server.app.policy.aclose(), server.loop).result(30)
        server.stop()
        store.close()


@pytest.fixture
def fake():
    """A loopback OpenAI-compatible server (`tests.test_passthrough.FakeOpenAI`); `.url` is its root, `.requests` what it got."""
    from core.proxy.server import BackgroundServer
    from tests.test_passthrough import FakeOpenAI

    app = FakeOpenAI()
    with BackgroundServer(app) as server:
        app.url = server.url
        yield app


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    from core.models.resolve import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model("tiny")))


def pytest_sessionstart(session: pytest.Session) -> None:
    Path(os.environ["FORGETUI_HOME"]).mkdir(parents=True, exist_ok=True)

