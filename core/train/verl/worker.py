"""One forgetui run session per veRL agent-loop worker process: proxy, store shard and runtime shared by its rollouts.

veRL instantiates the agent loop once per rollout; the session is opened lazily by the first `run()`
of a worker (on the worker's event loop) and lives until the process exits. Its proxy samples through
veRL's inference client (`ClientTokenBackend`) and records into the worker's own store shard,
`runs/<run_id>/shards/<shard>/store.duckdb`, which `forgetui sql --run RUN_ID` and the TUI read together;
while the worker runs, its session's live query endpoint (`store.duckdb.live.json` beside the shard)
answers for the shard, which DuckDB keeps locked to every other process.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import RunConfig, load_config
from core.env import Task
from core.errors import ConfigError
from core.proxy.factory import token_policy
from core.registry import load_env
from core.rollout.attempt import RolloutItem, RolloutResult
from core.session import RunSession
from core.session.setup import new_run_id
from core.status import RunStatus
from core.store.query import SHARDS_DIR
from core.train.samples import samples_for_run
from core.train.types import Sample
from core.train.verl.client_backend import ClientTokenBackend

log = logging.getLogger(__name__)

CONFIG_ENV = "FORGETUI_VERL_CONFIG"  # the forgetui run config (TOML) when the agent-loop YAML names none
RUN_ID_ENV = "FORGETUI_VERL_RUN_ID"  # the run every worker records into
SHARD_ENV = "FORGETUI_VERL_SHARD"  # this worker's shard name (default worker-<host>-<pid>)


def shard_name() -> str:
    """This worker's shard: FORGETUI_VERL_SHARD, or worker-<host>-<pid> (unique across a cluster's workers)."""
    return os.environ.get(SHARD_ENV) or f"worker-{socket.gethostname()}-{os.getpid()}"


def shard_store_path(run_dir: Path, shard: str) -> Path:
    """runs/<run_id>/shards/<shard>/store.duckdb."""
    return run_dir / SHARDS_DIR / shard / "store.duckdb"


@dataclass
class RolloutOutcome:
    """One finished rollout: its result, its samples (one per branch) and its wall time."""

    rollout_id: str
    task: Task
    result: RolloutResult
    samples: list[Sample]
    seconds: float


@dataclass
class WorkerRun:
    """A worker's open run session and what its rollouts share."""

    config: RunConfig
    session: RunSession
    backend: ClientTokenBackend
    shard: str
    limit: asyncio.Semaphore
    sampling: dict[str, dict[str, Any]] = field(default_factory=dict)  # rollout id → veRL's sampling params
    extra_envs: dict[str, Any] = field(default_factory=dict)
    counter: itertools.count = field(default_factory=itertools.count)

    @property
    def run_id(self) -> str:
        return self.session.run_id

    def sampling_for(self, token: str) -> dict[str, Any] | None:
        """veRL's sampling params of the rollout a proxy session token belongs to."""
        ctx = self.session.ctx
        found = ctx.sessions.get(token) if ctx is not None else None
        return self.sampling.get(found.rollout_id) if found is not None else None

    def find_task(self, task_id: str, env_name: str | None = None, options: dict[str, Any] | None = None) -> Task:
        """The dataset row's task: in the run's env, or in the same env loaded with the row's options (a val split)."""
        env = self.session.env
        assert env is not None
        if env_name and env_name != env.name:
            raise ConfigError(f"dataset row is for env {env_name!r} but the forgetui config runs env {env.name!r}")
        for task in env.tasks():
            if task.id == task_id:
                return task
        if options and options != self.config.env.options:
            key = repr(sorted(options.items()))
            if key not in self.extra_envs:
                self.extra_envs[key] = load_env(env.name, **({"path": self.config.env.path} if self.config.env.path else {}), **options)
            for task in self.extra_envs[key].tasks():
                if task.id == task_id:
                    return task
        raise ConfigError(f"env {env.name!r} has no task {task_id!r} (options {options or self.config.env.options})")

    async def run_task(self, task: Task, *, step: int, sample_index: int, sampling_params: dict[str, Any]) -> RolloutOutcome:
        """One sandbox rollout of `task` through the proxy, verified; its samples from this worker's shard."""
        rollout_id = f"{self.run_id}/{task.id}/s{step}/{self.shard}/{next(self.counter)}"
        item = RolloutItem(rollout_id=rollout_id, task=task, sample_index=sample_index, step=step)
        self.sampling[rollout_id] = dict(sampling_params)
        started = time.perf_counter()
        try:
            async with self.limit:
                results = await self.session.run_rollouts([item])
        finally:
            self.sampling.pop(rollout_id, None)
        store = self.session.store
        samples = await asyncio.to_thread(samples_for_run, store, self.run_id, rollout_ids=[rollout_id])
        return RolloutOutcome(rollout_id, task, results[rollout_id], samples, time.perf_counter() - started)


_worker: WorkerRun | None = None
_opening: asyncio.Lock | None = None


async def worker_run(
    client: Any, tokenizer: Any, *, config_path: str | None, run_id: str | None, context_length: int
) -> WorkerRun:
    """This process's worker run, opened on first use (on the calling loop, which must stay the same)."""
    global _worker, _opening
    if _worker is not None:
        return _worker
    if _opening is None:
        _opening = asyncio.Lock()
    async with _opening:
        if _worker is None:
            _worker = await open_worker_run(client, tokenizer, config_path=config_path, run_id=run_id, context_length=context_length)
            atexit.register(_close_at_exit)
    return _worker


async def open_worker_run(
    client: Any, tokenizer: Any, *, config_path: str | None, run_id: str | None, context_length: int
) -> WorkerRun:
    """A run session whose proxy samples through `client` and records into this worker's shard."""
    path = config_path or os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"the forgetui agent loop needs a run config: set forgetui_config in the agent-loop YAML or {CONFIG_ENV}")
    config = load_config(path)
    holder: dict[str, WorkerRun] = {}
    backend = ClientTokenBackend(
        client, tokenizer, context_length=context_length, loop=asyncio.get_running_loop(),
        sampling_for=lambda token: holder["w"].sampling_for(token) if "w" in holder else None,
    )
    policy = token_policy(backend, config.policy.spec, parser=config.policy.parser, default_max_tokens=config.policy.max_tokens)
    shard = shard_name()
    session = RunSession(config, run_id=run_id or os.environ.get(RUN_ID_ENV) or new_run_id(), policy=policy, worker=shard)
    session.store_path = shard_store_path(session.run_dir, shard)
    session.store_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        await session.open()
    except BaseException:
        await session.close()
        raise
    worker = WorkerRun(config=config, session=session, backend=backend, shard=shard, limit=asyncio.Semaphore(config.run.concurrency))
    holder["w"] = worker
    log.info("forgetui worker %s of run %s records into %s", shard, session.run_id, session.store_path)
    return worker


async def close_worker_run() -> None:
    """Stop this process's session (proxy, sandboxes, store); the next `worker_run` opens a new one."""
    global _worker, _opening
    worker, _worker, _opening = _worker, None, None
    if worker is not None:
        worker.session.finish(RunStatus.DONE)
        await worker.session.close()


def _close_at_exit() -> None:
    """Best effort at interpreter exit: remove the worker's sandboxes and close its store."""
    if _worker is None:
        return
    try:
        asyncio.run(close_worker_run())
    except Exception:  # noqa: BLE001 - exiting anyway
        log.warning("could not close the forgetui worker session cleanly; `forgetui gc` removes its sandboxes", exc_info=True)
